"""
Train a GPT on one dataset with one position scheme. Every experiment in this repository runs this script.

    python train.py                                        # ~2 minutes on 2 CPU cores: shakespeare_char, rope
    python train.py --pos=learned --max_iters=500
    python train.py --config configs/cpu_recipe.toml --pos=alibi
    python train.py --config configs/shakespeare_char.toml # nanoGPT's GPU recipe, one GPU
    torchrun --standalone --nproc_per_node=8 train.py --config configs/gpt2_124m.toml --pos=rope
    python train.py --resume                               # the same command plus --resume continues the run
    python train.py --overwrite                            # starts again in a folder that holds a run

Settings, lowest priority first: TrainConfig's defaults and MODEL_DEFAULTS, the TOML file given with --config,
then flags: every field of TrainConfig and GPTConfig but vocab_size (`python train.py --help` lists them).
Read top to bottom: the config, the run (data, model, optimizer), one step, evaluation, the loop (train) and
main. The machinery is in plumbing/ (checkpoints, resume, the run folder, flags, DDP) and data/common.py.
"""

from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import math
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from types import MappingProxyType

import torch

from data.common import BatchSampler, prepare_data
from model import GPT, GPTConfig
from plumbing import cli, hardware, report, resume
from plumbing.checkpoint import remove_unfinished_writes
from plumbing.distributed import Processes, check_torchrun_device, micro_steps_per_rank, processes, wrap_ddp
from plumbing.errors import StopSignals, UserError, exit_status, one_line_errors
from plumbing.fields import check_fields, require, setting
from plumbing.memory import check_training_memory
from plumbing.resume import PLAIN, Run
from plumbing.run_folder import check_out_dir, format_out_dir, own_folder

# The model built unless told otherwise: nanoGPT's CPU recipe for shakespeare_char (its README: "I only have a
# macbook"), minutes on a laptop; GPTConfig's defaults are GPT-2 small. bias=False: nanoGPT's, a bit faster.
MODEL_DEFAULTS = MappingProxyType(
    dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False)
)

# Micro-batch j of every step comes from the sampler's stream j, whichever rank runs it: a step trains on
# the same tokens for any number of processes. Evaluation draws from a stream of its own: it changes nothing.
EVAL_STREAM = 2**31 - 1


@dataclass
class TrainConfig:
    # data
    dataset: str = "shakespeare_char"  # a folder under data/; the embedded ones are prepared on first use
    batch_size: int = setting(12, at_least=1)  # sequences per micro-batch, each block_size tokens long
    grad_accum: int | None = setting(None, at_least=1)  # micro-batches a step, all processes; None: one each
    # AdamW; model.configure_optimizers decays 2-D weights only
    learning_rate: float = setting(1e-3, above=0)  # peak learning rate, reached at the end of warmup
    weight_decay: float = setting(0.1, at_least=0)  # decoupled weight decay (Loshchilov & Hutter 2019), 2-D
    beta1: float = setting(0.9, at_least=0, below=1)  # AdamW beta1: decay of the gradient's running mean
    beta2: float = setting(0.99, at_least=0, below=1)  # AdamW beta2; > GPT-2's 0.95: small steps are noisy
    grad_clip: float = setting(1.0, at_least=0)  # rescale the gradient past this global norm; 0 disables
    # learning rate schedule: linear warmup, cosine decay to min_lr at lr_decay_iters, then flat (see get_lr)
    max_iters: int = setting(2000, at_least=0)  # optimizer steps in the run (defaults: nanoGPT's CPU recipe)
    warmup_iters: int = setting(100, at_least=0)  # steps of linear warmup from ~0 to learning_rate
    lr_decay_iters: int | None = setting(None, at_least=0)  # where the cosine reaches min_lr; None: max_iters
    min_lr: float = setting(1e-4, at_least=0)  # floor of the schedule, ~learning_rate / 10 (Chinchilla)
    # evaluation and logging
    eval_interval: int = setting(250, at_least=1)  # steps between loss estimates, each with a checkpoint
    eval_iters: int = setting(50, at_least=1)  # batches per split in an estimate (cpu_recipe.toml: 200)
    log_interval: int = setting(50, at_least=1)  # steps between log lines
    wandb: bool = False  # log to Weights & Biases (pip install wandb; WANDB_MODE=offline logs to files only)
    wandb_project: str = "posgpt"  # the W&B project the run goes to
    wandb_run_name: str | None = None  # the W&B run's display name; None: out_dir's folder name
    # system
    out_dir: str = "out/{dataset}_{pos}"  # checkpoint folder; {dataset} and {pos} are filled in
    resume: bool = False  # continue from out_dir/ckpt.pt: weights, optimizer, step, RNG and data streams
    overwrite: bool = False  # start again in an out_dir that holds a run, replacing it (without: refused)
    init_from: str | None = None  # a new run from this out_dir's (or checkpoint's) weights and model flags
    device: str = "auto"  # auto: cuda, then mps, then cpu; under torchrun each process takes cuda:LOCAL_RANK
    dtype: str = setting("auto", choices=hardware.DTYPES)  # autocast; auto: bfloat16 on CUDA, else float32
    compile: bool | None = None  # torch.compile; None: on CUDA only (on a CPU it costs more than it saves)
    threads: str = cli.threads_flag()
    seed: int = setting(1337, at_least=0)  # seeds the initialisation, the dropout masks and the batch streams
    rope_factors: str | None = None  # longrope's per-pair factors: JSON, a Phi-3 config's rope_scaling keys

    def __post_init__(self):
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        check_fields(self)
        v = vars(self)
        for n in ("out_dir", "init_from"):  # an unset shell variable (--out_dir=$OUT) must not mean "here"
            empty = f"--{n} is empty (an unset shell variable?): give a folder, e.g. --{n}=out/NAME"
            require(v[n] is None or v[n].strip(), empty)
        too_high = f"min_lr={self.min_lr} must not exceed learning_rate={self.learning_rate}"
        require(self.min_lr <= self.learning_rate, too_high)
        require(self.wandb_project.strip(), "wandb_project must not be empty")
        both = "--resume continues the run in out_dir and --overwrite replaces it: give one of them"
        require(not (self.resume and self.overwrite), both)
        hardware.check_device_name(self.device)
        hardware.check_threads(self.threads)


def parse_args(argv=None, extension=PLAIN):
    """Flags (and --config) -> (TrainConfig, GPTConfig), vocab_size left to the dataset; the extension's own
    flags (a training method's, plumbing.resume.Extension) go to its configure. With --init_from the model
    settings not given are that checkpoint's, out_dir beside it. A bad flag or value: one line."""
    sections, given = [("training", TrainConfig, None), *cli.model_sections()], set()
    model_flags = cli.section_names(sections[1:])
    own = [f.name for f in fields(extension.Flags)] if extension.Flags else []
    sections += [(extension.prog, extension.Flags, None)] if own else []
    prog, doc = extension.prog, extension.__doc__ if own else __doc__
    values = cli.parse_flags(argv, prog, doc, sections, MODEL_DEFAULTS, given=given)
    longrope, saved = {}, {}
    if values["rope_factors"]:
        factor = values["rope_factor"] if "rope_factor" in given else None
        longrope = cli.read_rope_factors(values["rope_factors"], values["rope_scaling"], factor)
        cli.check_longrope_given_once(longrope, given, values["rope_factors"])
    if source := values["init_from"]:  # parse again: the checkpoint's model config under --config and flags
        saved = resume.saved_model_config(source, model_flags)
        values = cli.parse_flags(argv, prog, doc, sections, MODEL_DEFAULTS | saved | {"out_dir": None})
    trained = f"--init_from={source}'s original length" if source else "--rope_original_len"
    cli.check_original_len(longrope, values["rope_original_len"] or saved.get("block_size"), trained)
    values |= longrope
    if source:
        values |= resume.init_from_settings(values, saved)
    cfg = TrainConfig(**{k: v for k, v in values.items() if k not in model_flags + own})
    # a setting given of another scheme than pos is refused, at its default too
    model_config = GPTConfig.from_flat(given=given | set(longrope), **{k: values[k] for k in model_flags})
    cli.check_scaling_given(values, given)
    if own:
        extension.configure(extension.Flags(**{k: v for k, v in values.items() if k in own}), model_config)
    check_out_dir(format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos))
    hardware.check_device(cfg.device)
    check_torchrun_device(cfg.device)
    return cfg, model_config


def resolve_runtime(cfg, model_config, device=None, world_size=1):
    """cfg with every `auto` and None replaced by what this run uses, so the checkpoint records it; device:
    torchrun's cuda:LOCAL_RANK, if given. grad_accum=None: one micro-batch per process."""
    device = device or hardware.resolve_device(cfg.device)
    device_type = device.split(":")[0]
    grad_accum = world_size if cfg.grad_accum is None else cfg.grad_accum
    compile = (device_type == "cuda") if cfg.compile is None else cfg.compile
    out_dir = format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos)
    dtype = hardware.resolve_dtype(cfg.dtype, device_type)
    return replace(cfg, grad_accum=grad_accum, device=device, dtype=dtype, compile=compile, out_dir=out_dir)


def get_lr(it, cfg):
    """Learning rate for step `it` (0-based): linear warmup over warmup_iters steps to learning_rate, then a
    half cosine down to min_lr at lr_decay_iters, then min_lr; independent of max_iters."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)  # +1: the first step is not lr 0
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


# -----------------------------------------------------------------------------
# The run: data, model, optimizer, batch streams


def build_run(cfg, model_config, meta, data_dir, procs, extension=PLAIN):
    """A fresh Run: the model (--init_from's weights, then what the extension changes: lab/finetune's S²-Attn
    and LoRA), compiled and DDP-wrapped, the optimizer, this rank's batch streams."""
    micro_steps = micro_steps_per_rank(cfg.grad_accum, procs)
    check_training_memory(model_config, cfg.batch_size, micro_steps, cfg.device)  # before any allocation
    device_type = cfg.device.split(":")[0]
    autocast, scaler = hardware.precision(cfg)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = GPT(model_config).to(cfg.device)
    if cfg.init_from and not cfg.resume:  # context extension: the weights of a trained run, a fresh optimizer
        note = resume.init_model_from(cfg.init_from, model, meta, cfg.dataset)
        procs.log(f"initialised from {cfg.init_from}" + (f": {note}" if note else ""))
    if note := extension.adapt(model):  # before the optimizer and the DDP wrapper take the trained parameters
        procs.log(note)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, device_type)
    compiled = torch.compile(model) if cfg.compile else model
    wrapped = wrap_ddp(compiled, procs, device_type)  # DDP around the compiled module, as nanoGPT
    slots = range(procs.rank * micro_steps, (procs.rank + 1) * micro_steps)  # this rank's share of the step
    shape = (model_config.block_size, cfg.batch_size)
    sampler = lambda stream: BatchSampler(data_dir, *shape, cfg.device, cfg.seed, rank=stream)
    *samplers, eval_sampler = [sampler(stream) for stream in [*slots, EVAL_STREAM]]
    if procs.rank:
        torch.manual_seed(cfg.seed + procs.rank)  # dropout masks differ across ranks
    parts = (model, wrapped, compiled, optimizer, scaler, autocast, samplers, eval_sampler)
    return Run(cfg, model_config, meta, procs, *parts, extension)


def start_run(cfg, model_config, procs, extension=PLAIN):
    """The Run: built fresh, or continued from out_dir/ckpt.pt with --resume."""
    data_dir, meta = prepare_data(cfg.dataset, procs)
    model_config = replace(model_config, vocab_size=meta["vocab_size"])
    # --resume: a damaged checkpoint, or one of another model, is one line before the model is built
    opened = cfg.resume and resume.open_for_resume(
        cfg.out_dir, cfg, model_config, meta, procs.world_size, extension
    )
    run = build_run(cfg, model_config, meta, data_dir, procs, extension)
    if opened:  # checked against the settings before the weights are read into the run
        resume.resume_run(run, *opened)
    if procs.master and (removed := remove_unfinished_writes(cfg.out_dir)):
        procs.log(f"removed {removed} unfinished checkpoint write(s) from {cfg.out_dir}")
    return run


# -----------------------------------------------------------------------------
# One training step, evaluation, checkpoints


def train_step(run, lr):
    """One AdamW step over this rank's micro-batches at learning rate lr; returns their mean loss (a tensor).
    Under DDP the gradients are all-reduced once, in the last micro-step's backward (no_sync before it)."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for i, sampler in enumerate(run.samplers):
        x, y = sampler.get_batch("train")  # drawn here: its copy to the GPU overlaps the previous backward
        last = i == len(run.samplers) - 1
        with nullcontext() if last or not run.procs.launched else run.train_model.no_sync():
            with run.autocast:
                _, loss = run.train_model(x, y)
            loss = loss / len(run.samplers)  # the step's loss is the mean over its micro-batches
            run.scaler.scale(loss).backward()  # the scaler is a no-op unless dtype is float16
        total = total + loss.detach()
    if run.cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)  # clip the true gradient, not the scaled one
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def estimate_loss(model, sampler, eval_iters, autocast, stopping=lambda: False):
    """Mean loss over eval_iters batches of each split, in eval mode (dropout off). -> {"train", "val"}, or
    None once stopping() is true before a batch (a stop request: an evaluation can take minutes)."""
    model.eval()
    losses = {}
    for split in ("train", "val"):
        total = 0.0
        for _ in range(eval_iters):
            if stopping():
                model.train()
                return None
            x, y = sampler.get_batch(split)
            with autocast:
                total += model(x, y)[1].item()
        losses[split] = total / eval_iters
    model.train()
    return losses


def evaluate(run, wandb_run, signals):
    """Estimate the losses (rank 0; the others get them), stop if not finite, else write checkpoints. -> the
    losses, or None if a stop request cut the estimate short."""
    p, cfg = run.progress, run.cfg
    run.procs.log(f"step {p.iter_num}: evaluating on {cfg.eval_iters} batches of train and of val ...")
    estimate, cut = {"train": math.nan, "val": math.nan}, False
    if run.procs.master:
        requested = lambda: signals.received is not None
        before = run.eval_sampler.state_dict()
        measured = estimate_loss(run.eval_model, run.eval_sampler, cfg.eval_iters, run.autocast, requested)
        estimate, cut = measured or estimate, measured is None
        if cut:  # the checkpoint keeps the stream as it stood, so --resume draws this evaluation's batches
            run.eval_sampler.load_state_dict(before)
    train_loss, val_loss, cut = run.procs.share([estimate["train"], estimate["val"], float(cut)], cfg.device)
    if cut:  # the loop stops, saying so
        return None
    if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
        what = f"the estimated loss is not finite at step {p.iter_num} (train {train_loss}, val {val_loss})"
        raise UserError(f"{what}: training stopped; {resume.kept_checkpoint(run)}")
    improved, p.evaluated_iter = val_loss < p.best_val_loss, p.iter_num
    if improved:
        p.best_val_loss, p.best_iter = val_loss, p.iter_num
    with signals.deferred():  # a second Ctrl-C now stops the script once the file is whole
        resume.write_checkpoints(run, improved)
    best = f"(best {p.best_val_loss:.4f} at step {p.best_iter})"
    saved = f"saved {run.ckpt_path} {f'and {run.best_path.name} (best)' if improved else best}"
    run.procs.log(f"step {p.iter_num}: train loss {train_loss:.4f}, val loss {val_loss:.4f} | {saved}")
    if wandb_run:
        wandb_run.log({"eval/train_loss": train_loss, "eval/val_loss": val_loss}, step=p.iter_num)
        paths = {"checkpoint": str(run.ckpt_path), "best_checkpoint": str(run.best_path)}
        wandb_run.summary.update(paths | {"best_val_loss": p.best_val_loss})
    return {"iter": p.iter_num, "train": train_loss, "val": val_loss}


def train(cfg, model_config, procs=None, resume_command="the same command with --resume", extension=PLAIN):
    """Train from scratch, or on from out_dir/ckpt.pt with cfg.resume, holding out_dir's lock: evaluate and
    checkpoint every eval_interval steps and at the end, step, log, until max_iters or a signal (the step
    ends, a checkpoint is written). -> the summary below; losses: {step: loss} of the steps run here."""
    start, procs = time.perf_counter(), procs or Processes()
    if cfg.wandb and (problem := report.wandb_problem()):  # before any work: data can take hours
        raise UserError(problem)
    one_per_process = cfg.grad_accum is None
    cfg = resolve_runtime(cfg, model_config, procs.device, procs.world_size)
    threads = hardware.use_threads(cfg.threads, cfg.device)
    with own_folder(cfg.out_dir, cfg.resume, cfg.overwrite, procs, cfg.device):
        run = start_run(cfg, model_config, procs, extension)
        p = run.progress
        procs.log(report.header_line(run, one_per_process))
        procs.log(threads)
        flops_per_token, flops_note = run.model.flops_per_token(cfg.batch_size)
        for note in filter(None, [*report.schedule_notes(cfg, get_lr(cfg.max_iters - 1, cfg)), flops_note]):
            procs.log(note)
        flops_per_step = flops_per_token * run.tokens_per_step
        peak = hardware.peak_flops(cfg.device)
        clock = report.StepClock(cfg, p.iter_num)
        evals, losses, stop, stopped = [], {}, False, None
        with report.wandb_logging(run) as wandb_run, StopSignals() as signals:
            while True:
                it = p.iter_num  # steps done
                due = it % cfg.eval_interval == 0 or it == cfg.max_iters
                if due and p.evaluated_iter != it:  # a resumed step was evaluated unless a signal cut it
                    with clock.evaluation():
                        evaluated = evaluate(run, wandb_run, signals)
                    stop = stop or evaluated is None  # a stop request cut the evaluation short
                    evals += [evaluated] if evaluated else []
                if it >= cfg.max_iters and not stop:
                    break
                if stop:
                    if p.saved_iter != it:
                        with signals.deferred():
                            resume.write_checkpoints(run, improved=False)
                    stopped = signals.received or "a signal to another rank"
                    saved = f"saved {run.ckpt_path}; to continue, run {resume_command}"
                    procs.log(f"stopped by {stopped} after step {it}: {saved}")
                    break
                lr = get_lr(it, cfg)
                loss, stop = procs.agree(train_step(run, lr), signals.received is not None, cfg.device)
                p.iter_num = it + 1
                resume.check_finite(run, loss, it + 1, losses.get(it))
                losses[it + 1] = loss
                clock.step()
                if (it + 1) % cfg.log_interval == 0:  # agree() waited for the device: real time on the clock
                    step_seconds, seconds_left = clock.lap(it + 1)
                    tokens = run.tokens_per_step
                    metrics = hardware.speed(step_seconds, tokens, flops_per_step, peak, procs.world_size)
                    procs.log(report.step_line(it + 1, cfg, loss, lr, metrics, seconds_left))
                    if note := clock.slowdown(step_seconds):
                        procs.log(note)
                    if wandb_run:
                        logged = {"loss": loss, "lr": lr} | metrics
                        wandb_run.log({f"train/{k}": v for k, v in logged.items()}, step=it + 1)
    seconds = time.perf_counter() - start
    if not stopped:
        procs.log(report.done_line(run, seconds))
    summary = {"best_val_loss": p.best_val_loss, "best_iter": p.best_iter, "iter_num": p.iter_num}
    summary |= {"checkpoint": str(run.ckpt_path), "best_checkpoint": str(run.best_path), "evals": evals}
    summary |= {"losses": losses, "stopped": stopped, "wandb_run_id": p.wandb_run_id, "seconds": seconds}
    return summary


def main(argv=None, extension=PLAIN):
    """Parse flags, join torchrun's processes if launched by it, train: -> train()'s summary. A UserError
    is one line and its status; a second Ctrl-C stops at once, status 130 (the last checkpoint is whole).
    extension: a training method's additions (plumbing.resume.Extension; lab/finetune), default none."""
    argv = sys.argv[1:] if argv is None else list(argv)
    interrupted = f"{extension.prog}: interrupted: stopped at once (the last checkpoint written is whole)"
    with one_line_errors(extension.prog, stopped=interrupted):
        cfg, model_config = parse_args(argv, extension)
        with processes(cfg) as procs:
            again = procs.resume_command(argv, cfg.resume, extension.prog)
            return train(cfg, model_config, procs, again, extension)


if __name__ == "__main__":
    try:
        sys.exit(exit_status(main()["stopped"]))
    finally:  # the run is over: a Ctrl-C now (the interpreter shutting down) would only print a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
