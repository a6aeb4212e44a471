"""The one on-disk format every dataset is written in (data/README.md), and what train.py and sample.py read
it with: data/<name>/train.bin and val.bin, flat arrays of token ids (uint16 when the vocabulary fits in 2**16
ids, else uint32; read back with np.memmap), and meta.json, the fields DatasetMeta checks. JSON, not nanoGPT's
meta.pkl: reading a dataset never runs code from it. A dataset is written into data/.<name>.tmp-<pid>/ and
moved into place when complete, never over one already there without --replace."""

import importlib
import json
import os
from contextlib import suppress
from dataclasses import MISSING, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from plumbing.errors import UserError, reading
from plumbing.fields import check_fields, require, setting
from plumbing.tokenizers import vocabulary_of

DATA_ROOT = Path(__file__).resolve().parent
SPLITS = ("train", "val")
FILES = ("train.bin", "val.bin", "meta.json")  # meta.json last: it is moved into place last
EMBEDDED = ("shakespeare_char", "shakespeare", "passkey")  # built by ensure_prepared on first use, offline
GENERATED = ("passkey",)  # drawn by a generator: data/NAME/task.py defines outdated(meta, data_dir)


def dataset_dir(name: str) -> Path:
    return DATA_ROOT / name


def bad_dataset_name(name) -> bool:
    """Whether name is no plain folder name under data/: empty, hidden (.x, ..), or a path."""
    return not name or Path(name).name != name or name.startswith(".") or "\\" in name


# meta.json -------------------------------------------------------------------
@dataclass
class DatasetMeta:
    """meta.json's fields, as data/README.md lists them, with their rules (plumbing.fields.setting); the
    vocabulary (tokenizer, vocab_size, chars) by vocabulary_of, the rule a checkpoint's meta is read by."""

    tokenizer: str
    vocab_size: int
    dtype: str = setting(MISSING, choices=("uint16", "uint32"))  # how train.bin and val.bin store an id
    train_tokens: int = setting(MISSING, at_least=0)
    val_tokens: int = setting(MISSING, at_least=0)
    chars: list | str | None = None  # a char vocabulary's characters, id i the i-th
    sample_length: int | None = setting(None, at_least=2)  # windows start at multiples of it (passkey)
    generator: dict | None = None  # {"name": one of GENERATED, "filler_segment": [low, high]} (data/passkey)

    def __post_init__(self):
        check_fields(self)
        vocabulary_of(vars(self))
        require(self.vocab_size <= np.iinfo(self.dtype).max + 1, f"vocab_size does not fit in {self.dtype}")
        if self.generator is not None:
            require(self.generator["name"] in GENERATED, f"generator must name one of {', '.join(GENERATED)}")
            segment = self.generator.get("filler_segment", [1, 1])
            require(
                isinstance(segment, list) and len(segment) == 2,
                f"filler_segment {segment!r} is no [low, high]",
            )
            require(self.sample_length is not None, "a generated dataset needs sample_length")
        for split in SPLITS:
            tokens, length = getattr(self, f"{split}_tokens"), self.sample_length or 1
            require(
                tokens % length == 0, f"{split}_tokens is not a whole number of samples of {length} tokens"
            )


def _from_root(command: str) -> str:
    """command (python -m data....) as typed where the user stands: outside the repository root, after cd."""
    root = DATA_ROOT.parent
    return command if Path.cwd().resolve() == root else f"cd {os.path.relpath(root)} && {command}"


def dataset_files(data_dir) -> list:
    """Which of FILES data_dir holds: any means a dataset (or part of one) that preparing would replace."""
    return [name for name in FILES if (Path(data_dir) / name).exists()]


def _prepare_command(data_dir: Path) -> str:
    """The command that (re)creates the dataset in data_dir, with --replace where it replaces files."""
    command = f"python -m data.{data_dir.name}.prepare"
    if not (data_dir / "prepare.py").is_file():
        command = f"python -m data.text.prepare --input FILE --name {data_dir.name}"
    return _from_root(command + (" --replace" if dataset_files(data_dir) else ""))


def load_meta(data_dir) -> dict:
    """data_dir/meta.json, checked (DatasetMeta); a missing one a UserError saying how to prepare it, a
    damaged one (errors.reading) naming it, an outdated one how to make it again."""
    data_dir = Path(data_dir)
    path, again = data_dir / "meta.json", _prepare_command(data_dir)
    if not data_dir.is_dir():
        raise UserError(f"no dataset at {data_dir} (no such folder): prepare it with {again}")
    if not path.exists():
        raise UserError(f"{path} not found: prepare the dataset with {again}")
    with reading(path, "dataset meta.json", fix=f"re-run {again}"):
        meta = json.loads(path.read_text(encoding="utf-8"))
        DatasetMeta(**meta)  # its rules: an exception unless it holds meta.json's fields and no other
        tasks = [meta["generator"]["name"]] if meta.get("generator") else GENERATED
        stale = [
            importlib.import_module(f"{__package__}.{name}.task").outdated(meta, data_dir) for name in tasks
        ]
    if stale := next(filter(None, stale), None):
        again = f"make it again with {_from_root(stale[1])} --replace"
        raise UserError(f"{data_dir} {stale[0]}: {again} (runs trained on it keep their checkpoints)")
    return meta


# finding datasets ------------------------------------------------------------
def available_datasets(data_root=DATA_ROOT) -> list:
    """Folders that hold a dataset, or a prepare.py that makes one (not data/text), but no staging folders."""
    folders = [p for p in Path(data_root).iterdir() if p.is_dir() and p.name[0] != "."]
    makers = [p for p in folders if (p / "prepare.py").is_file() and p.name != "text"]
    return sorted(p.name for p in folders if (p / "meta.json").is_file() or p in makers)


def ensure_prepared(name: str, data_root=DATA_ROOT) -> Path:
    """The folder of dataset `name`, prepared first if EMBEDDED and none of its files are there."""
    data_dir = Path(data_root) / name
    if bad_dataset_name(name) or not data_dir.is_dir():
        available = ", ".join(available_datasets(data_root))
        own = f"or make one from your own text with {_from_root('python -m data.text.prepare --input FILE')}"
        raise UserError(f"unknown dataset {name!r}: available are {available}; {own}")
    found = dataset_files(data_dir)
    if len(found) == len(FILES):
        return data_dir
    again, missing = _prepare_command(data_dir), ", ".join(f for f in FILES if f not in found)
    if found:
        raise UserError(f"dataset {name!r} in {data_dir} is incomplete (no {missing}): run {again}")
    if name not in EMBEDDED:
        raise UserError(f"dataset {name!r} is not prepared: run {again}")
    print(f"dataset {name!r} is not prepared yet: preparing it in {data_dir} (once)")
    importlib.import_module(f"{__package__}.{name}.prepare").prepare(data_dir)
    return data_dir


def prepare_data(dataset, procs):
    """The dataset's folder and meta (procs: plumbing.distributed.Processes), an embedded dataset prepared on
    first use by rank 0; then every rank looks, so all meet a missing dataset's error together."""
    if procs.master:
        with suppress(UserError):
            ensure_prepared(dataset)
    if procs.launched:
        dist.barrier()
    data_dir = ensure_prepared(dataset)
    return data_dir, load_meta(data_dir)


# reading a split, checked ----------------------------------------------------
FULL_ID_SCAN_BYTES = 1 << 30  # up to 1 GiB of tokens every id is checked: a second or two, once per process
ID_SCAN_CHUNK, ID_SCAN_CHUNKS = 1 << 20, 64  # past it, 64 chunks of 1M tokens from start to end


@lru_cache(maxsize=64)
def _largest_id(path: str, dtype: str, inode: int, size: int, mtime_ns: int) -> int:
    """The largest id in a .bin file, read once per process and version of the file (inode, size, mtime)."""
    if size == 0:
        return -1  # np.memmap cannot map an empty file
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if tokens.nbytes <= FULL_ID_SCAN_BYTES:
        return int(tokens.max())
    # a 20 GB corpus is not read whole by every rank: evenly spaced chunks catch a file of another tokenizer
    # or dtype, which is wrong all through
    starts = np.linspace(0, len(tokens) - ID_SCAN_CHUNK, ID_SCAN_CHUNKS).astype(np.int64)
    return max(int(tokens[start : start + ID_SCAN_CHUNK].max()) for start in starts)


def check_split(data_dir, split: str, meta: dict, block_size: int = None) -> None:
    """UserError unless data_dir/<split>.bin holds the tokens meta.json counts, only ids below vocab_size
    (else a device-side assert at whatever step first draws one), and at least block_size + 1 tokens."""
    data_dir, dtype, tokens = Path(data_dir), np.dtype(meta["dtype"]), meta[f"{split}_tokens"]
    path, again = data_dir / f"{split}.bin", _prepare_command(data_dir)
    if not path.is_file():
        raise UserError(f"{path} not found: prepare the dataset with {again}")
    stat, size = path.stat(), tokens * dtype.itemsize
    if stat.st_size != size:
        says = f"meta.json says {tokens} {dtype} tokens ({size} bytes)"
        raise UserError(f"{path} holds {stat.st_size} bytes, but {says}: re-run {again}")
    vocab_size = meta["vocab_size"]
    if vocab_size <= np.iinfo(dtype).max:  # else the dtype cannot hold an id past the vocabulary
        largest = _largest_id(str(path), dtype.name, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if largest >= vocab_size:
            raise UserError(
                f"{path} holds token id {largest}, outside meta.json's vocabulary of {vocab_size} ids "
                f"(0..{vocab_size - 1}): the files disagree; re-run {again}"
            )
    if block_size is not None and tokens < block_size + 1:
        raise UserError(
            f"the {split} split of {data_dir} has {tokens} tokens, fewer than block_size + 1 = "
            f"{block_size + 1}: use a smaller block_size, or prepare a longer text"
        )


# batches ---------------------------------------------------------------------
class BatchSampler:
    """Random (x, y) windows of a split, as nanoGPT's get_batch, through a memmap re-opened per batch (one
    kept open leaks memory). Each batch's draw is seeded by (seed, rank, split, batch number): ranks differ,
    evaluating does not shift the training batches, and rank 0's checkpoint resumes every rank's stream.
    With meta.json's sample_length, windows start where a sample starts."""

    def __init__(self, data_dir, block_size, batch_size, device="cpu", seed=0, rank=0):
        self.data_dir, self.block_size, self.batch_size = Path(data_dir), block_size, batch_size
        self.device, self.seed, self.rank = torch.device(device), seed, rank
        meta = load_meta(self.data_dir)
        self.dtype = np.dtype(meta["dtype"])
        self.sample_length = meta.get("sample_length", 1)  # 1: a window may start at any token
        for split in SPLITS:
            check_split(self.data_dir, split, meta, block_size)
        self.batches = dict.fromkeys(SPLITS, 0)  # batches drawn so far, per split
        self.generator = torch.Generator()

    def get_batch(self, split: str):
        if split not in self.batches:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        # SeedSequence hashes the whole tuple: nearby ones (seed 0 rank 1, seed 1 rank 0) give unrelated draws
        key = [self.seed, self.rank, SPLITS.index(split), self.batches[split]]
        hi, lo = np.random.SeedSequence(key).generate_state(2)
        self.generator.manual_seed(int(hi) << 32 | int(lo))
        self.batches[split] += 1
        data = np.memmap(self.data_dir / f"{split}.bin", dtype=self.dtype, mode="r")
        T = self.block_size
        starts = (len(data) - T - 1) // self.sample_length + 1  # window starts that leave T + 1 tokens
        ix = torch.randint(starts, (self.batch_size,), generator=self.generator).numpy() * self.sample_length
        windows = torch.from_numpy(data[ix[:, None] + np.arange(T + 1)].astype(np.int64))  # (B, T+1)
        x, y = windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # (B, T); y[:, t] follows x[:, t]
        if self.device.type == "cuda":  # pinned host memory: the copy to the GPU runs asynchronously
            return tuple(t.pin_memory().to(self.device, non_blocking=True) for t in (x, y))
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        # plain ints, so a checkpoint holding it loads with torch.load(weights_only=True)
        return {"seed": self.seed, **{f"{split}_batches": n for split, n in self.batches.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Continue the stream saved in state; this sampler keeps its own rank."""
        self.seed = int(state["seed"])
        self.batches = {split: int(state[f"{split}_batches"]) for split in SPLITS}
