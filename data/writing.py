"""Writing a dataset in the one on-disk format (data/common.py reads it; data/README.md): each
data/NAME/prepare.py stages its files in data/.<name>.tmp-<pid>/ and moves them into place when complete,
never over a dataset already there without --replace; a UTF-8 text file becomes a dataset through
prepare_file."""

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from data.common import FILES, DatasetMeta, dataset_dir, dataset_files
from plumbing.cli import ArgumentParser
from plumbing.errors import StopSignals, UserError, one_line_errors
from plumbing.outputs import no_space, space_error
from plumbing.tokenizers import CharTokenizer, GPT2Tokenizer

REPLACE_HELP = "replace a dataset already in the folder (without it, that is refused and nothing changes)"


REPLACE_HELP = "replace a dataset already in the folder (without it, that is refused and nothing changes)"


def complete_meta(meta: dict, train_tokens: int, val_tokens: int) -> dict:
    """meta ("tokenizer", "vocab_size", and "chars" for char) with dtype and the token counts filled in."""
    vocab_size = meta.get("vocab_size")
    dtype = "uint32" if isinstance(vocab_size, int) and vocab_size > 2**16 else "uint16"
    full = dict(tokenizer=meta.get("tokenizer"), vocab_size=vocab_size, dtype=dtype)
    full |= dict(train_tokens=int(train_tokens), val_tokens=int(val_tokens))
    full |= {key: meta[key] for key in ("chars", "sample_length", "generator") if key in meta}
    DatasetMeta(**full)
    return full


def save_meta(path, meta: dict) -> None:
    # ensure_ascii=False keeps a char vocabulary readable ("é", not "\u00e9")
    Path(path).write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


# writing a dataset -----------------------------------------------------------
def refuse_existing(out_dir, replace: bool = False) -> None:
    """UserError if out_dir holds a dataset (any of FILES) and replace is false: none replaced by accident."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir} is a file, not a dataset folder: move it away, or choose another name")
    if (found := dataset_files(out_dir)) and not replace:
        # data.text's --name; a dataset with its own prepare.py has a fixed folder
        other_name = "" if (out_dir / "prepare.py").is_file() else ", or choose another --name"
        raise UserError(
            f"{out_dir} already holds a dataset ({', '.join(found)}): add --replace to replace it{other_name}"
        )


@contextmanager
def staged_dataset(out_dir, replace: bool = False, needed=None):
    """Yield {file name: path} in a staging folder beside out_dir to write; move them into out_dir if the
    block ends without error, else (Ctrl-C too) delete them. Into an existing out_dir they move meta.json
    last, so a stop in between leaves a folder load_meta refuses. No space left (`needed` bytes): one line."""
    out_dir = Path(out_dir)
    refuse_existing(out_dir, replace)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for path in out_dir.parent.glob(".*.tmp-*"):  # staging folders whose process is gone (kill -9, power cut)
        match = re.fullmatch(r"\..+\.tmp-(\d+)", path.name)
        try:
            if match and path.is_dir():
                os.kill(int(match[1]), 0)  # signal 0 sends nothing: it only asks whether the process exists
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:  # it exists, as another user's
            pass
    staging = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)  # left by a killed process whose pid was ours
    staging.mkdir()
    try:
        yield {name: staging / name for name in FILES}
        if not out_dir.exists():
            os.rename(staging, out_dir)
        else:
            (out_dir / "meta.json").unlink(missing_ok=True)
            for name in FILES:
                os.replace(staging / name, out_dir / name)
    except OSError as e:
        if not (full := space_error(e)):
            raise
        kept = f"{out_dir} is as it was" if out_dir.exists() else "no dataset was half-written"
        raise no_space(full, out_dir, needed, kept) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_dataset(out_dir, train_ids, val_ids, meta: dict, replace: bool = False) -> dict:
    """Write a dataset into out_dir (meta: "tokenizer", "vocab_size", "chars" for char); return its meta."""
    splits = {"train": np.asarray(train_ids), "val": np.asarray(val_ids)}
    meta = complete_meta(meta, splits["train"].size, splits["val"].size)
    vocab = meta["vocab_size"]
    for split, ids in splits.items():
        ids = splits[split] = ids.astype(np.int64) if ids.size == 0 else ids  # np.asarray([]) is float64
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(
                f"{split} ids must be a flat sequence of integers, got shape {ids.shape} {ids.dtype}"
            )
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"{split} ids must lie in [0, {vocab}), found {ids.min()}..{ids.max()}")
    needed = sum(ids.size for ids in splits.values()) * np.dtype(meta["dtype"]).itemsize
    with staged_dataset(out_dir, replace, needed) as tmp:
        for split, ids in splits.items():
            with open(tmp[f"{split}.bin"], "wb") as f:  # not ndarray.tofile, whose errors carry no errno
                f.write(ids.astype(meta["dtype"]).data)
        save_meta(tmp["meta.json"], meta)
    return meta


def summarize(out_dir, meta: dict) -> str:
    """One line for the prepare scripts to print."""
    return (
        f"wrote {os.path.relpath(out_dir)}: {meta['tokenizer']} tokenizer, "
        f"vocab_size {meta['vocab_size']:,}, train {meta['train_tokens']:,} tokens, "
        f"val {meta['val_tokens']:,} tokens ({meta['dtype']})"
    )


@contextmanager
def exit_on_user_error(prog=None):
    """A prepare script's handler: `prog: error:` and status 2 for a UserError, 130/143 for a signal."""
    stopped = "stopped by {signal}: temporary files removed, no dataset half-written"
    with one_line_errors(prog, status=2, errors=(), stopped=stopped), StopSignals(request=False):
        yield


def prepare_main(name, description, prepare):
    """The command line of a prepare.py whose only flag is --replace: prepare(out_dir, replace) writes it."""
    parser = ArgumentParser(prog=f"python -m data.{name}.prepare", description=description)
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    with exit_on_user_error(parser.prog):
        meta = prepare(dataset_dir(name), parser.parse_args().replace)
    print(summarize(dataset_dir(name), meta))


# a dataset from a text file (data/text, and the Shakespeare datasets with their fixed input) ---
def read_text(path) -> str:
    """The text of a UTF-8 file, or an error that says what to do about it."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "no such file"
        raise UserError(f"{path}: {what}; pass --input the path of a UTF-8 text file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # -sig drops the byte-order mark some Windows editors write first
    except UnicodeDecodeError as e:
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff") or data[1:200:2].count(0) > 50  # BOM, or ASCII
        what = f"not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})"
        raise UserError(
            f"{path} is {'UTF-16 text, not UTF-8' if utf16 else what}: save it as UTF-8, e.g. iconv -f "
            f"{'utf-16' if utf16 else 'latin1'} -t utf-8 {path.name} > {path.stem}.utf8.txt"
        ) from None
    if not text:
        raise UserError(f"{path} is empty: pass a file with some text in it")
    return text


def prepare_file(input_path, out_dir, tokenizer="char", val_fraction=0.1, block_size=64, replace=False):
    """Write a UTF-8 file's text as a dataset in out_dir; return its meta. val is the text's last
    val_fraction; each split needs block_size + 1 tokens, one (x, y) training window."""
    refuse_existing(out_dir, replace)  # before reading and encoding, not after
    text = read_text(input_path)
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if block_size < 1:
        raise UserError(f"--block_size must be at least 1, got {block_size}")
    tok = CharTokenizer(sorted(set(text))) if tokenizer == "char" else GPT2Tokenizer()
    n = int(len(text) * (1 - val_fraction))
    splits = {"train": tok.encode(text[:n]), "val": tok.encode(text[n:])}
    for split, ids in splits.items():
        if len(ids) < block_size + 1:
            fix = "a larger --val_fraction" if split == "val" else "a smaller --val_fraction"
            raise UserError(
                f"{input_path} is too short: its {split} split has {len(ids)} {tokenizer} tokens, fewer "
                f"than block_size + 1 = {block_size + 1}; use a longer text, a smaller --block_size or {fix}"
            )
    return write_dataset(out_dir, splits["train"], splits["val"], tok.to_meta(), replace)
