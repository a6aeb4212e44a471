"""A damaged checkpoint or meta.json is one line naming what is wrong, in every entry point that opens it.

Each table below spoils a file a different way (an entry missing or of another type, weights that are not
finite, a dataset's meta.json without a field its generator needs) and runs it through the real entry points,
main(argv) in-process: every case must end in one line on stderr (`NAME.py: error: ...`), a non-zero exit
status and no traceback, or in the right result. Tiny models on CPU; no mocks.
"""

import json
import math
import os
import shutil
from collections import OrderedDict

import numpy as np
import pytest
import torch
from helpers import TINY_RUN, error_line

import sample
import train
from data.common import DATA_ROOT, ensure_prepared, load_meta
from lab import eval_length
from lab.experiments.runs import ensure_trained
from lab.perf import bench
from plumbing.checkpoint import open_checkpoint
from plumbing.run_folder import LOCK_NAME, take_lock


@pytest.fixture(scope="module")
def finished_dir(tmp_path_factory):
    """A finished two-step run, study/base: copy it before changing anything."""
    out_dir = tmp_path_factory.mktemp("finished") / "study" / "base"
    train.main([*TINY_RUN, f"--out_dir={out_dir}"])
    return out_dir


@pytest.fixture(scope="module")
def finished(finished_dir):
    """Its ckpt.pt, loaded: the checkpoint each case spoils a copy of."""
    return torch.load(finished_dir / "ckpt.pt", weights_only=True)


def nan_weights(ckpt):
    ckpt["model"]["transformer.h.0.attn.c_attn.weight"][0, 0] = math.nan


def as_dtype(path, dtype):
    """A change that stores the tensor at path ("model/lm_head.weight") as dtype."""

    def change(ckpt):
        *parents, last = path.split("/")
        for key in parents:  # optimizer.state's keys are ints
            ckpt = ckpt[int(key) if key.isdigit() else key]
        ckpt[last] = ckpt[last].to(dtype)

    return change


def set_entry(path, value):
    """A change to one entry of the checkpoint dict, path like "rng/0/python"."""

    def change(ckpt):
        *parents, last = path.split("/")
        for key in parents:
            ckpt = ckpt[int(key)] if isinstance(ckpt, list) else ckpt[key]
        if value is DELETE:
            del ckpt[last]
        else:
            ckpt[int(last) if isinstance(ckpt, list) else last] = value

    return change


DELETE = object()
READ = "read"  # the entry every reader reads (sample.py, lab/eval_length, --init_from, --resume)
RESUMED = "resumed"  # an entry only --resume reads (the other readers accept the file)
# (case, whose readers refuse it, train.py --init_from's exit status, how the checkpoint is spoilt, words the
# line must hold: Python's reason for a value a dataclass's rule refuses, or the general mechanism's words);
# the status is 2 where reading --init_from's model settings for its flags finds it, 1 where loading does
DAMAGED_CHECKPOINTS = [
    ("no meta", READ, 1, set_entry("meta", DELETE), "not a usable checkpoint (KeyError: 'meta')"),
    ("meta None", READ, 1, set_entry("meta", None), "not a usable checkpoint (AttributeError: "),
    ("no model", READ, 2, set_entry("model", DELETE), "not a usable checkpoint (KeyError: 'model')"),
    ("model_config a list", READ, 2, set_entry("model_config", [1, 2]), "not a usable checkpoint (TypeError"),
    (
        "model_config without block_size",
        READ,
        2,
        set_entry("model_config/block_size", DELETE),
        "not a usable checkpoint (KeyError: 'block_size')",
    ),
    ("n_head a string", READ, 2, set_entry("model_config/n_head", "2"), "n_head must be an integer, got '2'"),
    (
        "n_head zero",
        READ,
        2,
        set_entry("model_config/n_head", 0),
        "(ValueError: n_head must be >= 1 (a positive integer), got 0)",
    ),
    ("unknown model field", READ, 2, set_entry("model_config/n_experts", 8), "'n_experts'"),
    (
        "unknown setting",
        READ,
        2,
        set_entry("model_config/pos_settings/rope_warp", 2.0),
        "(ValueError: rope_warp: no setting of pos=rope)",
    ),
    (
        "setting a string",
        READ,
        2,
        set_entry("model_config/pos_settings/rope_base", "big"),
        "rope_base must be a number, got 'big'",
    ),
    ("settings a list", READ, 2, set_entry("model_config/pos_settings", [1]), "pos_settings is a list"),
    ("model a list", READ, 2, set_entry("model", []), "model is a list, not a state dict"),
    (
        "a weight a string",
        READ,
        1,
        set_entry("model/lm_head.weight", "w"),
        "not floating-point lm_head.weight",
    ),
    ("iter_num a string", READ, 2, set_entry("iter_num", "2"), "iter_num must be an integer, got '2'"),
    ("iter_num negative", READ, 2, set_entry("iter_num", -5), "iter_num must be >= 0, got -5"),
    ("best_iter negative", READ, 2, set_entry("best_iter", -1), "best_iter must be >= 0, got -1"),
    ("evaluated_iter negative", READ, 2, set_entry("evaluated_iter", -2), "evaluated_iter must be >= 0"),
    (
        "best_val_loss NaN",
        READ,
        2,
        set_entry("best_val_loss", math.nan),
        "best_val_loss must be a number, got nan",
    ),
    ("best_val_loss -inf", READ, 2, set_entry("best_val_loss", -math.inf), "best_val_loss must be >= 0"),
    ("no best_iter", READ, 2, set_entry("best_iter", DELETE), "(KeyError: 'best_iter')"),
    (
        "int64 weights",
        READ,
        1,
        as_dtype("model/transformer.h.0.ln_1.weight", torch.int64),
        "not floating-point transformer.h.0.ln_1.weight (int64)",
    ),
    (
        "complex weights",
        READ,
        1,
        as_dtype("model/transformer.wte.weight", torch.complex64),
        "not floating-point transformer.wte.weight (complex64)",
    ),
    ("NaN weights", READ, 1, nan_weights, "weights that are not finite (NaN or inf) in transformer.h.0.attn"),
    ("rng a string", RESUMED, 1, set_entry("rng", "state"), "not a usable checkpoint (TypeError: "),
    (
        "python rng cut short",
        RESUMED,
        1,
        set_entry("rng/0/python", [3, [1, 2], None]),
        "not a usable checkpoint (ValueError: ",
    ),
    (
        "torch rng cut short",
        RESUMED,
        1,
        set_entry("rng/0/torch", torch.zeros(3, dtype=torch.uint8)),
        "not a usable checkpoint (RuntimeError: ",
    ),
    ("empty sampler", RESUMED, 1, set_entry("sampler", {}), "not a usable checkpoint (KeyError: 'train')"),
    ("optimizer a string", RESUMED, 1, set_entry("optimizer", "adamw"), "its AdamW state does not fit"),
]
EVAL = ["--lengths=1", "--max_windows=1", "--device=cpu", "--progress=false"]


@pytest.mark.parametrize(
    "case, readers, init_status, spoil, words", DAMAGED_CHECKPOINTS, ids=[c[0] for c in DAMAGED_CHECKPOINTS]
)
def test_a_damaged_checkpoint_is_one_line_in_every_entry_point(
    tmp_path, capsys, finished, case, readers, init_status, spoil, words
):
    """sample.py, lab/eval_length.py, train.py --init_from and --resume each refuse the spoilt file (those
    that read the entry) in one line naming the file and why, before any work: the run folder as it was."""
    ckpt = torch.load(_saved(finished, tmp_path / "whole.pt"), weights_only=True)  # a deep copy
    spoil(ckpt)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    torch.save(ckpt, out_dir / "ckpt.pt")
    _refused_everywhere(capsys, tmp_path, out_dir, words, init_status, resume_only=readers == RESUMED)


def _refused_everywhere(capsys, tmp_path, out_dir, words, init_status, resume_only=False):
    """Every entry point that reads out_dir/ckpt.pt says one line naming it and holding words, with its
    status; nothing in out_dir changes and no --init_from run's folder is made."""
    before = (out_dir / "ckpt.pt").read_bytes()
    runs = [
        (sample, [f"--out_dir={out_dir}", "--max_new_tokens=4", "--stream=off"], 1),
        (eval_length, [str(out_dir), *EVAL], 1),
        (train, [*TINY_RUN, f"--init_from={out_dir}", f"--out_dir={tmp_path / 'new'}"], init_status),
        (train, [*TINY_RUN, f"--out_dir={out_dir}", "--resume", "--max_iters=3"], 1),
    ]
    for script, argv, status in runs[3:] if resume_only else runs:
        err = error_line(capsys, script, argv, status)
        assert f"{out_dir / 'ckpt.pt'}: " in err and words in err, (script.__name__, err)
    assert (out_dir / "ckpt.pt").read_bytes() == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in out_dir.iterdir()) == ["ckpt.pt"]


DAMAGED_BYTES = [  # (case, the file's bytes from the whole checkpoint's): not a checkpoint torch can read
    ("truncated", lambda data: data[: len(data) // 2]),
    ("empty", lambda data: b""),
    ("random bytes", lambda data: np.random.default_rng(0).bytes(4096)),
    ("a flipped byte in its pickle", lambda data: data.replace(b"model_config", b"model_confiX", 1)),
]


@pytest.mark.parametrize("case, damage", DAMAGED_BYTES, ids=[c[0] for c in DAMAGED_BYTES])
def test_a_checkpoint_file_torch_cannot_read_is_one_line_in_every_entry_point(
    tmp_path, capsys, finished_dir, case, damage
):
    """A checkpoint cut short, emptied or overwritten: torch.load's own error, through the one boundary, is
    one line naming the file, status 1 (2 for --init_from, whose model settings are its flags' defaults)."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    (out_dir / "ckpt.pt").write_bytes(damage((finished_dir / "ckpt.pt").read_bytes()))
    words = "not a posgpt checkpoint" if case.startswith("a flipped") else "not a usable checkpoint ("
    _refused_everywhere(capsys, tmp_path, out_dir, words, init_status=2)


def _saved(ckpt, path):
    torch.save(ckpt, path)
    return path


def test_what_train_py_writes_is_read_back_whole(finished, tmp_path):
    """open_checkpoint's read-back is no stricter than train.py: its own checkpoint loads whole."""
    assert open_checkpoint(_saved(finished, tmp_path / "ckpt.pt")).keys() == finished.keys()


def test_a_checkpoint_written_before_any_evaluation_is_accepted_and_resumes(finished, tmp_path, capsys):
    """A run stopped before its first evaluation wrote best_val_loss inf, best_iter and evaluated_iter None:
    Progress's rules take them (a NaN or negative loss, or a negative step, is damage); --resume evaluates."""
    unevaluated = {"best_val_loss": math.inf, "best_iter": None, "evaluated_iter": None, "finished": False}
    ckpt = finished | unevaluated
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    assert open_checkpoint(_saved(ckpt, out_dir / "ckpt.pt"))["best_val_loss"] == math.inf
    result = train.main([*TINY_RUN, f"--out_dir={out_dir}", "--resume"])
    assert (
        f"resuming {out_dir / 'ckpt.pt'} at step 2 (best val loss inf at step None)"
        in capsys.readouterr().out
    )
    assert result["iter_num"] == 2 and math.isfinite(result["best_val_loss"]) and result["best_iter"] == 2


# -----------------------------------------------------------------------------
# an out_dir holding what train.py cannot continue: the way out is --overwrite or another folder


class Shell:
    """Unpickled, it would run a shell command: what a malicious checkpoint carries."""

    def __reduce__(self):
        return os.system, ("true",)


def sampling_only(ckpt):
    return {key: ckpt[key] for key in ("model", "model_config", "meta")}


FOREIGN_CHECKPOINTS = [  # (case, what out_dir/ckpt.pt holds, given the finished run's checkpoint)
    ("unreadable", lambda ckpt: b"\x00not a checkpoint"),
    ("GPT-2's state dict", lambda ckpt: OrderedDict({"wte.weight": torch.zeros(4, 2)})),
    ("nanoGPT's", lambda ckpt: {"model": ckpt["model"], "model_args": {"n_layer": 1}, "iter_num": 2}),
    ("malicious", lambda ckpt: {**ckpt, "meta": Shell()}),
    ("sampling only", sampling_only),
    ("damaged", lambda ckpt: {**ckpt, "best_val_loss": math.nan}),
]


@pytest.mark.parametrize("case, contents", FOREIGN_CHECKPOINTS, ids=[c[0] for c in FOREIGN_CHECKPOINTS])
def test_a_folder_whose_checkpoint_cannot_be_continued_is_refused_without_advising_resume(
    tmp_path, capsys, finished, case, contents
):
    """train.py in a folder whose ckpt.pt is unreadable, foreign, malicious, damaged or cannot be resumed says
    why, and offers --overwrite or another --out_dir, never --resume, which cannot work there; --resume itself
    says the same way out."""
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    held = contents(finished)
    if isinstance(held, bytes):
        (out_dir / "ckpt.pt").write_bytes(held)
    else:
        torch.save(held, out_dir / "ckpt.pt")
    before = (out_dir / "ckpt.pt").read_bytes()
    err = error_line(capsys, train, [*TINY_RUN, f"--out_dir={out_dir}"], 1)
    assert "cannot be continued (" in err and "--overwrite starts again" in err and "--resume" not in err, err
    err = error_line(capsys, train, [*TINY_RUN, f"--out_dir={out_dir}", "--resume"], 1)
    assert "another --out_dir" in err, err
    assert (out_dir / "ckpt.pt").read_bytes() == before


def test_a_copied_run_is_finished_not_in_use_and_a_copied_study_is_the_same_runs(
    tmp_path, capsys, finished_dir
):
    """A run folder copied while a run holds it (cp -r while it trains) is not in use: the copy's train.lock
    is a file, the lock (the kernel's) stays on the original. A study's runs copied together, a fine-tune's
    --init_from pointing into them, are reused as finished, not refused as other runs."""
    source, copy = tmp_path / "study", tmp_path / "copy"
    shutil.copytree(finished_dir, source / "base")
    base = [*TINY_RUN, f"--out_dir={source / 'base'}"]
    tune = [*TINY_RUN, f"--init_from={source / 'base'}", "--block_size=32", f"--out_dir={source / 'tune'}"]
    train.main(tune)
    held = take_lock(source / "base" / LOCK_NAME)  # this process holds base, as a run training there would
    try:
        shutil.copytree(source, copy)
        assert "in use by another run" in error_line(capsys, train, base, 1)
        err = error_line(capsys, train, [*TINY_RUN, f"--out_dir={copy / 'base'}"], 1)
        assert f"{copy / 'base'} holds a finished run (step 2 of 2)" in err, err
        commands = [[a.replace(str(source), str(copy)) for a in argv] for argv in (base, tune)]
        logged = []
        assert ensure_trained(commands, log=logged.append) == [copy / "base", copy / "tune"]
    finally:
        os.close(held)
    assert all(line.startswith("using ") and line.endswith(", finished") for line in logged), logged


# -----------------------------------------------------------------------------
# a damaged meta.json


@pytest.fixture
def dataset():
    """A char dataset data/<name> written by hand from shakespeare_char's vocabulary, for a test to spoil its
    meta.json; removed after it."""
    name = f"test_damaged_files_{os.getpid()}"
    folder = DATA_ROOT / name
    folder.mkdir()
    meta = load_meta(ensure_prepared("shakespeare_char"))
    ids = (np.arange(200) % meta["vocab_size"]).astype(np.uint16)
    for split in ("train", "val"):
        ids.tofile(folder / f"{split}.bin")
    yield name, folder, {**meta, "train_tokens": 200, "val_tokens": 200}
    shutil.rmtree(folder)


DAMAGED_META = [  # (case, meta.json's text from its fields, words the line must hold)
    ("truncated", lambda meta: json.dumps(meta)[:40], "(JSONDecodeError: "),
    ("empty", lambda meta: "", "(JSONDecodeError: Expecting value"),
    ("random bytes", lambda meta: np.random.default_rng(0).bytes(256), "(UnicodeDecodeError: "),
    ("a list", lambda meta: json.dumps([meta]), "(TypeError: "),
    ("no dtype", lambda meta: json.dumps({k: v for k, v in meta.items() if k != "dtype"}), "'dtype'"),
    ("an unknown field", lambda meta: json.dumps(meta | {"stoi": {}}), "'stoi'"),
    (
        "train_tokens negative",
        lambda meta: json.dumps(meta | {"train_tokens": -1}),
        "train_tokens must be >=",
    ),
    ("dtype unknown", lambda meta: json.dumps(meta | {"dtype": "int8"}), "dtype='int8' is not one of uint16"),
    ("generator a string", lambda meta: json.dumps(meta | {"generator": "passkey"}), "(TypeError: "),
    (
        "generator of no name",
        lambda meta: json.dumps(meta | {"generator": {"filler_segment": [4, 16]}, "sample_length": 20}),
        "(KeyError: 'name')",
    ),
    (
        "generator without sample_length",
        lambda meta: json.dumps(meta | {"generator": {"name": "passkey"}}),
        "needs sample_length",
    ),
    (
        "filler a string",
        lambda meta: json.dumps(meta | {"generator": {"name": "passkey", "filler_segment": "4-16"}}),
        "filler_segment '4-16'",
    ),
    (
        "vocab_size a string",
        lambda meta: json.dumps(meta | {"vocab_size": "65"}),
        "vocab_size must be an int",
    ),
    ("chars cut short", lambda meta: json.dumps(meta | {"chars": ["a"]}), "a char tokenizer needs chars"),
]


@pytest.mark.parametrize("case, text, words", DAMAGED_META, ids=[c[0] for c in DAMAGED_META])
def test_a_damaged_meta_json_is_one_line_in_every_entry_point(tmp_path, capsys, dataset, case, text, words):
    """train.py and lab.perf.bench on a dataset whose meta.json is cut short, empty, random bytes, of a
    wrong type, missing a field or holding a value a DatasetMeta rule refuses: one line naming the file and
    Python's reason or the rule, status 1, the dataset as it was."""
    name, folder, meta = dataset
    damaged = text(meta)
    path = folder / "meta.json"
    path.write_bytes(damaged if isinstance(damaged, bytes) else damaged.encode())
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    runs = [
        (train, [*TINY_RUN, f"--dataset={name}", f"--out_dir={tmp_path / 'run'}"]),
        (bench, [f"--dataset={name}", "--device=cpu"]),
    ]
    for script, argv in runs:
        err = error_line(capsys, script, argv, 1)
        assert f"{path}: not a usable dataset meta.json (" in err and words in err, err
        assert err.endswith(f"--name {name} --replace"), err  # how to make it again
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before and not (tmp_path / "run").exists()
