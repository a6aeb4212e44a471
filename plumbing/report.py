"""What a training run reports beside train.py's own lines (the notes on its schedule, its figures to
Weights & Biases when asked), durations as the logs write them, and sample.py's line on its model."""

import importlib.util
import netrc
import os
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]


def format_seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def schedule_notes(cfg, final_lr):
    """The warnings on a schedule the run does not follow (its last step at final_lr): --max_iters cuts its
    warmup or its decay short, or its decay ends before its warmup does (train.get_lr)."""
    notes, run = [], f"max_iters={cfg.max_iters}"
    if cfg.max_iters == 0:  # no step: no learning rate
        return notes
    if cfg.warmup_iters > cfg.max_iters:
        end = f"the run ends at lr {final_lr:.3g}, never reaching learning_rate={cfg.learning_rate:g}"
        notes.append(
            f"note: warmup_iters={cfg.warmup_iters} > {run}: {end}; "
            f"--warmup_iters={cfg.max_iters // 10} (a tenth of the run) warms up within it"
        )
    elif 0 < cfg.warmup_iters < cfg.max_iters and cfg.lr_decay_iters <= cfg.warmup_iters:
        jump = f"the rate jumps from its warmup to min_lr={cfg.min_lr:g} at step {cfg.warmup_iters}, no decay"
        notes.append(
            f"note: lr_decay_iters={cfg.lr_decay_iters} <= warmup_iters={cfg.warmup_iters}: {jump}; "
            f"--lr_decay_iters={cfg.max_iters} decays over the rest of the run"
        )
    if cfg.lr_decay_iters > cfg.max_iters:
        end = f"the run ends at lr {final_lr:.3g}, before its decay to min_lr={cfg.min_lr:g}"
        notes.append(
            f"note: lr_decay_iters={cfg.lr_decay_iters} > {run}: {end}; "
            f"--lr_decay_iters={cfg.max_iters} decays within the run"
        )
    return notes


def describe_model(model):
    """sample.py's line on the model it generates with: its scheme (RoPE: its rotated share, layers and
    scaling), trained length and size."""
    c, params, rope = model.config, f"{model.num_params():,} parameters", model.transformer.wpe
    pos, scaled = c.pos, []
    if hasattr(c.pos_settings, "rope_scaling"):  # RoPE's settings apply
        s = c.pos_settings
        scaling = "none" if s.rope_scaling is None else f"{s.rope_scaling} x{s.rope_factor:g}"
        if s.rope_scaling == "llama3":
            scaling += f" (frequency factors {s.rope_low_freq_factor:g} and {s.rope_high_freq_factor:g})"
        if rope.dim < c.head_dim:
            pos += f" on {rope.dim} of each head's {c.head_dim} dims"
        if nope := [str(i) for i, rotates in enumerate(model.rope_layers) if not rotates]:
            pos += f" (none in layer{'s' * (len(nope) > 1)} {', '.join(nope)})"
        scaled = [f"rope scaling {scaling}"]
    return ", ".join([f"pos={pos}", f"trained length {c.block_size} tokens", *scaled, params])


def wandb_problem():
    """Why --wandb cannot log (not installed, or not logged in: wandb.init would fail or prompt mid-run), or
    None. Logged in: an API key in WANDB_API_KEY or ~/.netrc (`wandb login` writes it); offline needs none."""
    if importlib.util.find_spec("wandb") is None:
        return "--wandb needs the wandb package: pip install wandb"
    if os.environ.get("WANDB_MODE") in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    with suppress(OSError, netrc.NetrcParseError):
        if netrc.netrc().authenticators(host):
            return None
    return "--wandb: not logged in to Weights & Biases: run `wandb login` once, or set WANDB_MODE=offline"


@contextmanager
def wandb_logging(cfg, model_config, meta, model, p, procs):
    """A Weights & Biases run on rank 0 while the block runs (else None), finished with exit code 0, or 1 if
    the block raised; a resumed run (progress p) continues its id."""
    if not (cfg.wandb and procs.master):
        yield None
        return
    import wandb  # only when asked for: optional, and slow to import

    config = asdict(cfg) | asdict(model_config)
    config |= {"world_size": procs.world_size, "parameters": model.num_params()}
    resumed = dict(id=p.wandb_run_id, resume="allow") if p.wandb_run_id else {}
    name = cfg.wandb_run_name or Path(cfg.out_dir).name
    wandb_run = wandb.init(project=cfg.wandb_project, name=name, config=config, **resumed)
    p.wandb_run_id = wandb_run.id
    try:
        yield wandb_run
    except BaseException:
        wandb_run.finish(exit_code=1)
        raise
    wandb_run.finish(exit_code=0)
