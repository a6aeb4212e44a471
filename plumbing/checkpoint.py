"""
Checkpoints: written atomically, read safely, and what resuming needs.

train.py writes {out_dir}/ckpt.pt (the latest state) at every evaluation and, when the validation loss improved,
best.pt (a hard link to the same file). Both hold the same plain dict:
    model          state_dict of the uncompiled GPT (no `_orig_mod.` prefix: nanoGPT issue #325)
    model_config   dataclasses.asdict(GPTConfig), so GPT(GPTConfig(**ckpt["model_config"])) rebuilds the model
                   (a file older than the RoPE variants' fields gets them at plain RoPE's values: with_rope_variants)
    train_config   dataclasses.asdict(TrainConfig) as run (device, dtype, compile and out_dir resolved)
    iter_num       optimizer steps taken when it was saved
    best_val_loss  the best validation loss so far (in best.pt, the loss of its own step)
    best_iter      the step of best_val_loss (None before the first evaluation)
    meta           the dataset's meta (tokenizer, vocabulary), so sampling needs nothing but this file
    optimizer      the AdamW state_dict
    scaler         the float16 GradScaler's state_dict ({} unless dtype is float16)
    sampler        {"train": ..., "eval": ...}: batches drawn per split (BatchSampler.state_dict), to resume the streams
    rng            one dict per rank of the random generators' states: python, numpy, torch, cuda (None on CPU)
    wandb_run_id   the Weights & Biases run this training logs to (None without --wandb), continued on --resume
    finished       whether the run had completed its max_iters when it was saved (older files: see run_finished)
It holds only tensors and plain Python data, so load_checkpoint reads it with torch.load(weights_only=True).
Sampling and evaluation need only model, model_config and meta (SAMPLING_KEYS); resuming needs the rest.

A run owns its folder while it runs: out_dir/train.lock (see lock_folder) names the process holding it.
"""

import io
import os
import pickle
import pickletools
import random
import re
import shutil
import uuid
import warnings
import zipfile
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from data.common import TOKENIZERS, get_tokenizer
from model import GPT, ROPE_VARIANTS, GPTConfig, download_gpt2, gpt2_weights_from_hf

SAMPLING_KEYS = ("model", "model_config", "meta")
# Resuming needs these beyond what sampling needs
RESUME_KEYS = ("train_config", "iter_num", "best_val_loss", "best_iter", "optimizer", "scaler", "sampler", "rng",
               "wandb_run_id")
# GPTConfig fields a resumed run may change: they shape no weight
MODEL_KNOBS = ("dropout",)
# TrainConfig fields that say nothing about the run being continued
NOT_COMPARED = ("resume", "init_from", "overwrite")
# What a checkpoint train.py wrote pickles besides plain data: torch's tensor rebuilders and storages, OrderedDict
SAFE_GLOBAL = re.compile(r"torch\._utils _rebuild_\w+|torch \w+Storage|collections OrderedDict")


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated, corrupt, holds more than tensors and plain data, or cannot
    be continued with the settings given. Entry points print it as one line."""


# -----------------------------------------------------------------------------
# Writing: atomically, so that a crash never leaves a half-written checkpoint in place of a good one


def temporary_path(path):
    # hidden and unique (two writers never share one); remove_unfinished_writes finds those a kill -9 left behind
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def sync_directory(folder):
    """fsync a folder, so that a rename in it survives a power cut (POSIX; elsewhere os.replace is all we have)."""
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_atomically(path, write):
    """Put a new file at path all at once: write(tmp) fills a temporary file in the same folder, which then
    os.replace()s path (atomic on POSIX and Windows within one filesystem) and the folder is fsynced. A crash,
    a kill -9 or a full disk midway leaves the previous file whole and at worst a temporary one behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)
    return path


def save_checkpoint(obj, path):
    """torch.save(obj) to path atomically (replace_atomically), flushed and fsynced before the rename."""

    def write(tmp):
        with open(tmp, "xb") as f:  # not tempfile.mkstemp, whose files are private (0600) whatever the umask
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())

    return replace_atomically(path, write)


def link_checkpoint(source, path):
    """Make path a second name of the checkpoint at source, atomically: a hard link (no second copy of a
    GPT-2-sized file) under a temporary name, then the rename. The next save_checkpoint(source) writes a new file
    and leaves this one alone. Copies where the filesystem has no hard links."""

    def write(tmp):
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    return replace_atomically(path, write)


def remove_unfinished_writes(out_dir):
    """Delete the temporary files of checkpoint writes that a crash or kill -9 interrupted; returns how many."""
    leftovers = [p for name in ("ckpt.pt", "best.pt") for p in Path(out_dir).glob(f".{name}.*.tmp")]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


# -----------------------------------------------------------------------------
# Reading: weights_only, every failure one line


def load_checkpoint(path, map_location="cpu", mmap=False):
    """The checkpoint dict at path, read with weights_only=True: unpickling arbitrary objects can run arbitrary
    code, so a file that needs it is refused. Every failure is a CheckpointError naming the path and the cause.
    mmap=True maps the file instead of reading it, so a tensor is read from disk only when used: what reads a
    config, or the weights without the optimizer state (2/3 of a training checkpoint), should pass it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        # torch maps only its zip format: another file (an older format) is read whole, as before
        mmap = mmap and zipfile.is_zipfile(path)
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": the error, if any, says it in one line
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if refused := refused_globals(path, e):  # a class or function: loading it would import and run code
            raise CheckpointError(
                f"{path}: refused to load: it pickles {refused}, code that unpickling would import and could run; a "
                "posgpt checkpoint holds only tensors and plain data, so this file was not written by train.py or "
                "was altered: do not load it"
            ) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # e.g. "Unsupported operand 110"
        cause = detail.group(1) if detail else first_line(e)
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({cause})") from None
    except Exception as e:  # torch.load raises RuntimeError, EOFError, KeyError ... for a damaged file
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({type(e).__name__}: {first_line(e)})") from None
    missing = [key for key in ("model", "model_config") if not (isinstance(ckpt, dict) and key in ckpt)]
    if missing:
        raise CheckpointError(f"{path}: not a posgpt checkpoint (no {' or '.join(missing)} entry)")
    if isinstance(ckpt["model_config"], dict):
        ckpt["model_config"] = with_rope_variants(ckpt["model_config"])
    return ckpt


def with_rope_variants(model_config):
    """A checkpoint's model_config with the RoPE variants' GPTConfig fields its file predates (model.ROPE_VARIANTS)
    at plain RoPE's values, the model its code built: so that resuming or --init_from compares like with like
    instead of refusing a missing field (None) against its default."""
    return model_config | {name: plain for name, plain in ROPE_VARIANTS.items() if name not in model_config}


def first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no details"


def refused_globals(path, error):
    """The classes and functions a file pickles that weights_only refused, as 'module.name' ('' if none): from
    torch's message ("GLOBAL posix.system"), else (torch stopped earlier, at an opcode it does not know) from the
    pickle's own opcodes, read with pickletools, which decodes them without running anything."""
    named = re.findall(r"GLOBAL ([\w.]+)", str(error))
    if not named:
        named = [name.replace(" ", ".") for name in pickled_globals(path) if not SAFE_GLOBAL.fullmatch(name)]
    return ", ".join(dict.fromkeys(named))


def pickled_globals(path):
    """Every 'module name' a pickle file references (torch's zip format: its data.pkl; an older one: the pickles
    one after another). A STACK_GLOBAL's names are the two strings pushed just before it."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            data = b"".join(z.read(name) for name in z.namelist() if name.endswith("data.pkl"))
    else:
        data = Path(path).read_bytes()
    stream, found, strings = io.BytesIO(data), [], []
    with suppress(Exception):  # a damaged stream: what was read so far
        while stream.tell() < len(data):
            for op, arg, _ in pickletools.genops(stream):
                if op.name == "GLOBAL":
                    found.append(arg)
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(" ".join(strings[-2:]))
                if isinstance(arg, str):
                    strings.append(arg)
    return found


def checkpoint_path(out_dir):
    """The best checkpoint train.py kept in out_dir (best.pt), else its latest (ckpt.pt); a checkpoint file given
    instead of its folder is that file."""
    if Path(out_dir).is_file():
        return Path(out_dir)
    best = Path(out_dir) / "best.pt"
    return best if best.is_file() else Path(out_dir) / "ckpt.pt"


def run_folder(path):
    """The folder of a run given as its folder or as one of its checkpoint files."""
    return Path(path).parent if Path(path).is_file() else Path(path)


def check_meta(path, ckpt):
    """Refuse (one line) a checkpoint whose meta cannot say what its token ids mean: without it nothing can be
    decoded, nor a dataset's vocabulary compared with it."""
    meta = ckpt.get("meta")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: no meta entry (the tokenizer and vocabulary its token ids belong to): it "
                              "can be neither sampled from nor trained on; train.py writes one into every checkpoint")
    tokenizer, vocab_size, chars = vocabulary(meta)
    if tokenizer not in TOKENIZERS or not isinstance(vocab_size, int) or vocab_size < 1:
        raise CheckpointError(f"{path}: its meta names no vocabulary (tokenizer {tokenizer!r}, vocab_size "
                              f"{vocab_size!r}; expected one of {', '.join(TOKENIZERS)} and a positive size)")
    if tokenizer == "char" and not (isinstance(chars, (list, str)) and len(chars) == vocab_size
                                    and all(isinstance(c, str) and len(c) == 1 for c in chars)):
        raise CheckpointError(f"{path}: its meta has no vocabulary: a char tokenizer needs chars, the "
                              f"{vocab_size} characters its token ids stand for")
    model_vocab = ckpt["model_config"].get("vocab_size") if isinstance(ckpt["model_config"], dict) else None
    if model_vocab is not None and model_vocab != vocab_size:
        raise CheckpointError(f"{path}: its meta has {vocab_size} tokens but its model {model_vocab}")


def mismatched_tensors(module, state_dict, shown=3):
    """What keeps state_dict from fitting module, in one line: the missing, unexpected and mis-shaped tensors
    (the first `shown` of each kind)."""
    if not isinstance(state_dict, dict):
        return f"a {type(state_dict).__name__} where a state dict of tensors belongs"
    expected = module.state_dict()

    def some(names):
        return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")

    missing = [name for name in expected if name not in state_dict]
    unexpected = [name for name in state_dict if name not in expected]
    shapes = [f"{name} {tuple(getattr(value, 'shape', ()))} where the model has {tuple(expected[name].shape)}"
              for name, value in state_dict.items()
              if name in expected and getattr(value, "shape", None) != expected[name].shape]
    parts = [f"{what} {some(names)}" for what, names in
             (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes)) if names]
    return "; ".join(parts)


def load_weights(path, module, state_dict):
    """module.load_state_dict, its multi-line mismatch report turned into a one-line CheckpointError that names
    the tensors that do not fit."""
    try:
        module.load_state_dict(state_dict)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        detail = mismatched_tensors(module, state_dict) if isinstance(module, torch.nn.Module) else ""
        raise CheckpointError(f"{path}: its {type(module).__name__} state does not fit "
                              f"({detail or first_line(e)})") from None


def build_model(path, ckpt, **overrides):
    """The GPT saved in a loaded checkpoint, with model settings overridden (e.g. rope_scaling) on the way:
    a setting the model refuses (rope_scaling on an ALiBi model) is a one-line CheckpointError."""
    try:
        model = GPT(GPTConfig(**(ckpt["model_config"] | overrides)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    load_weights(path, model, ckpt["model"])
    return model


def pretrained_checkpoint(name):
    """OpenAI's GPT-2 weights (through the optional transformers package) as the part of a checkpoint dict that
    sampling reads: model, model_config and meta (GPT-2's BPE). No GPT is built here: load_model builds the one."""
    try:
        config, state_dict = gpt2_weights_from_hf(download_gpt2(name))
    except (ImportError, OSError, RuntimeError) as e:
        raise CheckpointError(f"--init_from={name}: {first_line(e)}") from None
    return {"model": state_dict, "model_config": asdict(config),
            "meta": {"tokenizer": "gpt2", "vocab_size": config.vocab_size}}


def load_model(out_dir, device="cpu", ckpt=None, **overrides):
    """(model in eval mode on device, tokenizer, checkpoint dict) from the checkpoint train.py kept in out_dir
    (best.pt, else ckpt.pt), or from ckpt, that checkpoint already loaded (or pretrained_checkpoint's), with model
    settings overridden (e.g. rope_scaling): what sample.py, eval_length.py and the figures start from."""
    path = checkpoint_path(out_dir)
    ckpt = ckpt or load_checkpoint(path, mmap=True)  # the weights only: moved to device with the model
    check_meta(path, ckpt)
    model = build_model(path, ckpt, **overrides)
    return model.to(device).eval(), get_tokenizer(ckpt["meta"]), ckpt


# -----------------------------------------------------------------------------
# Resuming: the random generators, and whether a checkpoint can be continued


def rng_state(device):
    """The state of every random generator training may draw from, as plain data and tensors (weights_only):
    Python's random.getstate() is (version, tuple of 625 ints, gauss) and numpy's holds an ndarray."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)  # {"bit_generator", "state": {"key", "pos"}, "has_gauss", "gauss"}
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
    """Undo rng_state: every generator continues exactly where it was saved. The CUDA state is restored only
    on CUDA (a run saved on one device type and resumed on another restarts that generator's stream)."""
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    numpy_state = state["numpy"]
    np.random.set_state({
        "bit_generator": numpy_state["bit_generator"],
        "state": {"key": numpy_state["key"].cpu().numpy().astype(np.uint32), "pos": numpy_state["pos"]},
        "has_gauss": numpy_state["has_gauss"],
        "gauss": numpy_state["gauss"],
    })
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def vocabulary(meta):
    """What a model's token ids mean: the tokenizer, the vocabulary size and, for char, the characters."""
    return meta.get("tokenizer"), meta.get("vocab_size"), meta.get("chars")


def describe_vocabulary(meta):
    tokenizer, vocab_size, _ = vocabulary(meta)
    return f"a {tokenizer} vocabulary of {vocab_size} tokens"


def check_same_vocabulary(path, ckpt_meta, meta, dataset, action):
    """Refuse (CheckpointError) to `action` ("resume", "initialise from") a checkpoint on a dataset whose token
    ids mean something else."""
    if vocabulary(ckpt_meta) != vocabulary(meta):
        chars = " (same size, other characters)" if vocabulary(ckpt_meta)[:2] == vocabulary(meta)[:2] else ""
        raise CheckpointError(f"refusing to {action} {path}: it was trained on {describe_vocabulary(ckpt_meta)} and "
                              f"--dataset={dataset} has {describe_vocabulary(meta)}{chars}; use a dataset with the "
                              "checkpoint's vocabulary, or start a new run with another --out_dir")


def model_differences(saved, wanted, may_change):
    """The model settings (GPTConfig fields) of `wanted` that differ from the checkpoint's `saved` ones, those in
    may_change aside, as "--name=new but the checkpoint has old" for a one-line refusal; "" when none do."""
    differ = [name for name in wanted if name not in may_change and saved.get(name) != wanted[name]]
    return ", ".join(f"--{name}={wanted[name]} but the checkpoint has {saved.get(name)}" for name in differ)


def check_resumable(path, ckpt, train_config, model_config, meta):
    """Refuse (CheckpointError, one line) to continue a checkpoint with another vocabulary, position scheme or
    model shape: its weights would not fit, or would mean something else. Returns the training knobs and model
    knobs that changed, as "name old -> new" strings, for the log."""
    missing = [key for key in RESUME_KEYS if key not in ckpt]
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(missing)}: it can be sampled from but not resumed "
                              "(written by an older train.py?); start a new run with another --out_dir")
    check_meta(path, ckpt)
    check_same_vocabulary(path, ckpt["meta"], meta, train_config.dataset, "resume")
    saved, wanted = ckpt["model_config"], asdict(model_config)
    if changes := model_differences(saved, wanted, MODEL_KNOBS):
        raise CheckpointError(f"refusing to resume {path}: {changes}; pass the checkpoint's model settings "
                              "(only training settings such as max_iters or learning_rate may change), or start a "
                              "new run with another --out_dir")
    knobs = [(name, saved.get(name), wanted[name]) for name in MODEL_KNOBS]
    knobs += [(name, value, getattr(train_config, name)) for name, value in ckpt["train_config"].items()
              if name not in NOT_COMPARED and hasattr(train_config, name)]
    ignored = {"seed": " (ignored: the saved random and data streams continue)"}
    return [f"{name} {old} -> {new}{ignored.get(name, '')}" for name, old, new in knobs if old != new]


def open_for_resume(out_dir, train_config, model_config, meta, world_size):
    """(path, checkpoint, changes) of out_dir/ckpt.pt, loaded on train_config.device and checked by
    check_resumable; changes also names a change in the number of processes."""
    path = Path(out_dir) / "ckpt.pt"
    if not path.is_file():
        raise CheckpointError(f"--resume: {path} does not exist; start without --resume to train from scratch")
    ckpt = load_checkpoint(path, map_location=train_config.device)
    changes = check_resumable(path, ckpt, train_config, model_config, meta)
    if len(ckpt["rng"]) != world_size:
        changes.append(f"processes {len(ckpt['rng'])} -> {world_size}")
    return path, ckpt, changes


# -----------------------------------------------------------------------------
# A training run to and from its checkpoint (run: train.py's Run)


def training_state(run, rng):
    """The checkpoint dict described at the top of this file, of a training run; rng: every rank's rng_state."""
    p = run.progress
    return {
        "model": run.model.state_dict(),
        "model_config": asdict(run.model_config),
        "train_config": asdict(run.cfg),
        "iter_num": p.iter_num,
        "best_val_loss": p.best_val_loss,
        "best_iter": p.best_iter,
        "meta": run.meta,
        "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict(),
        "sampler": {"train": run.samplers[0].state_dict(), "eval": run.eval_sampler.state_dict()},
        "rng": rng,
        "wandb_run_id": p.wandb_run_id,
        "finished": p.iter_num >= run.cfg.max_iters,
    }


def write_checkpoints(run, improved):
    """ckpt.pt, and best.pt when the validation loss improved. Every rank calls it (their RNG states are gathered);
    rank 0 writes."""
    rng = run.procs.gather(rng_state(run.cfg.device))
    run.progress.saved_iter = run.progress.iter_num
    if not run.procs.master:
        return
    save_checkpoint(training_state(run, rng), run.ckpt_path)
    if improved:
        link_checkpoint(run.ckpt_path, run.best_path)


def run_finished(ckpt):
    """Whether a checkpoint's run completed its max_iters: False for one a signal, a crash or a NaN stopped, which
    --resume continues. Files written before the `finished` key are judged by their step."""
    if "finished" in ckpt:
        return bool(ckpt["finished"])
    max_iters = (ckpt.get("train_config") or {}).get("max_iters")
    return max_iters is not None and ckpt.get("iter_num", -1) >= max_iters


def kept_checkpoint(run):
    """What an error that stops training says of the checkpoint on disk."""
    if run.progress.saved_iter is None:
        return "no checkpoint was written"
    return f"{run.ckpt_path} (step {run.progress.saved_iter}) was kept"


def restore_training(run, path, ckpt):
    """Put a freshly built run where the checkpoint left it: weights, optimizer moments, loss scale, data streams,
    step, best loss, and (last, as building the model drew from them) the random generators of this rank."""
    load_weights(path, run.model, ckpt["model"])
    settings = [{k: v for k, v in group.items() if k != "params"} for group in run.optimizer.param_groups]
    load_weights(path, run.optimizer, ckpt["optimizer"])
    for group, fresh in zip(run.optimizer.param_groups, settings):
        group.update(fresh)  # keep the moments, take this run's betas and weight decay (and fused on this device)
    if ckpt["scaler"] and run.scaler.is_enabled():
        run.scaler.load_state_dict(ckpt["scaler"])
    for sampler in run.samplers:  # every micro-batch stream has drawn one batch per step: the same count
        sampler.load_state_dict(ckpt["sampler"]["train"])
    run.eval_sampler.load_state_dict(ckpt["sampler"]["eval"])
    p = run.progress
    p.iter_num, p.best_val_loss, p.best_iter = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["best_iter"]
    p.saved_iter, p.wandb_run_id = ckpt["iter_num"], ckpt["wandb_run_id"]
    if run.procs.rank < len(ckpt["rng"]):
        set_rng_state(ckpt["rng"][run.procs.rank], run.cfg.device)
    else:  # a rank the saved run did not have: a fresh stream of its own
        torch.manual_seed(run.cfg.seed + run.procs.rank + p.iter_num)


# -----------------------------------------------------------------------------
# Starting a new run from a checkpoint's weights (train.py --init_from): context extension by fine-tuning

# GPTConfig fields an --init_from run may change: every weight still fits (a learned table is resized)
INIT_KNOBS = ("block_size", "rope_scaling", "rope_factor", "rope_original_len", "rope_low_freq_factor",
              "rope_high_freq_factor", "dropout")
POSITION_TABLE = "transformer.wpe.weight"  # learned's (block_size, n_embd) table, GPT-2's name


def resize_position_table(table, n_pos):
    """A learned (T, C) position table resized to n_pos rows by linear interpolation, as vision transformers
    resize theirs for a new resolution (Dosovitskiy et al. 2021, section 3.2) and as position interpolation does
    for RoPE (Chen et al. 2023): new row p is the old table read at fractional position p * T / n_pos, linear
    between its two neighbouring rows (the last row past the end). Old row i lands exactly on new row
    i * n_pos / T when that is a whole number: every trained row is kept, spread out by the factor n_pos / T."""
    T = table.size(0)
    where = torch.arange(n_pos, dtype=torch.float64) * T / n_pos
    below = where.floor().long().clamp(max=T - 1)
    above = (below + 1).clamp(max=T - 1)
    weight = (where - below)[:, None]
    return ((1 - weight) * table[below].double() + weight * table[above].double()).to(table.dtype)


def saved_model_config(out_dir, names):
    """The model settings (those in names) of the checkpoint in out_dir: what an --init_from run defaults to."""
    saved = load_checkpoint(checkpoint_path(out_dir), mmap=True)["model_config"]
    return {name: value for name, value in saved.items() if name in names}


def fine_tune_dir(source, block_size, rope_scaling):
    """Where a run started from the checkpoint in folder `source` writes unless told: beside it, named after the
    new block_size and RoPE extension, e.g. out/shakespeare_char_rope_ctx256_yarn."""
    source = run_folder(source)
    return str(source.parent / f"{source.name}_ctx{block_size}_{rope_scaling or 'plain'}")


def init_from_settings(values, saved):
    """What a run started from a checkpoint (values["init_from"], whose model settings are saved) needs beyond
    its flags: rope_original_len, so that a new RoPE extension scales against the length the checkpoint was
    trained on, and an out_dir of its own beside the source when none was given. Never the source's folder."""
    source, settings = Path(values["init_from"]), {}
    if values["rope_scaling"] and not saved.get("rope_scaling") and values["rope_original_len"] is None:
        settings["rope_original_len"] = saved["block_size"]
    out_dir = values["out_dir"]
    if out_dir is None:
        out_dir = settings["out_dir"] = fine_tune_dir(source, values["block_size"], values["rope_scaling"])
    if Path(out_dir).resolve() == run_folder(source).resolve():
        raise ValueError(f"--init_from={source} and --out_dir are the same folder: a run started from a "
                         "checkpoint writes its own; give another --out_dir")
    return settings


def init_model_from(out_dir, model, meta, dataset):
    """Load the weights of the checkpoint in out_dir into model, whose config may differ from the checkpoint's
    only in INIT_KNOBS (else a one-line CheckpointError). -> a note for the log when a learned table was resized."""
    path = checkpoint_path(out_dir)
    ckpt = load_checkpoint(path, mmap=True)
    check_meta(path, ckpt)
    check_same_vocabulary(path, ckpt["meta"], meta, dataset, "initialise from")
    if changes := model_differences(ckpt["model_config"], asdict(model.config), INIT_KNOBS):
        raise CheckpointError(f"refusing to initialise from {path}: {changes}; --init_from may change only "
                              f"{', '.join(INIT_KNOBS)} (the weights must fit)")
    state, note = ckpt["model"], None
    if POSITION_TABLE in state and state[POSITION_TABLE].size(0) != model.config.block_size:
        old = state[POSITION_TABLE].size(0)
        state = state | {POSITION_TABLE: resize_position_table(state[POSITION_TABLE], model.config.block_size)}
        note = (f"the learned position table was resized from {old} to {model.config.block_size} rows by linear "
                "interpolation of the trained rows")
    load_weights(path, model, state)
    return note
