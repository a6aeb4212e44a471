"""A training run's flags and its checkpoints (plumbing/checkpoint.py), for train.py: reading the flags (an
--init_from run's defaults from its source), the run's start (out_dir owned, the data, the device's threads),
a run's weights from another's (--init_from), putting a run back where its checkpoint left it (--resume) and
writing its checkpoints. train.py calls these from main() and at the start of train(), and writes a
checkpoint at each evaluation; the step and the loop are train.py's own."""

import random
import shlex
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from model import GPT, GPTConfig
from plumbing import cli, hardware
from plumbing import run_folder as folders
from plumbing.checkpoint import (
    RUN_ENTRIES,
    Progress,
    check_same_vocabulary,
    checkpoint_path,
    link_checkpoint,
    load_weights,
    open_checkpoint,
    remove_unfinished_writes,
    run_folder,
    save_checkpoint,
    weights_misfit,
)
from plumbing.distributed import check_torchrun_device
from plumbing.errors import StopSignals, UserError, reading
from plumbing.report import schedule_notes, wandb_problem
from positions import POSITION_MODULES

# Resuming reads RUN_ENTRIES beyond what sampling needs (model, model_config, meta); older files lack
# LATER_KEYS, which restore reads with a default (command: the one that trained it, for open_for_resume)
LATER_KEYS = ("finished", "evaluated_iter", "command")
WRITTEN = ("model", "model_config", "meta", *RUN_ENTRIES, *LATER_KEYS)  # every entry write_checkpoint writes
MODEL_KNOBS = ("dropout",)  # GPTConfig fields a resumed run may change: they shape no weight
NOT_COMPARED = ("resume", "init_from", "overwrite")  # TrainConfig fields not about the run continued


# The flags: train.py's, its model's and a training method's (a TrainConfig subclass: its own fields)
def parse_flags(argv, Config, model_defaults, doc):
    """Flags (and --config) -> (Config, GPTConfig), vocab_size left to the dataset; Config: train.py's
    TrainConfig or a training method's subclass, whose own fields are flags too and whose fit checks them
    against the model. With --init_from the model settings not given are that checkpoint's, out_dir beside
    it. A bad flag or value: one line, status 2."""
    base = next(c for c in Config.__mro__ if c.__name__ == "TrainConfig")
    sections, given = [("training", base, None), *cli.model_sections()], set()
    model_flags = cli.section_names(sections[1:])
    own = [f.name for f in fields(Config) if f.name not in {f.name for f in fields(base)}]
    sections += [(Config.prog, Config, own)] if own else []
    prog = Config.prog
    values = cli.parse_flags(argv, prog, doc, sections, model_defaults, given=given)
    if source := values["init_from"]:  # parse again: the checkpoint's model config under --config and flags
        saved = saved_model_config(source, model_flags)
        values = cli.parse_flags(argv, prog, doc, sections, model_defaults | saved | {"out_dir": None})
    # a setting given of another scheme than pos is refused, at its default too; a factors file read here
    model_config = GPTConfig.from_flat(given=given, **{k: values[k] for k in model_flags})
    if source:
        model_config, values["out_dir"] = init_from_settings(values, saved, model_config, given)
    cfg = Config(**{k: v for k, v in values.items() if k not in model_flags})
    cfg = cfg.fit(model_config)
    folders.check_out_dir(folders.format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos))
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
    out_dir = folders.format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos)
    dtype = hardware.resolve_dtype(cfg.dtype, device_type)
    return replace(cfg, grad_accum=grad_accum, device=device, dtype=dtype, compile=compile, out_dir=out_dir)


class Started(NamedTuple):
    """What open_run gives the run it starts."""

    cfg: object  # train.py's TrainConfig, every auto resolved (resolve_runtime)
    model_config: GPTConfig  # vocab_size the dataset's
    meta: dict  # the dataset's tokenizer and vocabulary
    data_dir: Path
    signals: StopSignals  # SIGINT and SIGTERM as requests to stop
    peak: float | None  # the device's peak FLOP/s for MFU, or None
    opened: tuple | None  # --resume: (checkpoint, changes), checked before the model is built (restore)


@contextmanager
def open_run(cfg, model_config, procs, final_lr, prepare_data):
    """The start of a run, before its model is built: --wandb usable, every auto resolved (resolve_runtime),
    the threads set, out_dir owned for the block (run_folder.own_folder), the dataset prepared, unfinished
    checkpoint writes removed, then SIGINT and SIGTERM taken as requests to stop (errors.StopSignals) and
    running out of memory made one line (hardware.out_of_memory); with --resume its checkpoint opened and
    checked. -> Started, for the block. final_lr: the rate of the last step, for the notes on a schedule the
    run does not follow (report.schedule_notes); prepare_data: data.common's (data/ builds on plumbing/)."""
    if cfg.wandb and (problem := wandb_problem()):  # before any work: data can take hours
        raise UserError(problem)
    one_per_process = cfg.grad_accum is None
    cfg = resolve_runtime(cfg, model_config, procs.device, procs.world_size)
    if cfg.grad_accum % procs.world_size:
        raise UserError(
            f"grad_accum={cfg.grad_accum} is not divisible by the {procs.world_size} processes torchrun "
            "started; each runs grad_accum / world_size micro-batches: use a multiple of "
            f"{procs.world_size}, or leave --grad_accum out for one micro-batch per process"
        )
    threads = hardware.use_threads(cfg.threads, cfg.device)
    with folders.own_folder(cfg.out_dir, cfg.resume, cfg.overwrite, procs, cfg.device):
        data_dir, meta = prepare_data(cfg.dataset, procs)
        model_config = replace(model_config, vocab_size=meta["vocab_size"])
        # --resume: a damaged checkpoint, or one of another model, is one line before the model is built
        opened = open_for_resume(cfg, model_config, meta, procs) if cfg.resume else None
        if procs.master and (removed := remove_unfinished_writes(cfg.out_dir)):
            procs.log(f"removed {removed} unfinished checkpoint write(s) from {cfg.out_dir}")
        procs.log(header_line(cfg, model_config, meta, procs, one_per_process))
        procs.log(threads)
        for note in schedule_notes(cfg, final_lr):
            procs.log(note)
        # out of memory in the block (the model, its steps, evaluations): one line, checkpoints as they were
        fit = "lower --batch_size or --block_size (raise --grad_accum to keep the tokens per step)"
        with StopSignals() as signals, hardware.out_of_memory(f"{fit}, or --n_layer/--n_embd"):
            peak = hardware.peak_flops(cfg.device)
            yield Started(cfg, model_config, meta, data_dir, signals, peak, opened)


def header_line(cfg, model_config, meta, procs, one_per_process):
    """What is trained, on what, how: the first line of every run's log."""
    split = f" | {cfg.grad_accum} micro-batches" if cfg.grad_accum > 1 else ""
    if procs.launched:
        given = " (one per process: --grad_accum not given)" if one_per_process else ""
        split = f" | {procs.world_size} processes x {cfg.grad_accum // procs.world_size} micro-batches{given}"
    compiled = " compiled" if cfg.compile else ""
    with torch.device("meta"):  # the parameters counted without allocating them
        params = GPT(model_config).num_params()
    tokens = cfg.batch_size * model_config.block_size * cfg.grad_accum
    return (
        f"{cfg.dataset} ({meta['vocab_size']} tokens) | pos={model_config.pos} | {params / 1e6:.2f}M "
        f"parameters | {cfg.device} {cfg.dtype}{compiled} | {tokens:,} tokens/step{split} | "
        f"{cfg.max_iters} steps"
    )


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


def restore(cfg, opened, state, progress, procs):
    """--resume: put a freshly built run (state: train.py's model, optimizer, scaler, samplers, eval_sampler)
    where out_dir/ckpt.pt left it, and progress (iter_num, best_val_loss, ...) with it; the random generators
    last, as building the model drew from them. opened: open_for_resume's (checkpoint, changes); weights
    this run's model does not fit are one line; each knob or flag changed is said."""
    path, (ckpt, changes) = Path(cfg.out_dir) / "ckpt.pt", opened
    with reading(path, "checkpoint"):  # a state open_for_resume could not check without the run: one line
        restore_state(cfg, path, ckpt, state)
        vars(progress).update(vars(Progress.recorded(ckpt)))
        if procs.rank < len(ckpt["rng"]):
            set_rng_state(ckpt["rng"][procs.rank], cfg.device)
        else:  # a rank the saved run did not have: a fresh stream of its own
            torch.manual_seed(cfg.seed + procs.rank + progress.iter_num)
    changed = "; changed: " + ", ".join(changes) if changes else ""
    best = f"best val loss {ckpt['best_val_loss']:.4f} at step {ckpt['best_iter']}"
    procs.log(f"resuming {path} at step {ckpt['iter_num']} ({best}){changed}")


def restore_state(cfg, path, ckpt, state):
    """The weights, the optimizer's and the scaler's state, the batch streams, as the checkpoint left them."""
    load_weights(path, state.model, ckpt["model"] | method_state(ckpt, cfg.state_entry))
    settings = [{k: v for k, v in group.items() if k != "params"} for group in state.optimizer.param_groups]
    load_weights(path, state.optimizer, ckpt["optimizer"])
    # keep the moments, take this run's betas and weight decay (and fused on this device)
    for group, fresh in zip(state.optimizer.param_groups, settings):
        group.update(fresh)
    if ckpt["scaler"] and state.scaler.is_enabled():
        load_weights(path, state.scaler, ckpt["scaler"])
    for sampler in state.samplers:  # every micro-batch stream has drawn one batch per step: the same count
        sampler.load_state_dict(ckpt["sampler"]["train"])
    state.eval_sampler.load_state_dict(ckpt["sampler"]["eval"])


def method_state(ckpt, entry):
    """The state dict a training method's checkpoint entry holds beside "model" ({} without one); a damaged
    entry fails in the caller's error boundary (errors.reading), as any damaged entry does."""
    return ckpt[entry]["state"] if entry in ckpt else {}


def check_fits(path, cfg, model_config, weights):
    """A one-line UserError unless weights (names, shapes) fit the model this run builds: a GPT of
    model_config as cfg.prepare changes it, built on the meta device (no memory), before the real one."""
    with torch.device("meta"):
        model = GPT(model_config)
        cfg.prepare(model)
    if detail := weights_misfit(model.state_dict(), weights):
        raise UserError(f"{path}: its GPT state does not fit ({detail})")


def open_for_resume(cfg, model_config, meta, procs):
    """(checkpoint, changes) of out_dir/ckpt.pt on cfg.device, refused in one line unless this run can
    continue it. changes: "name old -> new" for each knob or flag changed."""
    path = Path(cfg.out_dir) / "ckpt.pt"
    if not path.is_file():
        raise UserError(f"--resume: {path} does not exist; start without --resume to train from scratch")
    try:
        ckpt = open_checkpoint(path, map_location=cfg.device)
    except UserError as e:
        raise UserError(
            f"--resume: {e}; --overwrite (without --resume) starts again there, or give another --out_dir"
        ) from None
    if missing := [key for key in RUN_ENTRIES if key not in ckpt]:
        raise UserError(
            f"{path} has no {', '.join(missing)}: it can be sampled from but not resumed "
            "(written by an older train.py?); start a new run with another --out_dir"
        )
    if foreign := [key for key in ckpt if key not in WRITTEN and key != cfg.state_entry]:
        flags = [name for name in ckpt["train_config"] if name not in vars(cfg)]
        took = f", with the flags {', '.join(flags)}" if flags else ""
        again = "the command that trained it"
        if isinstance(command := ckpt.get("command"), str):  # older files record none: the flags say it
            words = [w for w in shlex.split(command) if w.split("=")[0] not in ("--overwrite", "--resume")]
            again = f"{again}: {shlex.join(words)} --resume"
        raise UserError(
            f"refusing to resume {path}: it holds model state ({', '.join(foreign)}) that {cfg.prog} does "
            f"not build: it was trained by another command{took}; resume it with {again}"
        )
    check_same_vocabulary(path, ckpt["meta"], meta, cfg.dataset, "resume")
    if changes := model_differences(ckpt["model_config"], model_config, MODEL_KNOBS):
        raise UserError(
            f"refusing to resume {path}: {changes}; pass the checkpoint's model settings "
            "(only training settings such as max_iters or learning_rate may change), or start a "
            "new run with another --out_dir"
        )
    with reading(path, "checkpoint"):  # weights not tensors, a method's entry not a dict: the file's fault
        check_fits(path, cfg, model_config, ckpt["model"] | method_state(ckpt, cfg.state_entry))
    current = vars(cfg)
    knobs = [(name, ckpt["model_config"][name], getattr(model_config, name)) for name in MODEL_KNOBS] + [
        (name, value, current[name])
        for name, value in ckpt["train_config"].items()
        if name not in NOT_COMPARED and name in current
    ]
    ignored = {"seed": " (ignored: the saved random and data streams continue)"}
    changes = [f"{name} {old} -> {new}{ignored.get(name, '')}" for name, old, new in knobs if old != new]
    if len(ckpt["rng"]) != procs.world_size:
        changes.append(f"processes {len(ckpt['rng'])} -> {procs.world_size}")
    return ckpt, changes


def write_checkpoint(cfg, model_config, meta, state, progress, procs, improved):
    """ckpt.pt, and best.pt if the validation loss improved: every rank gives its RNG state, rank 0 writes.
    "model" is the state a plain GPT of model_config loads (sample.py's, --init_from's); any other entries of
    the model's state_dict (a training method's modules' own) go under cfg.state_entry, for --resume."""
    rng, p = procs.gather(rng_state(cfg.device)), progress
    if procs.master:
        with torch.device("meta"):
            plain = GPT(model_config).state_dict().keys()
        weights = state.model.state_dict()
        ckpt = {
            "model": {key: weights[key] for key in plain},
            "model_config": asdict(model_config),
            "train_config": asdict(cfg),
            "iter_num": p.iter_num,
            "best_val_loss": p.best_val_loss,
            "best_iter": p.best_iter,
            "meta": meta,
            "optimizer": state.optimizer.state_dict(),
            "scaler": state.scaler.state_dict(),
            "sampler": {"train": state.samplers[0].state_dict(), "eval": state.eval_sampler.state_dict()},
            "rng": rng,
            "wandb_run_id": p.wandb_run_id,
            "finished": p.iter_num >= cfg.max_iters and p.evaluated_iter == p.iter_num,
            "evaluated_iter": p.evaluated_iter,
            "command": procs.command,  # as typed; None where train.main did not start it
        }
        if own := {key: value for key, value in weights.items() if key not in plain}:
            ckpt[cfg.state_entry] = {"state": own}  # a training method's (TrainConfig.state_entry)
        ckpt_path = Path(cfg.out_dir) / "ckpt.pt"
        try:
            save_checkpoint(ckpt, ckpt_path)
            if improved:
                link_checkpoint(ckpt_path, Path(cfg.out_dir) / "best.pt")
        except UserError as e:  # no space left: the files on disk are whole
            kept = f"{ckpt_path} (step {p.saved_iter}) was kept"
            kept = kept if p.saved_iter is not None else "no checkpoint was written"
            raise UserError(f"{e}; training stopped: {kept}") from None
    p.saved_iter = p.iter_num


def init_from(cfg, model, meta, procs):
    """--init_from (without --resume): load that run's weights into model (plain, before a training method
    changes it), whose config may differ from it only in INIT_KNOBS; the log says so."""
    if not cfg.init_from or cfg.resume:
        return
    path = checkpoint_path(cfg.init_from)
    ckpt = open_checkpoint(path, mmap=True)
    check_same_vocabulary(path, ckpt["meta"], meta, cfg.dataset, "initialise from")
    if changes := model_differences(ckpt["model_config"], model.config, INIT_KNOBS):
        raise UserError(
            f"refusing to initialise from {path}: {changes}; --init_from may change only "
            f"{', '.join(INIT_KNOBS)} (the weights must fit)"
        )
    state, note = model.transformer.wpe.adapt_state(ckpt["model"], "transformer.wpe.")
    load_weights(path, model, state)
    procs.log(f"initialised from {cfg.init_from}" + (f": {note}" if note else ""))


# Starting a new run from a checkpoint's weights (train.py --init_from): context extension by fine-tuning
# GPTConfig fields and scheme settings (each Settings' at_init_from) an --init_from run may change: every
# weight still fits (a learned table is resized)
SCHEME_KNOBS = (
    n for scheme in POSITION_MODULES.values() for n in getattr(scheme.Settings, "at_init_from", ())
)
INIT_KNOBS = ("block_size", *SCHEME_KNOBS, "dropout")


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


def init_from_settings(values, saved, model_config, given):
    """What a run started from values["init_from"] (model settings `saved`) needs beyond its flags: a new
    RoPE extension scaling against the source's block_size (rope_original_len; a factors file's searched for
    it), and an out_dir of its own. -> (model_config, out_dir)"""
    source, settings = Path(values["init_from"]), model_config.pos_settings
    scaling = getattr(settings, "rope_scaling", None)
    if scaling and not saved.get("rope_scaling"):
        if settings.rope_original_len is None:
            settings = replace(settings, rope_original_len=saved["block_size"])
        elif "rope_factors" in given and "rope_original_len" not in given:
            what = f"--init_from={source}'s original length"
            cli.check_original_len(settings.rope_original_len, saved["block_size"], what)
    out_dir = values["out_dir"]
    if out_dir is None:
        out_dir = fine_tune_dir(source, values["block_size"], scaling)
    if Path(out_dir).resolve() == run_folder(source).resolve():
        raise ValueError(
            f"--init_from={source} and --out_dir are the same folder: a run started from a "
            "checkpoint writes its own; give another --out_dir"
        )
    return replace(model_config, pos_settings=settings), out_dir
