"""Checkpoints: written atomically, read with torch.load(weights_only=True) inside the one error boundary
(errors.reading), what they record read back into the dataclasses that hold it (GPTConfig, Progress: their
declared rules refuse a damaged value; docs/training.md), opened as a model (open_model). train.py writes
{out_dir}/ckpt.pt, the latest state, at every evaluation, and best.pt (a hard link to it) when the validation
loss improved."""

import dataclasses
import math
import os
import pickle
import shutil
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from model import GPT, GPTConfig, scheme_settings
from plumbing.errors import UserError, first_line, reading
from plumbing.fields import check_fields, require, setting
from plumbing.gpt2 import download_gpt2, gpt2_weights_from_hf
from plumbing.outputs import replace_atomically
from plumbing.tokenizers import get_tokenizer, vocabulary_of
from positions import LLAMA3_FACTORS, LONGROPE, LONGROPE_FIELDS, POSITION_MODULES, PositionScheme


# Writing: atomically, so that a crash never leaves a half-written checkpoint in place of a good one
def save_checkpoint(obj, path):
    def write(tmp):
        with open(tmp, "xb") as f:  # not tempfile.mkstemp, whose files are 0600 whatever the umask
            torch.save(obj, f)  # to a file object: a failed write's OSError (ENOSPC ...) is its __context__
            f.flush()
            os.fsync(f.fileno())

    return replace_atomically(path, write, needed=tensor_bytes(obj))


def tensor_bytes(obj):
    """The bytes of the tensors in obj (nested dicts and lists): about the size of its checkpoint file."""
    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(map(tensor_bytes, values))


def link_checkpoint(source, path):
    """Make path a hard link to source, atomically (a copy where the filesystem has no hard links); the next
    save_checkpoint(source) writes a new file and leaves this one alone."""

    def write(tmp):
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    return replace_atomically(path, write)


def remove_unfinished_writes(out_dir):
    """Delete the temporary files of interrupted checkpoint writes; returns how many."""
    leftovers = [p for name in ("ckpt.pt", "best.pt") for p in Path(out_dir).glob(f".{name}.*.tmp")]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


# Reading: weights_only (unpickling objects could run code), every failure one line (errors.reading)
RUN_ENTRIES = (
    "train_config",
    "iter_num",
    "best_val_loss",
    "best_iter",
    "optimizer",
    "scaler",
    "sampler",
    "rng",
    "wandb_run_id",
)  # what train.py records beyond sampling's model, model_config, meta; fmt: skip
OLDER_FILES_SAID = set()  # the older files current_model_config has named


@dataclass
class Progress:
    """What the training loop keeps across steps and across a resume; a checkpoint records it (recorded)."""

    iter_num: int = setting(0, at_least=0)  # optimizer steps taken
    best_val_loss: float = setting(
        math.inf, at_least=0
    )  # a cross-entropy; inf before any evaluation, NaN never
    best_iter: int | None = setting(None, at_least=0)  # the step of best_val_loss
    wandb_run_id: str | None = None  # the Weights & Biases run --resume continues
    saved_iter: int | None = setting(None, at_least=0)  # the step of the checkpoint on disk (ckpt.pt)
    evaluated_iter: int | None = setting(None, at_least=0)  # the step of the last whole evaluation

    def __post_init__(self):
        check_fields(self)

    @classmethod
    def recorded(cls, ckpt):
        """A checkpoint's progress, checked by the fields' rules; older files, without evaluated_iter, were
        evaluated when written."""
        step = ckpt["iter_num"]
        return cls(step, ckpt["best_val_loss"], ckpt["best_iter"], ckpt["wandb_run_id"], step,
                   ckpt.get("evaluated_iter", step))  # fmt: skip


def load_checkpoint(path, map_location="cpu", mmap=False):
    """The checkpoint dict at path, its model_config in today's form (current_model_config): a missing file,
    one of another model (no model_config) or any failure to read it a UserError naming the path; mmap=True
    reads a tensor from disk only when used."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {'a folder, not a' if path.is_dir() else 'no such'} checkpoint file")
    with reading(path, "checkpoint"):
        mmap = mmap and zipfile.is_zipfile(path)  # torch maps only its zip format
        try:
            with warnings.catch_warnings(action="ignore"):  # "Detected pickle protocol 4": the error says it
                ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
        except pickle.UnpicklingError as e:  # a global weights_only refused, or an opcode it does not run
            raise pickle.UnpicklingError(refusal(e)) from None
        if not isinstance(ckpt, dict) or "model_config" not in ckpt:  # GPT-2's state dict, nanoGPT's ...
            raise UserError(f"{path}: not a posgpt checkpoint (no model_config entry)")
        if isinstance(ckpt["model_config"], dict):
            ckpt["model_config"] = current_model_config(ckpt["model_config"], path)
        return ckpt


def refusal(error):
    """torch's reason for refusing a pickle, without its advice to load the file with weights_only=False:
    "Unsupported global: GLOBAL x.Payload was not an allowed global by default.", "Trying to load unsupported
    GLOBAL posix.system whose module posix is blocked.", "Unsupported operand 149"."""
    lines = [line.split("WeightsUnpickler error:")[-1].strip() for line in str(error).splitlines()]
    advice = ("Weights only load failed", "Check the documentation")
    reasons = [line for line in lines if line and "weights_only" not in line and not line.startswith(advice)]
    return reasons[0].split(" Please use")[0] if reasons else "refused by torch.load(weights_only=True)"


def read_back(cls, recorded):
    """The dataclass cls from the dict asdict recorded it as: a field missing a KeyError, one cls has not a
    TypeError, a value its rules refuse a ValueError (errors.reading words each)."""
    return cls(**{f.name: recorded[f.name] for f in dataclasses.fields(cls)} | recorded)


def open_checkpoint(path, map_location="cpu", mmap=False, vocabulary=True):
    """load_checkpoint, what it records read back and checked by the rules of the dataclasses that hold it
    (GPTConfig; Progress, where it has one; its meta's vocabulary, the model's), any failure a UserError
    naming the path: the one way an entry point opens a checkpoint. vocabulary=False: meta unread (to read
    model_config)."""
    ckpt = load_checkpoint(path, map_location, mmap)
    with reading(path, "checkpoint"):
        model_config = read_back(GPTConfig, ckpt["model_config"])
        require(
            isinstance(ckpt["model"], dict), f"model is a {type(ckpt['model']).__name__}, not a state dict"
        )
        older = str(path) in OLDER_FILES_SAID  # the first format lacks some of RUN_ENTRIES: sampled only
        if "iter_num" in ckpt and (not older or all(key in ckpt for key in RUN_ENTRIES)):  # a run's record
            Progress.recorded(ckpt)
            run_finished(ckpt)
        if vocabulary:
            vocab_size = vocabulary_of(ckpt["meta"])[1]
            require(vocab_size == model_config.vocab_size,
                    f"its meta has {vocab_size} tokens but its model {model_config.vocab_size}")  # fmt: skip
    return ckpt


def current_model_config(model_config, path=None):
    """A checkpoint's model_config in today's form, asdict(GPTConfig): an older one's settings, side by side
    with the GPT's fields, nested under pos_settings, another scheme's (at their defaults: RoPE's were in
    every file) dropped; a setting it lacks (it predates it) at its default, which builds the model the code
    that wrote it built; said once for each file `path`. Anything else is left for GPTConfig to judge."""
    gpt, others = [f.name for f in dataclasses.fields(GPTConfig)], scheme_settings()
    pos = model_config.get("pos", GPTConfig.pos)
    scheme = POSITION_MODULES.get(pos, PositionScheme) if isinstance(pos, str) else PositionScheme
    settings = model_config.get("pos_settings", {})
    if not isinstance(settings, dict):
        return model_config
    own = {f.name: f for f in dataclasses.fields(scheme.Settings)}
    flat = {name: value for name, value in model_config.items() if name not in gpt}
    foreign = {name for name, value in flat.items() if name in others and name not in own and
               others[name][1].default == value}  # fmt: skip
    settings = {name: value for name, value in flat.items() if name in own} | settings
    missing = [name for name in own if name not in settings]
    if missing and path is not None and str(path) not in OLDER_FILES_SAID:
        OLDER_FILES_SAID.add(str(path))
        print(
            f"note: {path} is from an older version of posgpt, before {some(missing)}: those settings take "
            "the values that version built with",
            file=sys.stderr,
        )
    kept = {name: value for name, value in model_config.items() if name not in own and name not in foreign}
    return kept | {"pos_settings": settings | {name: own[name].default for name in missing}}


def check_same_vocabulary(path, ckpt_meta, meta, dataset, action):
    """Refuse to `action` ("resume", "initialise from") a checkpoint on a dataset of other token ids."""
    saved, given = vocabulary_of(ckpt_meta), vocabulary_of(meta)
    if saved != given:
        chars = " (same size, other characters)" if saved[:2] == given[:2] else ""
        trained, has = (f"a {tokenizer} vocabulary of {size} tokens" for tokenizer, size, _ in (saved, given))
        raise UserError(
            f"refusing to {action} {path}: it was trained on {trained} and --dataset={dataset} has "
            f"{has}{chars}; use a dataset with the checkpoint's vocabulary, or start a new run with another "
            "--out_dir"
        )


def run_finished(ckpt):
    """Whether a checkpoint's run completed its max_iters (older files, without `finished`: by their step)."""
    if "finished" in ckpt:
        return bool(ckpt["finished"])
    max_iters = (ckpt.get("train_config") or {}).get("max_iters")
    return max_iters is not None and ckpt.get("iter_num", -1) >= max_iters


# Opening a run's model
def checkpoint_path(out_dir):
    """out_dir's best.pt, else its ckpt.pt; a checkpoint file given instead of its folder is that file."""
    out_dir, best = Path(out_dir), Path(out_dir) / "best.pt"
    return out_dir if out_dir.is_file() else best if best.is_file() else out_dir / "ckpt.pt"


def run_folder(path):
    """The folder of a run given as its folder or as one of its checkpoint files."""
    return Path(path).parent if Path(path).is_file() else Path(path)


def some(names):
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def load_weights(path, module, state_dict):
    """module.load_state_dict, a mismatch a UserError naming the tensors that do not fit (a model's: missing,
    unexpected, mis-shaped, or not floating-point, which load_state_dict would cast without a word); a model's
    weights then checked finite where they live, on the device."""
    model = isinstance(module, torch.nn.Module)
    detail = model and weights_misfit(module.state_dict(), state_dict)
    try:
        if not detail:
            module.load_state_dict(state_dict)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        detail = first_line(e)
    if detail:
        raise UserError(f"{path}: its {type(module).__name__} state does not fit ({detail})") from None
    tensors = module.state_dict().items() if model else {}
    if bad := [name for name, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]:
        raise UserError(
            f"{path}: weights that are not finite (NaN or inf) in {some(bad)}: a model that diverged "
            "or a damaged file; use another checkpoint"
        )


def weights_misfit(expected, state_dict):
    """How a model's state dict departs from the `expected` one (names, shapes, floats), or ""."""
    if not isinstance(state_dict, dict):
        return f"a {type(state_dict).__name__} where a state dict of tensors belongs"
    tensor = lambda v: v if isinstance(v, torch.Tensor) else torch.empty(0, dtype=torch.int8)
    kinds = {
        "missing": [n for n in expected if n not in state_dict],
        "unexpected": [n for n in state_dict if n not in expected],
        "mis-shaped": [
            f"{n} {tuple(tensor(v).shape)} where the model has {tuple(expected[n].shape)}"
            for n, v in state_dict.items()
            if n in expected and tensor(v).shape != expected[n].shape
        ],
        "not floating-point": [
            f"{n} ({str(getattr(v, 'dtype', type(v).__name__)).removeprefix('torch.')})"
            for n, v in state_dict.items()
            if n in expected and expected[n].is_floating_point() and not tensor(v).is_floating_point()
        ],
    }
    return "; ".join(f"{what} {some(names)}" for what, names in kinds.items() if names)


def build_model(path, ckpt, **overrides):
    """The GPT of a loaded checkpoint, settings overridden (e.g. rope_scaling); one refused a UserError."""
    try:
        model = GPT(GPTConfig.from_flat(**(GPTConfig(**ckpt["model_config"]).flat() | overrides)))
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    load_weights(path, model, ckpt["model"])
    return model


def pretrained_checkpoint(name, flag="--init_from"):
    """OpenAI's GPT-2 weights (through the optional transformers) as a checkpoint's three entries; a failure
    names the flag that asked for them."""
    try:
        config, state_dict = gpt2_weights_from_hf(download_gpt2(name))
    except (ImportError, OSError, RuntimeError) as e:
        raise UserError(f"{flag}={name}: {first_line(e)}") from None
    meta = {"tokenizer": "gpt2", "vocab_size": config.vocab_size}
    return {"model": state_dict, "model_config": dataclasses.asdict(config), "meta": meta}


def open_model(
    source, device="cpu", ckpt=None, rope_scaling=None, rope_factor=None, llama3_factors=(), longrope=None
):
    """(model in eval mode on device, tokenizer, checkpoint dict) of `source` (checkpoint_path), or of `ckpt`
    already loaded, with RoPE extension rope_scaling at rope_factor; llama3_factors: (low, high), None keeping
    the checkpoint's; longrope: settings by name over the rest (a factors file's, read by RoPE's Settings)."""
    path = checkpoint_path(source)
    ckpt = ckpt or open_checkpoint(path, mmap=True)
    scaling = rope_overrides(rope_scaling, rope_factor, llama3_factors, longrope)
    model = build_model(path, ckpt, **scaling).to(device).eval()
    return model, get_tokenizer(ckpt["meta"]), ckpt


def check_settings(**values):
    """Settings given by name (None: not given, left out) checked by their schemes' Settings, whose rules
    they are: a one-line ValueError as a model with them would give. -> {scheme: its Settings of them}"""
    by_scheme, known = {}, scheme_settings()
    for name, value in values.items():
        if value is not None:
            by_scheme.setdefault(known[name][0], {})[name] = value
    return {scheme: POSITION_MODULES[scheme].Settings(**settings) for scheme, settings in by_scheme.items()}


def rope_overrides(rope_scaling=None, rope_factor=None, llama3_factors=(), longrope=None):
    """The settings open_model's RoPE extension (its arguments) sets over a checkpoint's, by name."""
    scaling, default = {}, lambda name: scheme_settings()[name][1].default
    if rope_scaling is not None:
        scaling = dict(rope_scaling=rope_scaling, rope_factor=rope_factor)
        if rope_scaling != "llama3":  # llama3's frequency factors mean nothing to another method
            scaling |= {name: default(name) for name in LLAMA3_FACTORS}
        if rope_scaling != LONGROPE:  # nor LongRoPE's factors
            scaling |= {name: default(name) for name in LONGROPE_FIELDS}
    scaling |= {name: value for name, value in zip(LLAMA3_FACTORS, llama3_factors) if value is not None}
    return scaling | (longrope or {})
