"""The passkey retrieval dataset (task.py) in its own 38-character vocabulary: samples of exactly T + 1
characters (T = --block_size), so that train.py's windows (meta.json's sample_length) each hold one sample.

    python -m data.passkey.prepare                          # data/passkey: T = 64, for configs/passkey.toml
    python -m data.passkey.prepare --block_size 256         # data/passkey_ctx256: for fine-tuning at 256
    python train.py --config configs/passkey.toml --pos=alibi

Train samples use the training keys, val samples the evaluation keys (task.is_eval_key), each split from its
own random stream."""

import sys

if not __package__:  # `python data/passkey/prepare.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m data.passkey.prepare`")


import os
import shutil
from contextlib import suppress

import numpy as np

from data import common, writing
from data.passkey.task import CHARS, GENERATOR, KEY_CHARACTERS, default_name, training_sample
from plumbing.cli import ArgumentParser, check_seed
from plumbing.errors import UserError
from plumbing.hardware import format_bytes
from plumbing.tokenizers import CharTokenizer

TRAIN_SAMPLES, VAL_SAMPLES = 100_000, 1_000  # the CPU recipe draws 96,000 (3,000 steps of 32)


def passkey_dataset_bytes(block_size, train_samples, val_samples):
    """{what: bytes} this script holds at its peak: both splits' ids as int64, and while a split is
    built its samples' strings, their join and the token list (CPython: 10 bytes a character, 49 a string)."""
    length, largest = block_size + 1, max(train_samples, val_samples)
    return {"token arrays": 8 * (train_samples + val_samples) * length, "text": largest * (10 * length + 49)}


def available_memory():
    """Bytes this machine can still allocate (Linux's MemAvailable; elsewhere the free pages), or None."""
    with suppress(OSError, StopIteration, ValueError), open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    with suppress(AttributeError, OSError, ValueError):  # no sysconf (Windows), or not this name (macOS)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return None


def check_memory(parts, what, advice):
    """A UserError if parts ({what: bytes}) exceed the memory available, before hours of drawing end in the
    kernel's out-of-memory kill, which says nothing."""
    needed, available = sum(parts.values()), available_memory()
    if available is None or needed <= available:
        return
    largest = sorted(parts.items(), key=lambda part: -part[1])
    detail = ", ".join(f"{name} {format_bytes(size)}" for name, size in largest if size >= needed / 100)
    free = f"this machine has {format_bytes(available)} available"
    raise UserError(f"{what} needs about {format_bytes(needed)} of memory ({detail}) but {free}; {advice}")


def prepare(
    out_dir, replace=False, block_size=64, seed=0, train_samples=TRAIN_SAMPLES, val_samples=VAL_SAMPLES
):
    length, tokenizer = block_size + 1, CharTokenizer(CHARS)  # block_size inputs and their targets
    splits = []
    for i, (split, count) in enumerate(zip(common.SPLITS, (train_samples, val_samples))):
        rng = np.random.default_rng([seed, i])  # one stream per split
        text = "".join(training_sample(rng, length, split).text for _ in range(count))
        splits.append(np.array(tokenizer.encode(text), dtype=np.int64))
    meta = tokenizer.to_meta() | {"sample_length": length, "generator": dict(GENERATOR)}
    return writing.write_dataset(out_dir, *splits, meta, replace)


def main(argv=None):
    description = "Make data/passkey (or data/passkey_ctxN) for retrieval training."
    parser = ArgumentParser(prog="python -m data.passkey.prepare", description=description)  # errors: 1 line
    add = parser.add_argument
    add("--block_size", type=int, default=64, help="the context the samples fill (T)")
    add("--name", help="dataset folder under data/ (default: passkey, or passkey_ctxN for T = N)")
    add("--seed", type=int, default=0, help="seeds the keys, markers and filler")
    add("--train_samples", type=int, default=TRAIN_SAMPLES)
    add("--val_samples", type=int, default=VAL_SAMPLES)
    add("--replace", action="store_true", help=writing.REPLACE_HELP)
    with writing.exit_on_user_error(parser.prog):
        args = parser.parse_args(argv)
        T, n_train, n_val = args.block_size, args.train_samples, args.val_samples
        if T + 1 < KEY_CHARACTERS:
            why = f"a statement and its question take {KEY_CHARACTERS} characters"
            parser.error(f"--block_size must be >= {KEY_CHARACTERS - 1} ({why}), got {T}")
        for flag in ("train_samples", "val_samples"):
            if getattr(args, flag) < 1:
                parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
        if args.name is not None and common.bad_dataset_name(args.name):
            parser.error(f"--name must be a plain folder name such as passkey_long, got {args.name!r}")
        check_seed("seed", args.seed)
        # refused before hours of drawing: what memory or disk (uint16 ids) cannot hold
        what = f"{n_train + n_val:,} samples of {T + 1:,} characters"
        advice = "lower --train_samples, --val_samples or --block_size"
        check_memory(passkey_dataset_bytes(T, n_train, n_val), what, advice)
        if (size := 2 * (n_train + n_val) * (T + 1)) > (free := shutil.disk_usage(common.DATA_ROOT).free):
            raise UserError(f"{what} take {format_bytes(size)} on disk but {common.DATA_ROOT} has "
                            f"{format_bytes(free)} free; {advice}")  # fmt: skip
        out_dir = common.dataset_dir(args.name or default_name(T))
        meta = prepare(out_dir, args.replace, T, args.seed, n_train, n_val)
    print(writing.summarize(out_dir, meta))


if __name__ == "__main__":
    main()
