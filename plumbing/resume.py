"""A training run's state (Run) and its checkpoints (plumbing/checkpoint.py): checking that one can be
resumed, writing them, putting a run back where it stopped, starting one from another's (--init_from)."""

import math
import random
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from model import GPTConfig
from plumbing.checkpoint import (
    RUN_ENTRIES,
    Progress,
    check_same_vocabulary,
    checkpoint_path,
    link_checkpoint,
    load_weights,
    open_checkpoint,
    run_folder,
    save_checkpoint,
)
from plumbing.errors import UserError, reading
from positions import LLAMA3_FACTORS, LONGROPE_FIELDS

RESUME_KEYS = RUN_ENTRIES  # what resuming needs beyond sampling (older files lack finished, evaluated_iter)
MODEL_KNOBS = ("dropout",)  # GPTConfig fields a resumed run may change: they shape no weight
NOT_COMPARED = ("resume", "init_from", "overwrite")  # TrainConfig fields not about the run continued


class Extension:
    """train.py's extension point: what a training method adds to a run, each default plain training. A method
    (lab/finetune: S²-Attn and LoRA) subclasses it and runs train.main(argv, extension=its instance)."""

    prog = "train.py"  # the command, as the user types it: its error lines and the resume command name it
    Flags = None  # a dataclass of the method's own flags, parsed beside train.py's (--help lists them)
    flags = None  # their values, once configure has checked them

    def configure(self, flags, model_config):
        """Take the method's flags (a Flags), checked against the model: a ValueError, one line."""
        self.flags = flags

    def recorded(self):
        """Its flags as the checkpoint's train_config records them beside train.py's."""
        return asdict(self.flags) if self.flags is not None else {}

    def adapt(self, model):
        """Change the model before the optimizer, torch.compile and DDP take it -> a log line, or None."""
        return None

    def checkpoint_entries(self, model):
        """{"model": the plain GPT's state dict, and any entry the method keeps beside it for --resume}."""
        return {"model": model.state_dict()}

    def resume_state(self, path, ckpt, model):
        """The state dict that puts the built model where its checkpoint left it (a ValueError: one line)."""
        if ckpt.get("lora") is not None:  # adapters beside the merged weights: LoRA's run, not a plain one
            raise ValueError(
                f"refusing to resume {path}: it was trained with LoRA adapters, which this command does not "
                f"add; resume it with the command that trained it (its train_config)"
            )
        return ckpt["model"]


PLAIN = Extension()  # train.py's own: plain training


@dataclass
class Run:
    """Everything one training run builds (train.py's build_run)."""

    cfg: typing.Any  # train.py's TrainConfig, resolved: device, dtype, compile, grad_accum, out_dir filled in
    model_config: typing.Any  # GPTConfig
    meta: dict
    procs: typing.Any  # plumbing.distributed.Processes
    model: torch.nn.Module  # the plain GPT: checkpoints save its state_dict (no `_orig_mod.`, `module.`)
    train_model: torch.nn.Module  # what a step calls: compiled and/or wrapped in DDP
    eval_model: torch.nn.Module  # compiled, never DDP: rank 0 evaluates alone
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: typing.Any
    samplers: list  # this rank's micro-batch streams (data.common.BatchSampler)
    eval_sampler: typing.Any
    extension: Extension = PLAIN  # what a training method adds (lab/finetune), or plain training
    progress: Progress = field(default_factory=Progress)

    ckpt_path = property(lambda r: Path(r.cfg.out_dir) / "ckpt.pt")
    best_path = property(lambda r: Path(r.cfg.out_dir) / "best.pt")
    tokens_per_step = property(lambda r: r.cfg.batch_size * r.model_config.block_size * r.cfg.grad_accum)


# Resuming: the random generators, and whether a checkpoint can be continued
def rng_state(device):
    """Every random generator's state as plain data and tensors (weights_only): Python's random.getstate() is
    (version, tuple of 625 ints, gauss); numpy's holds an ndarray in {"state": {"key", "pos"}}."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    return {
        "python": [version, list(mt_state), gauss],
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if str(device).startswith("cuda") else None,
    }


def set_rng_state(state, device):
    """Undo rng_state; the CUDA state only on CUDA (resumed on another device type, that stream restarts)."""
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    saved = state["numpy"]  # numpy reads the keys it knows: bit_generator, state, has_gauss, gauss
    key = saved["key"].cpu().numpy().astype(np.uint32)
    np.random.set_state(saved | {"state": {"key": key, "pos": saved["pos"]}})
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def model_differences(saved, wanted, may_change):
    """Each field or setting (by name: GPTConfig.flat) but may_change that differs between a checkpoint's
    model_config and a GPTConfig, as "--name=new but the checkpoint has old"."""
    saved, wanted = GPTConfig(**saved).flat(), wanted.flat()
    differ = [name for name in wanted if name not in may_change and saved.get(name) != wanted[name]]
    return ", ".join(f"--{name}={wanted[name]} but the checkpoint has {saved.get(name)}" for name in differ)


def open_for_resume(out_dir, train_config, model_config, meta, world_size, extension=PLAIN):
    """(path, checkpoint, changes) of out_dir/ckpt.pt on train_config.device; one of another vocabulary,
    position scheme or model shape refused. changes: "name old -> new" for each knob or flag changed."""
    path = Path(out_dir) / "ckpt.pt"
    if not path.is_file():
        raise UserError(f"--resume: {path} does not exist; start without --resume to train from scratch")
    try:
        ckpt = open_checkpoint(path, map_location=train_config.device)
    except UserError as e:
        raise UserError(
            f"--resume: {e}; --overwrite (without --resume) starts again there, or give another --out_dir"
        ) from None
    if missing := [key for key in RESUME_KEYS if key not in ckpt]:
        raise UserError(
            f"{path} has no {', '.join(missing)}: it can be sampled from but not resumed "
            "(written by an older train.py?); start a new run with another --out_dir"
        )
    check_same_vocabulary(path, ckpt["meta"], meta, train_config.dataset, "resume")
    if changes := model_differences(ckpt["model_config"], model_config, MODEL_KNOBS):
        raise UserError(
            f"refusing to resume {path}: {changes}; pass the checkpoint's model settings "
            "(only training settings such as max_iters or learning_rate may change), or start a "
            "new run with another --out_dir"
        )
    current = vars(train_config) | extension.recorded()
    knobs = [(name, ckpt["model_config"][name], getattr(model_config, name)) for name in MODEL_KNOBS] + [
        (name, value, current[name])
        for name, value in ckpt["train_config"].items()
        if name not in NOT_COMPARED and name in current
    ]
    ignored = {"seed": " (ignored: the saved random and data streams continue)"}
    changes = [f"{name} {old} -> {new}{ignored.get(name, '')}" for name, old, new in knobs if old != new]
    if len(ckpt["rng"]) != world_size:
        changes.append(f"processes {len(ckpt['rng'])} -> {world_size}")
    return path, ckpt, changes


# A training run to and from its checkpoint (SCHEMA)
def write_checkpoints(run, improved):
    """ckpt.pt, and best.pt if the validation loss improved: every rank gives its RNG state, rank 0 writes."""
    rng, p = run.procs.gather(rng_state(run.cfg.device)), run.progress
    if run.procs.master:
        ckpt = {
            **run.extension.checkpoint_entries(run.model),  # "model": plain weights; a method's own entries
            "model_config": asdict(run.model_config),
            "train_config": asdict(run.cfg) | run.extension.recorded(),
            "iter_num": p.iter_num,
            "best_val_loss": p.best_val_loss,
            "best_iter": p.best_iter,
            "meta": run.meta,
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict(),
            "sampler": {"train": run.samplers[0].state_dict(), "eval": run.eval_sampler.state_dict()},
            "rng": rng,
            "wandb_run_id": p.wandb_run_id,
            "finished": p.iter_num >= run.cfg.max_iters and p.evaluated_iter == p.iter_num,
            "evaluated_iter": p.evaluated_iter,
        }
        try:
            save_checkpoint(ckpt, run.ckpt_path)
            if improved:
                link_checkpoint(run.ckpt_path, run.best_path)
        except UserError as e:  # no space left: the files on disk are whole
            raise UserError(f"{e}; training stopped: {kept_checkpoint(run)}") from None
    p.saved_iter = p.iter_num


def kept_checkpoint(run):
    """What an error that stops training says of the checkpoint on disk."""
    saved = run.progress.saved_iter
    return "no checkpoint was written" if saved is None else f"{run.ckpt_path} (step {saved}) was kept"


def check_finite(run, loss, step, last):
    """Stop on a NaN or infinite loss, before an evaluation overwrites ckpt.pt with broken weights. last:
    the step before's loss (finite), if this process ran it."""
    if math.isfinite(loss):
        return
    last_good = (
        f"last good loss {last:.4f} at step {step - 1}" if last is not None else "no finite loss before it"
    )
    advice = f"{kept_checkpoint(run)}; a lower --learning_rate may help, with --resume to continue from it"
    raise UserError(f"loss is {loss} at step {step}: training stopped ({last_good}); {advice}")


def resume_run(run, path, ckpt, changes):
    """--resume: restore_run inside the error boundary: a state open_for_resume could not check without the
    run (the optimizer's, the samplers', the random generators') that cannot be restored is the file's fault,
    one line, before training starts."""
    with reading(path, "checkpoint"):
        restore_run(run, path, ckpt, changes)


def restore_run(run, path, ckpt, changes):
    """--resume: put a freshly built run where the checkpoint open_for_resume opened and checked left it (the
    run's extension gives its weights; the random generators last, as building the model drew from them), then
    log what resumed."""
    try:
        state = run.extension.resume_state(path, ckpt, run.model)
    except ValueError as e:  # a method's settings the run and its checkpoint do not share: a flag to fix
        raise UserError(str(e)) from None
    load_weights(path, run.model, state)
    settings = [{k: v for k, v in group.items() if k != "params"} for group in run.optimizer.param_groups]
    load_weights(path, run.optimizer, ckpt["optimizer"])
    # keep the moments, take this run's betas and weight decay (and fused on this device)
    for group, fresh in zip(run.optimizer.param_groups, settings):
        group.update(fresh)
    if ckpt["scaler"] and run.scaler.is_enabled():
        load_weights(path, run.scaler, ckpt["scaler"])
    for sampler in run.samplers:  # every micro-batch stream has drawn one batch per step: the same count
        sampler.load_state_dict(ckpt["sampler"]["train"])
    run.eval_sampler.load_state_dict(ckpt["sampler"]["eval"])
    p = run.progress = Progress.recorded(ckpt)
    if run.procs.rank < len(ckpt["rng"]):
        set_rng_state(ckpt["rng"][run.procs.rank], run.cfg.device)
    else:  # a rank the saved run did not have: a fresh stream of its own
        torch.manual_seed(run.cfg.seed + run.procs.rank + p.iter_num)
    changed = "; changed: " + ", ".join(changes) if changes else ""
    best = f"best val loss {ckpt['best_val_loss']:.4f} at step {ckpt['best_iter']}"
    run.procs.log(f"resuming {path} at step {ckpt['iter_num']} ({best}){changed}")


# Starting a new run from a checkpoint's weights (train.py --init_from): context extension by fine-tuning
# GPTConfig fields an --init_from run may change: every weight still fits (a learned table is resized)
INIT_KNOBS = ("block_size", "rope_scaling", "rope_factor", "rope_original_len", *LLAMA3_FACTORS,
              *LONGROPE_FIELDS, "dropout")  # fmt: skip


def saved_model_config(out_dir, names):
    """The model fields and settings (those in names, flat) of the checkpoint in out_dir: an --init_from
    run's defaults. A folder with no checkpoint it can read is a bad flag: status 2."""
    try:
        saved = open_checkpoint(checkpoint_path(out_dir), mmap=True, vocabulary=False)["model_config"]
    except UserError as e:
        raise UserError(str(e), status=2) from None
    return {name: value for name, value in GPTConfig(**saved).flat().items() if name in names}


def fine_tune_dir(source, block_size, rope_scaling):
    """Where a run from `source`'s checkpoint writes unless told (out/shakespeare_char_rope_ctx256_yarn)."""
    source = run_folder(source)
    return str(source.parent / f"{source.name}_ctx{block_size}_{rope_scaling or 'plain'}")


def init_from_settings(values, saved):
    """What a run started from values["init_from"] (model settings `saved`) needs beyond its flags:
    rope_original_len, the length a new RoPE extension scales against, and an out_dir of its own."""
    source, settings = Path(values["init_from"]), {}
    if values["rope_scaling"] and not saved.get("rope_scaling") and values["rope_original_len"] is None:
        settings["rope_original_len"] = saved["block_size"]
    out_dir = values["out_dir"]
    if out_dir is None:
        out_dir = settings["out_dir"] = fine_tune_dir(source, values["block_size"], values["rope_scaling"])
    if Path(out_dir).resolve() == run_folder(source).resolve():
        raise ValueError(
            f"--init_from={source} and --out_dir are the same folder: a run started from a "
            "checkpoint writes its own; give another --out_dir"
        )
    return settings


def init_model_from(out_dir, model, meta, dataset):
    """Load out_dir's checkpoint into model, whose config may differ from it only in INIT_KNOBS -> a note for
    the log when the position scheme fitted its entries (wpe.adapt_state: learned's table resized)."""
    path = checkpoint_path(out_dir)
    ckpt = open_checkpoint(path, mmap=True)
    check_same_vocabulary(path, ckpt["meta"], meta, dataset, "initialise from")
    if changes := model_differences(ckpt["model_config"], model.config, INIT_KNOBS):
        raise UserError(
            f"refusing to initialise from {path}: {changes}; --init_from may change only "
            f"{', '.join(INIT_KNOBS)} (the weights must fit)"
        )
    state, note = model.transformer.wpe.adapt_state(ckpt["model"], "transformer.wpe.")
    load_weights(path, model, state)
    return note
