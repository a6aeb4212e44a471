"""Checkpoints: written atomically, read with torch.load(weights_only=True), checked against SCHEMA (tensors
and plain data; docs/training.md), opened as a model (open_model). train.py writes {out_dir}/ckpt.pt, the
latest state, at every evaluation, and best.pt (a hard link to it) when the validation loss improved."""

import dataclasses
import io
import os
import pickle
import pickletools
import re
import shutil
import sys
import typing
import warnings
import zipfile
from collections import namedtuple
from contextlib import suppress
from pathlib import Path

import torch

from model import GPT, GPTConfig, scheme_settings
from plumbing.errors import UserError
from plumbing.gpt2 import download_gpt2, gpt2_weights_from_hf
from plumbing.outputs import replace_atomically
from plumbing.tokenizers import get_tokenizer, vocabulary_error
from positions import LLAMA3_FACTORS, LONGROPE, LONGROPE_FIELDS, POSITION_MODULES, PositionScheme

VOCABULARY = ("tokenizer", "vocab_size", "chars")  # what meta says token ids mean (chars: char's characters)
# What a train.py checkpoint pickles besides plain data: torch's tensor rebuilders and storages, OrderedDict
SAFE_GLOBAL = re.compile(r"torch\._utils\._rebuild_\w+|torch\.\w+Storage|collections\.OrderedDict")


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


# Reading: weights_only, every failure one line
def load_checkpoint(path, map_location="cpu", mmap=False):
    """The checkpoint dict at path (weights_only: unpickling objects could run code), every failure a
    UserError naming the path; mmap=True reads a tensor from disk only when used."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {'a folder, not a' if path.is_dir() else 'no such'} checkpoint file")
    try:
        mmap = mmap and zipfile.is_zipfile(path)  # torch maps only its zip format
        with warnings.catch_warnings(action="ignore"):  # "Detected pickle protocol 4": the error says it
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError ... for a damaged file
        if isinstance(e, pickle.UnpicklingError) and (refused := refused_globals(path, e)):
            raise UserError(
                f"{path}: refused to load: it pickles {refused}, code that unpickling would import and could "
                "run; a posgpt checkpoint holds only tensors and plain data, so this file was not written by "
                "train.py or was altered: do not load it"
            ) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # e.g. "Unsupported operand 110"
        cause = detail.group(1) if detail else f"{type(e).__name__}: {first_line(e)}"
        raise UserError(f"{path}: truncated or corrupt checkpoint ({cause})") from None
    if missing := [key for key in ("model", "model_config") if not (isinstance(ckpt, dict) and key in ckpt)]:
        raise UserError(f"{path}: not a posgpt checkpoint (no {' or '.join(missing)} entry)")
    if isinstance(ckpt["model_config"], dict):
        ckpt["model_config"] = current_model_config(ckpt["model_config"], path)
    return ckpt


def open_checkpoint(path, map_location="cpu", mmap=False, vocabulary=True):
    """load_checkpoint, then a UserError naming the first entry that departs from SCHEMA, or a meta that
    cannot say what its token ids mean: the one way an entry point opens a checkpoint. vocabulary=False:
    meta's vocabulary unchecked (to read model_config)."""
    ckpt = load_checkpoint(path, map_location, mmap)
    error = schema_error(ckpt, {key: SCHEMA[key] for key in SCHEMA if key in ckpt}, "")
    if error := error or model_config_error(ckpt["model_config"]):
        raise UserError(
            f"{path}: damaged checkpoint ({error}): train.py writes none like it; use another one"
        )
    if not vocabulary:
        return ckpt
    meta = ckpt.get("meta")
    if meta is None:  # SCHEMA checked one there is: a dict
        raise UserError(
            f"{path}: no meta entry (the tokenizer and vocabulary its token ids belong to): it can be "
            "neither sampled from nor trained on; train.py writes one into every checkpoint"
        )
    if why := vocabulary_error(meta):
        raise UserError(f"{path}: its meta's vocabulary is not usable: {why}")
    if (model_vocab := ckpt["model_config"]["vocab_size"]) != meta["vocab_size"]:  # both checked: ints
        raise UserError(f"{path}: its meta has {meta['vocab_size']} tokens but its model {model_vocab}")
    return ckpt


def refused_globals(path, error):
    """The 'module.name's a file pickles that weights_only refused ('' if none): from torch's message, else
    (torch stopped earlier, e.g. at protocol 4's FRAME) from the opcodes, which pickletools decodes without
    running anything (zip format: its data.pkl). A STACK_GLOBAL's names: the two strings pushed before it."""
    if named := re.findall(r"GLOBAL ([\w.]+)", str(error)):
        return ", ".join(dict.fromkeys(named))
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            data = b"".join(z.read(name) for name in z.namelist() if name.endswith("data.pkl"))
    else:
        data = Path(path).read_bytes()
    stream, strings = io.BytesIO(data), []
    with suppress(Exception):  # a damaged stream: what was read so far
        while stream.tell() < len(data):
            for op, arg, _ in pickletools.genops(stream):
                if op.name == "GLOBAL":
                    named.append(arg.replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    named.append(".".join(strings[-2:]))
                if isinstance(arg, str):
                    strings.append(arg)
    return ", ".join(dict.fromkeys(name for name in named if not SAFE_GLOBAL.fullmatch(name)))


def first_line(error):
    return (str(error).strip().splitlines() or ["no details"])[0]


# The schema: what each entry holds, checked when a file is opened (its weights' values: load_weights)
NONE = type(None)
Check = namedtuple("Check", "what fits")  # a spec no type says: `what` a value must be, and a test of one
tensor_of = lambda what, shape, dtype: Check(
    what, lambda t: isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype
)
# weights and AdamW's moments: a tensor of integers or complex numbers would be cast without a word
FLOATS = Check("a Tensor of floats", lambda t: isinstance(t, torch.Tensor) and t.is_floating_point())
STEP = Check("an int >= 0", lambda v: type(v) is int and v >= 0)  # a step count (not a bool)
STEP_OR_NONE = Check("an int >= 0 or None", lambda v: v is None or STEP.fits(v))
# a cross-entropy; inf before the first evaluation, NaN never (no loss would be below it: best.pt frozen)
LOSS = Check("a loss >= 0 (inf before any evaluation)", lambda v: type(v) in (int, float) and v >= 0)
SAMPLER = {"seed": int, "train_batches": int, "val_batches": int}  # data.common.BatchSampler.state_dict
RNG = {  # plumbing.resume.rng_state
    "python": Check("[version, 625 ints, gauss]", lambda v: isinstance(v, (list, tuple)) and len(v) == 3 and
        isinstance(v[1], (list, tuple)) and len(v[1]) == 625 and all(type(x) is int for x in [v[0], *v[1]])),
    "numpy": {"bit_generator": str, "key": tensor_of("624 int64s", (624,), torch.int64), "pos": int,
              "has_gauss": int, "gauss": (float, int)},
    "torch": tensor_of("torch's generator state", torch.get_rng_state().shape, torch.uint8),
    "cuda": Check("a Tensor of uint8 or None", lambda v: v is None or
                  isinstance(v, torch.Tensor) and v.dtype == torch.uint8),
}  # fmt: skip
OLDER_FILES_SAID = set()  # the older files current_model_config has named


def type_spec(hint):  # a field's annotation as a spec: int | None -> (int, None); list[float] -> list
    return tuple(typing.get_origin(t) or t for t in typing.get_args(hint)) or typing.get_origin(hint) or hint


# asdict(GPTConfig): each field as GPTConfig types it, the scheme's settings a dict (model_config_error)
MODEL_CONFIG = {name: type_spec(hint) for name, hint in typing.get_type_hints(GPTConfig).items()}
MODEL_CONFIG["pos_settings"] = dict
SCHEMA = {
    "model": {str: FLOATS},  # the uncompiled GPT's state_dict; {str: spec}: any keys, each value a spec
    "model_config": MODEL_CONFIG,  # (load_checkpoint makes an older one today's: current_model_config)
    "meta": dict,  # the dataset's tokenizer and vocabulary (open_checkpoint): sampling needs no other file
    # asdict(TrainConfig) as run (device etc. resolved): plain values; max_iters and dataset, read, typed
    "train_config": {str: (str, int, float, bool, NONE), "max_iters": int, "dataset": str},
    "iter_num": STEP,  # steps taken, the best validation loss so far and its step
    "best_val_loss": LOSS,
    "best_iter": STEP_OR_NONE,
    "optimizer": {"state": {str: {str: FLOATS}}, "param_groups": list},  # AdamW's state_dict (step: a float)
    "scaler": dict,  # the float16 GradScaler's state_dict ({} unless float16)
    "sampler": {"train": SAMPLER, "eval": SAMPLER},  # batches drawn per split
    "rng": [RNG],  # one per rank
    "wandb_run_id": (str, NONE),  # the Weights & Biases run --resume continues
    "finished": bool,  # whether the run had completed its max_iters (older files: run_finished)
    "evaluated_iter": STEP_OR_NONE,  # the step of its last whole evaluation (older files: iter_num)
}


def shown(value):
    text = repr(value) if isinstance(value, (str, int, float, bool, NONE)) else a_type(type(value))
    if isinstance(value, torch.Tensor):
        text += f" of {str(value.dtype).removeprefix('torch.')}"
    return text if len(text) <= 40 else text[:37] + "..."


def a_type(kind):
    return "None" if kind is NONE else f"{'an' if kind.__name__[0] in 'aeiou' else 'a'} {kind.__name__}"


def schema_error(value, spec, name):
    """How value departs from spec ('name is ..., not ...'), or None. spec: a type or tuple of types (an int
    is a float, a bool no int); {key: spec}, a dict with those keys ({str: spec, ...}: any keys, each a spec,
    those named their own); [spec], a non-empty list of them; a Check."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{name} is {shown(value)}, not a dict"
        spec = {key: spec.get(key, spec[str]) for key in value} if str in spec else spec
        if missing := [key for key in spec if key not in value]:
            return f"{name} has no {', '.join(missing)}"
        inner = ((value[k], s, f"{name}.{k}" if name else k) for k, s in spec.items())
        return next((e for v, s, n in inner if (e := schema_error(v, s, n))), None)
    if isinstance(spec, list):
        if not isinstance(value, (list, tuple)) or not value:
            return f"{name} is {shown(value)}, not a non-empty list"
        return next((e for i, v in enumerate(value) if (e := schema_error(v, spec[0], f"{name}[{i}]"))), None)
    if isinstance(spec, Check):
        return None if spec.fits(value) else f"{name} is {shown(value)}, not {spec.what}"
    types = spec if isinstance(spec, tuple) else (spec,)
    fits = isinstance(value, types) and (bool in types or not isinstance(value, bool))
    if fits or float in types and type(value) is int:
        return None
    return f"{name} is {shown(value)}, not {' or '.join(map(a_type, types))}"


def model_config_error(model_config):
    """Fields of model_config GPTConfig has not, settings its scheme has not or of the wrong type, or what
    their checks refuse (SCHEMA typed the fields), or None."""
    if unknown := [name for name in model_config if name not in MODEL_CONFIG]:
        return f"model_config has unknown fields {', '.join(map(str, unknown))}"
    pos, settings = model_config["pos"], model_config["pos_settings"]
    if scheme := POSITION_MODULES.get(pos):
        specs = {name: type_spec(hint) for name, hint in typing.get_type_hints(scheme.Settings).items()}
        if unknown := [name for name in settings if name not in specs]:
            return f"model_config.pos_settings has {', '.join(map(str, unknown))}, no setting of pos={pos}"
        if error := schema_error(settings, specs, "model_config.pos_settings"):
            return error
    try:
        GPTConfig(**model_config)
    except ValueError as e:
        return f"model_config: {e}"
    return None


def current_model_config(model_config, path=None):
    """A checkpoint's model_config in today's form, asdict(GPTConfig): an older one's settings, side by side
    with the GPT's fields, nested under pos_settings, another scheme's (at their defaults: RoPE's were in
    every file) dropped; a setting it lacks (it predates it) at its default, which builds the model the code
    that wrote it built; said once for each file `path`. Anything else is left for model_config_error."""
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
    saved, given = ([m.get(key) for key in VOCABULARY] for m in (ckpt_meta, meta))
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
    """module.load_state_dict, a mismatch a UserError naming the tensors that do not fit; a model's weights
    then checked finite where they live, on the device."""
    model = isinstance(module, torch.nn.Module)
    try:
        module.load_state_dict(state_dict)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        detail = ""
        if model and not isinstance(state_dict, dict):
            detail = f"a {type(state_dict).__name__} where a state dict of tensors belongs"
        elif model:
            expected = module.state_dict()
            kinds = {
                "missing": [n for n in expected if n not in state_dict],
                "unexpected": [n for n in state_dict if n not in expected],
                "mis-shaped": [
                    f"{n} {tuple(getattr(v, 'shape', ()))} where the model has {tuple(expected[n].shape)}"
                    for n, v in state_dict.items()
                    if n in expected and getattr(v, "shape", None) != expected[n].shape
                ],
            }
            detail = "; ".join(f"{what} {some(names)}" for what, names in kinds.items() if names)
        raise UserError(
            f"{path}: its {type(module).__name__} state does not fit ({detail or first_line(e)})"
        ) from None
    tensors = module.state_dict().items() if model else {}
    if bad := [name for name, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]:
        raise UserError(
            f"{path}: weights that are not finite (NaN or inf) in {some(bad)}: a model that diverged "
            "or a damaged file; use another checkpoint"
        )


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
    the checkpoint's; longrope: a --rope_factors file's settings (cli.read_rope_factors), over the rest."""
    path = checkpoint_path(source)
    ckpt = ckpt or open_checkpoint(path, mmap=True)
    scaling = rope_overrides(rope_scaling, rope_factor, llama3_factors, longrope)
    model = build_model(path, ckpt, **scaling).to(device).eval()
    return model, get_tokenizer(ckpt["meta"]), ckpt


def check_settings(**values):
    """Settings given by name (None: not given, left out) checked by their schemes' Settings, whose rules
    they are: a one-line ValueError as a model with them would give."""
    by_scheme, known = {}, scheme_settings()
    for name, value in values.items():
        if value is not None:
            by_scheme.setdefault(known[name][0], {})[name] = value
    for scheme, settings in by_scheme.items():
        POSITION_MODULES[scheme].Settings(**settings)


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
