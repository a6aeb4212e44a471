"""
Checkpoints: written atomically, read safely, opened as a model (open_model). Resuming: plumbing/resume.py.

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
import re
import shutil
import uuid
import warnings
import zipfile
from contextlib import suppress
from dataclasses import asdict
from pathlib import Path

import torch

from data.common import TOKENIZERS, get_tokenizer
from model import GPT, GPTConfig, download_gpt2, gpt2_weights_from_hf
from plumbing.errors import UserError
from positions import ROPE_VARIANTS

SAMPLING_KEYS = ("model", "model_config", "meta")
LLAMA3_FACTORS = ("rope_low_freq_factor", "rope_high_freq_factor")  # GPTConfig's fields for llama3's blend
# What a checkpoint train.py wrote pickles besides plain data: torch's tensor rebuilders and storages, OrderedDict
SAFE_GLOBAL = re.compile(r"torch\._utils _rebuild_\w+|torch \w+Storage|collections OrderedDict")


# -----------------------------------------------------------------------------
# Writing: atomically, so that a crash never leaves a half-written checkpoint in place of a good one


def temporary_path(path):
    # hidden and unique (two writers never share one); remove_unfinished_writes finds those a kill -9 left behind
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def sync_directory(folder):
    """fsync a folder, so that a rename in it survives a power cut (POSIX; elsewhere os.replace is all we
    have)."""
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
    GPT-2-sized file) under a temporary name, then the rename. The next save_checkpoint(source) writes a new
    file and leaves this one alone. Copies where the filesystem has no hard links."""

    def write(tmp):
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    return replace_atomically(path, write)


def remove_unfinished_writes(out_dir):
    """Delete the temporary files of checkpoint writes that a crash or kill -9 interrupted; returns how
    many."""
    leftovers = [p for name in ("ckpt.pt", "best.pt") for p in Path(out_dir).glob(f".{name}.*.tmp")]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


# -----------------------------------------------------------------------------
# Reading: weights_only, every failure one line


def load_checkpoint(path, map_location="cpu", mmap=False):
    """The checkpoint dict at path, read with weights_only=True: unpickling arbitrary objects can run
    arbitrary code, so a file that needs it is refused. Every failure is a UserError naming the path and the
    cause. mmap=True maps the file instead of reading it, so a tensor is read from disk only when used: what
    reads a config, or the weights without the optimizer state (2/3 of a training checkpoint), should pass
    it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint file")
    try:
        # torch maps only its zip format: another file (an older format) is read whole, as before
        mmap = mmap and zipfile.is_zipfile(path)
        with (
            warnings.catch_warnings()
        ):  # e.g. "Detected pickle protocol 4": the error, if any, says it in one line
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        if refused := refused_globals(path, e):  # a class or function: loading it would import and run code
            raise UserError(
                f"{path}: refused to load: it pickles {refused}, code that unpickling would import and could run; a "
                "posgpt checkpoint holds only tensors and plain data, so this file was not written by train.py or "
                "was altered: do not load it"
            ) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # e.g. "Unsupported operand 110"
        cause = detail.group(1) if detail else first_line(e)
        raise UserError(f"{path}: truncated or corrupt checkpoint ({cause})") from None
    except Exception as e:  # torch.load raises RuntimeError, EOFError, KeyError ... for a damaged file
        raise UserError(
            f"{path}: truncated or corrupt checkpoint ({type(e).__name__}: {first_line(e)})"
        ) from None
    missing = [key for key in ("model", "model_config") if not (isinstance(ckpt, dict) and key in ckpt)]
    if missing:
        raise UserError(f"{path}: not a posgpt checkpoint (no {' or '.join(missing)} entry)")
    if isinstance(ckpt["model_config"], dict):
        ckpt["model_config"] = with_rope_variants(ckpt["model_config"])
    return ckpt


def with_rope_variants(model_config):
    """A checkpoint's model_config with the RoPE variants' GPTConfig fields its file predates
    (positions.ROPE_VARIANTS) at plain RoPE's values, the model its code built: so that resuming or --init_from
    compares like with like instead of refusing a missing field (None) against its default."""
    return model_config | {name: plain for name, plain in ROPE_VARIANTS.items() if name not in model_config}


def first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no details"


def refused_globals(path, error):
    """The classes and functions a file pickles that weights_only refused, as 'module.name' ('' if none): from
    torch's message ("GLOBAL posix.system"), else (torch stopped earlier, at an opcode it does not know) from
    the pickle's own opcodes, read with pickletools, which decodes them without running anything."""
    named = re.findall(r"GLOBAL ([\w.]+)", str(error))
    if not named:
        named = [name.replace(" ", ".") for name in pickled_globals(path) if not SAFE_GLOBAL.fullmatch(name)]
    return ", ".join(dict.fromkeys(named))


def pickled_globals(path):
    """Every 'module name' a pickle file references (torch's zip format: its data.pkl; an older one: the
    pickles one after another). A STACK_GLOBAL's names are the two strings pushed just before it."""
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
    """The best checkpoint train.py kept in out_dir (best.pt), else its latest (ckpt.pt); a checkpoint file
    given instead of its folder is that file."""
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
        raise UserError(
            f"{path}: no meta entry (the tokenizer and vocabulary its token ids belong to): it "
            "can be neither sampled from nor trained on; train.py writes one into every checkpoint"
        )
    tokenizer, vocab_size, chars = vocabulary(meta)
    if tokenizer not in TOKENIZERS or not isinstance(vocab_size, int) or vocab_size < 1:
        raise UserError(
            f"{path}: its meta names no vocabulary (tokenizer {tokenizer!r}, vocab_size "
            f"{vocab_size!r}; expected one of {', '.join(TOKENIZERS)} and a positive size)"
        )
    if tokenizer == "char" and not (
        isinstance(chars, (list, str))
        and len(chars) == vocab_size
        and all(isinstance(c, str) and len(c) == 1 for c in chars)
    ):
        raise UserError(
            f"{path}: its meta has no vocabulary: a char tokenizer needs chars, the "
            f"{vocab_size} characters its token ids stand for"
        )
    model_vocab = ckpt["model_config"].get("vocab_size") if isinstance(ckpt["model_config"], dict) else None
    if model_vocab is not None and model_vocab != vocab_size:
        raise UserError(f"{path}: its meta has {vocab_size} tokens but its model {model_vocab}")


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
    shapes = [
        f"{name} {tuple(getattr(value, 'shape', ()))} where the model has {tuple(expected[name].shape)}"
        for name, value in state_dict.items()
        if name in expected and getattr(value, "shape", None) != expected[name].shape
    ]
    parts = [
        f"{what} {some(names)}"
        for what, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", shapes))
        if names
    ]
    return "; ".join(parts)


def load_weights(path, module, state_dict):
    """module.load_state_dict, its multi-line mismatch report turned into a one-line UserError that names
    the tensors that do not fit."""
    try:
        module.load_state_dict(state_dict)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        detail = mismatched_tensors(module, state_dict) if isinstance(module, torch.nn.Module) else ""
        raise UserError(
            f"{path}: its {type(module).__name__} state does not fit ({detail or first_line(e)})"
        ) from None


def build_model(path, ckpt, **overrides):
    """The GPT saved in a loaded checkpoint, with model settings overridden (e.g. rope_scaling) on the way:
    a setting the model refuses (rope_scaling on an ALiBi model) is a one-line UserError."""
    try:
        model = GPT(GPTConfig(**(ckpt["model_config"] | overrides)))
    except (TypeError, ValueError) as e:
        raise UserError(f"{path}: {e}") from None
    load_weights(path, model, ckpt["model"])
    return model


def pretrained_checkpoint(name):
    """OpenAI's GPT-2 weights (through the optional transformers package) as the part of a checkpoint dict
    that sampling reads: model, model_config and meta (GPT-2's BPE). No GPT is built here: open_model builds
    the one."""
    try:
        config, state_dict = gpt2_weights_from_hf(download_gpt2(name))
    except (ImportError, OSError, RuntimeError) as e:
        raise UserError(f"--init_from={name}: {first_line(e)}") from None
    return {
        "model": state_dict,
        "model_config": asdict(config),
        "meta": {"tokenizer": "gpt2", "vocab_size": config.vocab_size},
    }


def open_model(
    source, device="cpu", ckpt=None, rope_scaling=None, rope_factor=None, llama3_factors=(None, None)
):
    """(model in eval mode on device, tokenizer or None without a meta, checkpoint dict) of the checkpoint
    train.py kept in `source` (a run's folder: best.pt, else ckpt.pt; or a checkpoint file), or of `ckpt`,
    that checkpoint already loaded (or pretrained_checkpoint's). With rope_scaling, that RoPE extension at
    rope_factor; llama3_factors: llama3's (low, high) frequency factors, None keeping the checkpoint's
    (another method resets them to plain RoPE's). Without, the model as trained. How sample.py, eval_length.py
    and the demos open a checkpoint."""
    path = checkpoint_path(source)
    ckpt = ckpt or load_checkpoint(path, mmap=True)  # the weights only: moved to device with the model
    if "meta" in ckpt:
        check_meta(path, ckpt)
    scaling = {}
    if rope_scaling is not None:
        scaling = dict(rope_scaling=rope_scaling, rope_factor=rope_factor)
        if rope_scaling != "llama3":  # llama3's frequency factors mean nothing to another method
            scaling |= {name: ROPE_VARIANTS[name] for name in LLAMA3_FACTORS}
    scaling |= {name: value for name, value in zip(LLAMA3_FACTORS, llama3_factors) if value is not None}
    model = build_model(path, ckpt, **scaling).to(device).eval()
    return model, get_tokenizer(ckpt["meta"]) if "meta" in ckpt else None, ckpt


def vocabulary(meta):
    """What a model's token ids mean: the tokenizer, the vocabulary size and, for char, the characters."""
    return meta.get("tokenizer"), meta.get("vocab_size"), meta.get("chars")


def describe_vocabulary(meta):
    tokenizer, vocab_size, _ = vocabulary(meta)
    return f"a {tokenizer} vocabulary of {vocab_size} tokens"


def check_same_vocabulary(path, ckpt_meta, meta, dataset, action):
    """Refuse (UserError) to `action` ("resume", "initialise from") a checkpoint on a dataset whose token
    ids mean something else."""
    if vocabulary(ckpt_meta) != vocabulary(meta):
        chars = " (same size, other characters)" if vocabulary(ckpt_meta)[:2] == vocabulary(meta)[:2] else ""
        raise UserError(
            f"refusing to {action} {path}: it was trained on {describe_vocabulary(ckpt_meta)} and "
            f"--dataset={dataset} has {describe_vocabulary(meta)}{chars}; use a dataset with the "
            "checkpoint's vocabulary, or start a new run with another --out_dir"
        )


def run_finished(ckpt):
    """Whether a checkpoint's run completed its max_iters: False for one a signal, a crash or a NaN stopped,
    which --resume continues. Files written before the `finished` key are judged by their step."""
    if "finished" in ckpt:
        return bool(ckpt["finished"])
    max_iters = (ckpt.get("train_config") or {}).get("max_iters")
    return max_iters is not None and ckpt.get("iter_num", -1) >= max_iters
