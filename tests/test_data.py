"""The data format, the preparation scripts and the batch sampler (data/), on small real inputs."""

import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import skip_without_gpt2

from data import common
from data.common import DATA_ROOT, FILES, BatchSampler, available_datasets, ensure_prepared, load_meta
from data.fineweb_edu.prepare import write_token_dataset
from data.shakespeare import prepare as shakespeare_bpe
from data.shakespeare_char import prepare as shakespeare_char
from data.text.prepare import main as text_main
from data.writing import prepare_file, staged_dataset, write_dataset
from plumbing.errors import UserError
from plumbing.tokenizers import get_tokenizer

TEXT = (DATA_ROOT / "shakespeare_char" / "input.txt").read_text(encoding="utf-8")
ROOT = DATA_ROOT.parent
EOT = 50256


@pytest.fixture(scope="module")
def char_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "shakespeare_char"
    shakespeare_char.prepare(out)
    return out


def write_counting(out, n_train=5000, n_val=300, vocab_size=5000):
    """A dataset whose token at position i is i % vocab_size: a window's first id says where it came from."""
    meta = write_dataset(
        out,
        np.arange(n_train) % vocab_size,
        np.arange(n_val) % vocab_size,
        {"tokenizer": "gpt2", "vocab_size": vocab_size},
    )
    return out, meta


def snapshot(folder):
    """{file name: bytes} of a folder, to show that a refused or failed preparation left it as it was."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def dead_pid():
    """The id of a process that has ended (and been reaped), as a kill -9 leaves one."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def draw(sampler, splits):
    return [sampler.get_batch(split) for split in splits]


def same(batches_a, batches_b):
    return all(
        torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(batches_a, batches_b)
    )


# -----------------------------------------------------------------------------
# preparation


def test_char_prepare_round_trips_tiny_shakespeare(char_dir):
    """Char Shakespeare: 65-char sorted vocab, uint16, a 90/10 split that covers the corpus, exact decode."""
    meta = load_meta(char_dir)
    assert meta["tokenizer"] == "char" and meta["vocab_size"] == 65 and meta["dtype"] == "uint16"
    assert meta["chars"] == sorted(set(TEXT))
    assert meta["train_tokens"] == int(len(TEXT) * 0.9) == 1_003_854
    assert meta["train_tokens"] + meta["val_tokens"] == len(TEXT) == 1_115_394
    assert sorted(p.name for p in char_dir.iterdir()) == sorted(FILES)  # no temporary files left over
    tok = get_tokenizer(meta)
    train = np.fromfile(char_dir / "train.bin", dtype=np.uint16)
    val = np.fromfile(char_dir / "val.bin", dtype=np.uint16)
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"])
    assert tok.decode(train) + tok.decode(val) == TEXT
    assert tok.encode(TEXT[:100]) == train[:100].tolist()


def test_bpe_prepare_writes_gpt2_format(tmp_path):
    """BPE Shakespeare: gpt2 meta, 50257 ids in uint16, and the two splits decode back to the corpus."""
    skip_without_gpt2()
    meta = shakespeare_bpe.prepare(tmp_path)
    assert meta == load_meta(tmp_path)
    assert (meta["tokenizer"], meta["vocab_size"], meta["dtype"]) == ("gpt2", 50257, "uint16")
    assert "chars" not in meta
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    val = np.fromfile(tmp_path / "val.bin", dtype=np.uint16)
    assert (len(train), len(val)) == (meta["train_tokens"], meta["val_tokens"]) == (301_966, 36_059)
    tok = get_tokenizer(meta)
    assert tok.decode(train) + tok.decode(val) == TEXT


@pytest.mark.parametrize("vocab_size, dtype", [(65, np.uint16), (65536, np.uint16), (65537, np.uint32)])
def test_dtype_follows_vocab_size(tmp_path, vocab_size, dtype):
    """Ids are stored as uint16 while the vocabulary fits in 2**16 ids and as uint32 beyond, losslessly."""
    ids = np.array([0, 1, vocab_size - 1, vocab_size // 2], dtype=np.int64)
    meta = write_dataset(tmp_path, ids, ids[::-1], {"tokenizer": "gpt2", "vocab_size": vocab_size})
    assert meta["dtype"] == np.dtype(dtype).name
    assert (tmp_path / "train.bin").stat().st_size == len(ids) * np.dtype(dtype).itemsize
    assert np.array_equal(np.fromfile(tmp_path / "train.bin", dtype=dtype), ids)


def test_write_dataset_rejects_ids_outside_the_vocabulary(tmp_path):
    """An id >= vocab_size is an error, not silently wrapped by the cast to uint16."""
    with pytest.raises(ValueError, match="must lie in"):
        write_dataset(tmp_path / "out", [1, 2, 70000], [1], {"tokenizer": "gpt2", "vocab_size": 50257})
    assert not (tmp_path / "out").exists()


def test_unknown_characters_are_named():
    """Encoding text with characters outside a char vocabulary names each of them, in order."""
    tok = get_tokenizer({"tokenizer": "char", "vocab_size": 3, "chars": ["a", "b", "c"]})
    with pytest.raises(ValueError, match=r"characters not in the vocabulary: 'é', '€'"):
        tok.encode("abé€éc")


def test_text_prepare_makes_a_dataset_from_your_own_file(tmp_path):
    """Any UTF-8 file becomes a char dataset with its own vocabulary, split 90/10, decoding back exactly."""
    text = "Ünïcödé lines, with emoji 🎉 and accents: à la carte.\n" * 40
    path = tmp_path / "mine.txt"
    path.write_text(text, encoding="utf-8")
    meta = prepare_file(path, tmp_path / "mine", block_size=64)
    assert meta["chars"] == sorted(set(text)) and meta["vocab_size"] == len(set(text))
    assert meta["train_tokens"] == int(len(text) * 0.9) and meta["train_tokens"] + meta["val_tokens"] == len(
        text
    )
    tok = get_tokenizer(load_meta(tmp_path / "mine"))
    train = np.fromfile(tmp_path / "mine" / "train.bin", dtype=meta["dtype"])
    val = np.fromfile(tmp_path / "mine" / "val.bin", dtype=meta["dtype"])
    assert tok.decode(train) + tok.decode(val) == text


BAD_INPUTS = {
    "missing": (None, UserError, "no such file"),
    "a folder": ("mkdir", UserError, "is a folder"),
    "empty": (b"", UserError, "is empty"),
    "non-UTF-8": ("café au lait, encore du café\n".encode("latin-1") * 50, UserError, "not UTF-8"),
    "too short": (b"To be, or not to be.\n", UserError, "too short"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_text_prepare_errors_say_what_to_do_and_leave_nothing(tmp_path, capsys, case):
    """Missing, folder, empty, non-UTF-8 and too-short inputs raise a clear error, write nothing, and main
    exits 2 with one line that names the script."""
    content, error, phrase = BAD_INPUTS[case]
    path = tmp_path / "in.txt"
    if content == "mkdir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(error, match=phrase):
        prepare_file(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        text_main(["--input", str(path), "--name", "posgpt_test_never_written"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m data.text.prepare: error: ") and phrase in err and err.count("\n") == 1
    assert not (DATA_ROOT / "posgpt_test_never_written").exists()


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, -0.1, 1.5])
def test_text_prepare_rejects_bad_val_fraction(tmp_path, val_fraction):
    """val_fraction outside (0, 1) is an error that names the flag, and nothing is written."""
    path = tmp_path / "in.txt"
    path.write_text(TEXT[:10_000], encoding="utf-8")
    with pytest.raises(UserError, match="--val_fraction"):
        prepare_file(path, tmp_path / "out", val_fraction=val_fraction)
    assert not (tmp_path / "out").exists()


def test_text_prepare_cli_names_valid_tokenizers(capsys):
    """A wrong --tokenizer is an argparse error that lists the valid choices."""
    with pytest.raises(SystemExit) as exit_info:
        text_main(["--input", "x.txt", "--tokenizer", "bpe"])
    assert exit_info.value.code == 2
    assert "choose from 'char', 'gpt2'" in capsys.readouterr().err


# -----------------------------------------------------------------------------
# nothing replaced by accident, nothing left half-written


@pytest.fixture
def scratch_name():
    """A dataset name under the real data/ (the prepare scripts write nowhere else), removed afterwards."""
    name = f"posgpt_test_scratch_{os.getpid()}"
    yield name
    shutil.rmtree(DATA_ROOT / name, ignore_errors=True)


def test_prepare_refuses_an_existing_dataset_unless_asked_to_replace_it(tmp_path, capsys, scratch_name):
    """python -m data.text.prepare onto a name that holds a dataset is one line, exit 2, files byte-identical;
    --replace replaces it, through a temporary folder that is gone afterwards."""
    first, second = tmp_path / "first.txt", tmp_path / "second.txt"
    first.write_text(TEXT[:5000], encoding="utf-8")
    second.write_text(TEXT[5000:12000], encoding="utf-8")
    text_main(["--input", str(first), "--name", scratch_name])
    before = snapshot(DATA_ROOT / scratch_name)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        text_main(["--input", str(second), "--name", scratch_name])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    assert f"{scratch_name} already holds a dataset (train.bin, val.bin, meta.json): add --replace" in err
    assert snapshot(DATA_ROOT / scratch_name) == before
    text_main(["--input", str(second), "--name", scratch_name, "--replace"])
    assert load_meta(DATA_ROOT / scratch_name)["train_tokens"] == int(7000 * 0.9)
    assert sorted(snapshot(DATA_ROOT / scratch_name)) == sorted(FILES)
    assert not list(DATA_ROOT.glob(f".{scratch_name}.tmp-*"))


def test_a_failed_replacement_leaves_the_old_dataset(tmp_path):
    """An error while the new files are written (a stream that breaks, a full disk) leaves the dataset that
    was there byte-identical and no temporary folder; so does a refused write_dataset, which replace=False
    is."""
    data_dir, _ = write_counting(tmp_path / "mine", n_train=100, n_val=50, vocab_size=100)
    before = snapshot(data_dir)
    with pytest.raises(RuntimeError, match="disk full"):
        with staged_dataset(data_dir, replace=True) as tmp:
            tmp["train.bin"].write_bytes(b"partial")
            raise RuntimeError("disk full")
    with pytest.raises(UserError, match="already holds a dataset"):
        write_counting(data_dir, n_train=200, n_val=50, vocab_size=100)
    assert snapshot(data_dir) == before and sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_leftovers_of_a_killed_preparation_are_removed_by_the_next(tmp_path):
    """A temporary folder whose process is gone (kill -9) is deleted by the next preparation beside it; one
    whose process still runs is not, and neither is listed as a dataset."""
    dead, running = tmp_path / f".mine.tmp-{dead_pid()}", tmp_path / f".other.tmp-{os.getpid()}"
    for leftover in (dead, running):
        leftover.mkdir()
        (leftover / "meta.json").write_text("{}")
    assert available_datasets(tmp_path) == []
    write_counting(tmp_path / "mine", n_train=100, n_val=50, vocab_size=100)
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "mine"]
    assert available_datasets(tmp_path) == ["mine"]


STOP_DURING_PREPARATION = """
import os, sys, time
from data.writing import exit_on_user_error, staged_dataset
with exit_on_user_error():
    with staged_dataset(sys.argv[1]) as tmp:
        tmp["train.bin"].write_bytes(bytes(1000))
        print(tmp["train.bin"].parent.name, flush=True)
        os.kill(os.getpid(), int(sys.argv[2]))
        time.sleep(10)  # the signal ends it at once
"""


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_preparation_removes_the_temporary_folder(tmp_path, signum, status):
    """Ctrl-C or SIGTERM while a prepare script writes its files: it deletes its temporary folder, writes no
    dataset, says so in one line and exits 128 + the signal, as shells report a process the signal ended."""
    done = subprocess.run(
        [sys.executable, "-c", STOP_DURING_PREPARATION, str(tmp_path / "out"), str(int(signum))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith(".out.tmp-")  # the signal came while it was writing there
    assert done.returncode == status, done.stderr
    assert done.stderr == f"stopped by {signum.name}: temporary files removed, no dataset half-written\n"
    assert list(tmp_path.iterdir()) == []


def test_web_writer_ends_each_document_with_eot(tmp_path):
    """The FineWeb-Edu writer tokenizes in-memory documents in parallel, in order, one <|endoftext|> after
    each (a literal "<|endoftext|>" in a text stays text), whole documents to val first, then train."""
    skip_without_gpt2()
    docs = [f"Document {i}: some text, ünïcödé 🎉." for i in range(9)] + [
        "A literal <|endoftext|> is only text."
    ]
    meta = write_token_dataset(tmp_path, docs, val_tokens=15, num_proc=2, docs_per_task=3)
    assert (meta["tokenizer"], meta["vocab_size"], meta["dtype"]) == ("gpt2", 50257, "uint16")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    tok = get_tokenizer(meta)
    decoded = []
    for split in ("val", "train"):
        ids = np.fromfile(tmp_path / f"{split}.bin", dtype=np.uint16)
        assert len(ids) == meta[f"{split}_tokens"] and ids[-1] == EOT
        decoded += [tok.decode(doc) for doc in np.split(ids, np.flatnonzero(ids == EOT) + 1)[:-1]]
    assert decoded == [doc + "<|endoftext|>" for doc in docs]
    assert meta["val_tokens"] >= 15 and meta["val_tokens"] - len(tok.encode(docs[0])) - 1 < 15  # whole docs


def test_web_writer_stops_at_max_tokens(tmp_path):
    """max_tokens ends train.bin at the first document boundary past it."""
    skip_without_gpt2()
    docs = [f"Document number {i}." for i in range(100)]
    meta = write_token_dataset(tmp_path, docs, val_tokens=1, max_tokens=20, num_proc=2, docs_per_task=4)
    train = np.fromfile(tmp_path / "train.bin", dtype=np.uint16)
    assert 20 <= meta["train_tokens"] == len(train) < 40 and train[-1] == EOT


def test_web_writer_leaves_nothing_when_the_stream_fails(tmp_path):
    """A stream that breaks midway leaves no dataset and no temporary files behind."""
    skip_without_gpt2()

    def docs():
        yield from ["first document", "second document"] * 20
        raise ConnectionError("stream dropped")

    with pytest.raises(ConnectionError):
        write_token_dataset(tmp_path / "out", docs(), val_tokens=5, num_proc=2, docs_per_task=4)
    assert not (tmp_path / "out").exists()


# -----------------------------------------------------------------------------
# finding datasets


def test_ensure_prepared_lists_datasets_for_an_unknown_name():
    """An unknown dataset name is an error listing the available ones and how to make one."""
    with pytest.raises(UserError) as info:
        ensure_prepared("no_such_dataset")
    message = str(info.value)
    for name in (
        "shakespeare_char",
        "shakespeare",
        "fineweb_edu",
        "python -m data.text.prepare --input FILE",
    ):
        assert name in message


def test_ensure_prepared_builds_an_embedded_dataset_once(tmp_path, capsys):
    """An embedded dataset is prepared in-process on first use, saying so in one line, then just found."""
    (tmp_path / "shakespeare_char").mkdir()
    data_dir = ensure_prepared("shakespeare_char", data_root=tmp_path)
    assert capsys.readouterr().out.count("\n") == 1
    assert load_meta(data_dir)["vocab_size"] == 65
    assert ensure_prepared("shakespeare_char", data_root=tmp_path) == data_dir
    assert capsys.readouterr().out == ""


def test_ensure_prepared_never_rebuilds_part_of_a_dataset(tmp_path):
    """An embedded dataset holding some of its files (a replacement stopped midway, files copied by hand) is
    not prepared over them: the error names what is missing and the command, with --replace."""
    (tmp_path / "shakespeare_char").mkdir()
    (tmp_path / "shakespeare_char" / "train.bin").write_bytes(b"mine")
    with pytest.raises(
        UserError,
        match=r"'shakespeare_char' in \S+ is incomplete \(no val.bin, meta.json\): "
        r"run .*--replace$",
    ):
        ensure_prepared("shakespeare_char", data_root=tmp_path)
    assert snapshot(tmp_path / "shakespeare_char") == {"train.bin": b"mine"}


def test_ensure_prepared_names_the_prepare_command(tmp_path):
    """A dataset that must be downloaded is not prepared silently: the error names its prepare module."""
    (tmp_path / "webdata").mkdir()
    (tmp_path / "webdata" / "prepare.py").write_text("")
    command = (
        r"(cd \S+ && )?python -m data\.webdata\.prepare"  # the cd when pytest runs elsewhere than the root
    )
    with pytest.raises(UserError, match=rf"dataset 'webdata' is not prepared: run {command}$"):
        ensure_prepared("webdata", data_root=tmp_path)


@pytest.mark.parametrize("name", ["shakespeare_char", "shakespeare", "text", "fineweb_edu"])
def test_each_prepare_script_runs_as_a_module_from_the_root(name):
    """python -m data.NAME.prepare, as the docs say, imports data.common with no sys.path edit
    (--help: no work)."""
    done = subprocess.run(
        [sys.executable, "-m", f"data.{name}.prepare", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith(f"usage: python -m data.{name}.prepare"), (
        done.stderr
    )
    assert "--replace" in done.stdout


def test_the_suggested_command_works_from_another_folder(tmp_path, monkeypatch):
    """-m finds the data package in the current folder only: away from the root, the suggestion starts with a
    cd there, and the command runs as given."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as info:
        ensure_prepared("no_such_dataset")
    command = str(info.value).split("from your own text with ")[1]
    assert command.startswith("cd ")
    done = subprocess.run(
        command.replace("python ", f"{shlex.quote(sys.executable)} ", 1) + " --help",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "usage: python -m data.text.prepare" in done.stdout, done.stderr


def test_load_meta_errors(tmp_path):
    """A missing meta.json names the prepare command; a malformed one is not usable, for Python's reason,
    and names it too."""
    with pytest.raises(UserError, match="prepare"):
        load_meta(tmp_path)
    (tmp_path / "meta.json").write_text('{"tokenizer": "char", "vocab_size": 3}')
    with pytest.raises(
        UserError, match=r"not a usable dataset meta\.json \(TypeError: .*'dtype'.*--replace$"
    ):
        load_meta(tmp_path)
    (tmp_path / "meta.json").write_text("not json")
    with pytest.raises(UserError, match=r"meta\.json: not a usable dataset meta\.json \(JSONDecodeError: "):
        load_meta(tmp_path)


# -----------------------------------------------------------------------------
# the batch sampler


@pytest.mark.parametrize("vocab_size", [5000, 70000])  # uint16 and uint32 files
def test_batches_are_shifted_windows_of_the_file(tmp_path, vocab_size):
    """x is block_size consecutive tokens of the file, y the same window one token later, both int64."""
    data_dir, meta = write_counting(tmp_path, n_train=vocab_size, vocab_size=vocab_size)
    data = np.fromfile(data_dir / "train.bin", dtype=meta["dtype"])
    sampler = BatchSampler(data_dir, block_size=16, batch_size=8, seed=0)
    x, y = sampler.get_batch("train")
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x.numpy(), y.numpy()):
        start = row_x[0]  # train token i is i here, so the first id is the window's offset
        assert np.array_equal(row_x, data[start : start + 16]) and np.array_equal(
            row_y, data[start + 1 : start + 17]
        )


def test_batches_match_the_char_dataset(char_dir):
    """On real data, y is x shifted by one and every window occurs in train.bin."""
    sampler = BatchSampler(char_dir, block_size=32, batch_size=4, seed=0)
    x, y = sampler.get_batch("train")
    assert torch.equal(x[:, 1:], y[:, :-1])
    data = np.fromfile(char_dir / "train.bin", dtype=np.uint16)
    needle = x[0].numpy().astype(np.uint16).tobytes()
    assert data.tobytes().find(needle) % 2 == 0  # found, at a token boundary


def test_same_seed_gives_same_batches(tmp_path):
    """Two samplers with the same seed and rank draw the same batches; another seed draws others."""
    data_dir, _ = write_counting(tmp_path)
    splits = ["train", "val", "train"]
    a = draw(BatchSampler(data_dir, 8, 4, seed=3), splits)
    assert same(a, draw(BatchSampler(data_dir, 8, 4, seed=3), splits))
    assert not same(a, draw(BatchSampler(data_dir, 8, 4, seed=4), splits))


def test_ranks_draw_different_batches(tmp_path):
    """DDP ranks with one seed draw different batches (and (seed, rank) = (0, 1) differs from (1, 0))."""
    data_dir, _ = write_counting(tmp_path)
    batches = [
        draw(BatchSampler(data_dir, 8, 4, seed=s, rank=r), ["train"] * 3) for s, r in [(0, 0), (0, 1), (1, 0)]
    ]
    assert not same(batches[0], batches[1]) and not same(batches[1], batches[2])


def test_val_draws_do_not_change_the_train_stream(tmp_path):
    """Evaluating (drawing val batches) between training steps leaves the training batches as they were."""
    data_dir, _ = write_counting(tmp_path)
    plain = draw(BatchSampler(data_dir, 8, 4), ["train"] * 3)
    sampler = BatchSampler(data_dir, 8, 4)
    interleaved = [
        sampler.get_batch("train"),
        *draw(sampler, ["val"] * 5),
        sampler.get_batch("train"),
        sampler.get_batch("val"),
        sampler.get_batch("train"),
    ]
    assert same(plain, [interleaved[0], interleaved[6], interleaved[8]])


def test_state_dict_resumes_the_exact_stream(tmp_path):
    """A state saved in a weights_only checkpoint resumes the same batches, for rank 0 and for other ranks."""
    data_dir, _ = write_counting(tmp_path)
    rank0, rank1 = BatchSampler(data_dir, 8, 4, seed=5), BatchSampler(data_dir, 8, 4, seed=5, rank=1)
    for sampler in (rank0, rank1):
        draw(sampler, ["train", "train", "val", "train"])
    buffer = io.BytesIO()
    torch.save({"sampler": rank0.state_dict()}, buffer)  # only rank 0 saves, as in train.py
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)["sampler"]
    for sampler, rank in ((rank0, 0), (rank1, 1)):
        resumed = BatchSampler(data_dir, 8, 4, seed=0, rank=rank)
        resumed.load_state_dict(state)
        splits = ["train", "val", "train"]
        assert same(draw(sampler, splits), draw(resumed, splits))


def test_sampler_rejects_bad_split_and_short_data(tmp_path):
    """An unknown split name, and a split shorter than block_size + 1 tokens, are clear errors."""
    data_dir, _ = write_counting(tmp_path, n_val=10)
    with pytest.raises(UserError, match="block_size"):
        BatchSampler(data_dir, block_size=10, batch_size=2)
    sampler = BatchSampler(data_dir, block_size=9, batch_size=2)
    x, y = sampler.get_batch("val")  # exactly block_size + 1 tokens: the one window there is
    assert torch.equal(x[0], torch.arange(9)) and torch.equal(y[0], torch.arange(1, 10))
    with pytest.raises(ValueError, match="'train' or 'val'"):
        sampler.get_batch("test")


def break_dataset(data_dir, how):
    """Damage a dataset of write_counting(n_train=100, n_val=50, vocab_size=100)
    as a user or a crash might."""
    meta_path = data_dir / "meta.json"
    meta = json.loads(meta_path.read_text())
    if how == "no folder":
        shutil.rmtree(data_dir)
    elif how == "id beyond the vocabulary":
        np.full(100, 60000, dtype=np.uint16).tofile(
            data_dir / "train.bin"
        )  # same size, ids of another vocabulary
    elif how == "bin longer than meta says":
        with open(data_dir / "val.bin", "ab") as f:
            f.write(bytes(8))
    elif how == "bin missing":
        (data_dir / "val.bin").unlink()
    elif how == "meta missing":
        meta_path.unlink()
    elif how == "meta unreadable":
        meta_path.unlink()
        meta_path.mkdir()  # unreadable even to root, for whom chmod 000 is not
    elif how == "meta not JSON":
        meta_path.write_bytes(b"\x80 not json")
    elif how == "meta without vocab_size":
        meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "vocab_size"}))


# each damage: the file the message names and what it says to do
BROKEN_DATASETS = {
    "no folder": (
        "d",
        r"no dataset at \S+/d \(no such folder\): prepare it with .*python -m data\.text\.prepare "
        r"--input FILE --name d$",
    ),
    "id beyond the vocabulary": (
        "train.bin",
        r"holds token id 60000, outside meta\.json's vocabulary of 100 ids "
        r"\(0\.\.99\): the files disagree; re-run .* --replace$",
    ),
    "bin longer than meta says": (
        "val.bin",
        r"holds 108 bytes, but meta\.json says 50 uint16 tokens \(100 bytes\): "
        r"re-run .* --replace$",
    ),
    "bin missing": ("val.bin", r"not found: prepare the dataset with .* --replace$"),
    "meta missing": ("meta.json", r"not found: prepare the dataset with .* --replace$"),
    "meta unreadable": (
        "meta.json",
        r"not a usable dataset meta\.json \(IsADirectoryError: .*; re-run .* --replace$",
    ),
    "meta not JSON": (
        "meta.json",
        r"not a usable dataset meta\.json \(UnicodeDecodeError: .*; re-run .* --replace$",
    ),
    "meta without vocab_size": (
        "meta.json",
        r"not a usable dataset meta\.json \(TypeError: .*'vocab_size'\); re-run .* --replace$",
    ),
    "too short for block_size": (
        "d",
        r"the val split of \S+/d has 50 tokens, fewer than block_size \+ 1 = 61: "
        r"use a smaller block_size, or prepare a longer text$",
    ),
}


@pytest.mark.parametrize("how", BROKEN_DATASETS)
def test_a_broken_dataset_is_one_data_error_that_says_what_to_do(tmp_path, how):
    """Every way a dataset can disagree with itself is a one-line UserError from the sampler (as train.py
    opens it), naming the file and the fix; never a traceback from deep inside a batch."""
    data_dir, _ = write_counting(tmp_path / "d", n_train=100, n_val=50, vocab_size=100)
    break_dataset(data_dir, how)
    named, message = BROKEN_DATASETS[how]
    with pytest.raises(UserError) as info:
        BatchSampler(data_dir, block_size=60 if how == "too short for block_size" else 8, batch_size=2)
    text = str(info.value)
    assert "\n" not in text and f"{tmp_path}/d" in text and named in text, text
    assert re.search(message, text), text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_equal_cpu_batches(char_dir):
    """On CUDA the batches arrive on the device (through pinned memory) and equal the CPU ones."""
    cpu = BatchSampler(char_dir, 32, 4, device="cpu").get_batch("train")
    gpu = BatchSampler(char_dir, 32, 4, device="cuda").get_batch("train")
    assert gpu[0].is_cuda and all(torch.equal(c, g.cpu()) for c, g in zip(cpu, gpu))


def test_a_large_split_is_checked_in_chunks_that_reach_its_last_token(tmp_path, monkeypatch):
    """Past FULL_ID_SCAN_BYTES the id check reads 64 evenly spaced chunks, the last ending at the file's end,
    so a file of another tokenizer (wrong all through) is still caught without reading a 20 GB corpus
    whole."""
    monkeypatch.setattr(common, "FULL_ID_SCAN_BYTES", 1024)
    tokens = np.zeros(3 * common.ID_SCAN_CHUNK + 5, dtype=np.uint16)
    tokens[-1] = 7
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    stat = path.stat()
    assert common._largest_id(str(path), "uint16", stat.st_ino, stat.st_size, stat.st_mtime_ns) == 7
