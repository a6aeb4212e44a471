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
# (case, train.py --init_from's exit status, how the checkpoint is spoilt, words the error must hold): the
# status is 2 where reading --init_from's model settings with the flags finds it, 1 where loading it does
DAMAGED_CHECKPOINTS = [
    ("no meta", 1, set_entry("meta", DELETE), "no meta entry"),
    ("meta None", 2, set_entry("meta", None), "meta is None, not a dict"),
    ("model_config a list", 2, set_entry("model_config", [1, 2]), "model_config is a list, not a dict"),
    ("model_config without block_size", 2, set_entry("model_config/block_size", DELETE), "has no block_size"),
    ("n_head a string", 2, set_entry("model_config/n_head", "2"), "model_config.n_head is '2', not an int"),
    (
        "n_head zero",
        2,
        set_entry("model_config/n_head", 0),
        "model_config: n_head must be >= 1 (a positive integer), got 0",
    ),
    ("unknown model field", 2, set_entry("model_config/n_experts", 8), "unknown fields n_experts"),
    (
        "unknown setting",
        2,
        set_entry("model_config/pos_settings/rope_warp", 2.0),
        "model_config.pos_settings has rope_warp, no setting of pos=rope",
    ),
    (
        "setting a string",
        2,
        set_entry("model_config/pos_settings/rope_base", "big"),
        "model_config.pos_settings.rope_base is 'big', not a float",
    ),
    (
        "settings a list",
        2,
        set_entry("model_config/pos_settings", [1]),
        "model_config.pos_settings is a list",
    ),
    ("model a list", 2, set_entry("model", []), "model is a list, not a dict"),
    (
        "a weight a string",
        2,
        set_entry("model/lm_head.weight", "w"),
        "model.lm_head.weight is 'w', not a Tensor",
    ),
    ("rng a string", 2, set_entry("rng", "state"), "rng is 'state', not a non-empty list"),
    ("python rng cut short", 2, set_entry("rng/0/python", [3, [1, 2], None]), "rng[0].python is a list"),
    (
        "torch rng cut short",
        2,
        set_entry("rng/0/torch", torch.zeros(3, dtype=torch.uint8)),
        "rng[0].torch is",
    ),
    ("empty sampler", 2, set_entry("sampler", {}), "sampler has no train, eval"),
    ("iter_num a string", 2, set_entry("iter_num", "2"), "iter_num is '2', not an int"),
    ("max_iters a string", 2, set_entry("train_config/max_iters", "2"), "train_config.max_iters is '2'"),
    ("iter_num negative", 2, set_entry("iter_num", -5), "iter_num is -5, not an int >= 0"),
    ("best_iter negative", 2, set_entry("best_iter", -1), "best_iter is -1, not an int >= 0 or None"),
    ("evaluated_iter negative", 2, set_entry("evaluated_iter", -2), "evaluated_iter is -2, not an int >= 0"),
    ("best_val_loss NaN", 2, set_entry("best_val_loss", math.nan), "best_val_loss is nan, not a loss >= 0"),
    ("best_val_loss -inf", 2, set_entry("best_val_loss", -math.inf), "best_val_loss is -inf, not a loss"),
    (
        "int64 weights",
        2,
        as_dtype("model/transformer.h.0.ln_1.weight", torch.int64),
        "model.transformer.h.0.ln_1.weight is a Tensor of int64, not a Tensor of floats",
    ),
    (
        "complex weights",
        2,
        as_dtype("model/transformer.wte.weight", torch.complex64),
        "model.transformer.wte.weight is a Tensor of complex64, not a Tensor of floats",
    ),
    (
        "int64 optimizer moments",
        2,
        as_dtype("optimizer/state/0/exp_avg", torch.int64),
        "optimizer.state.0.exp_avg is a Tensor of int64, not a Tensor of floats",
    ),
    (
        "cuda rng of int64",
        2,
        set_entry("rng/0/cuda", torch.zeros(16, dtype=torch.int64)),
        "rng[0].cuda is a Tensor of int64, not a Tensor of uint8 or None",
    ),
    (
        "NaN weights",
        1,
        nan_weights,
        "weights that are not finite (NaN or inf) in transformer.h.0.attn.c_attn",
    ),
]
EVAL = ["--lengths=1", "--max_windows=1", "--device=cpu", "--progress=false"]


@pytest.mark.parametrize(
    "case, init_status, spoil, words", DAMAGED_CHECKPOINTS, ids=[c[0] for c in DAMAGED_CHECKPOINTS]
)
def test_a_damaged_checkpoint_is_one_line_in_every_entry_point(
    tmp_path, capsys, finished, case, init_status, spoil, words
):
    """sample.py, lab/eval_length.py, train.py --init_from and --resume each refuse the spoilt file in one
    line naming the entry, and the run folder is left as it was."""
    ckpt = torch.load(_saved(finished, tmp_path / "whole.pt"), weights_only=True)  # a deep copy
    spoil(ckpt)
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    torch.save(ckpt, out_dir / "ckpt.pt")
    before = (out_dir / "ckpt.pt").read_bytes()
    runs = [
        (sample, [f"--out_dir={out_dir}", "--max_new_tokens=4", "--stream=off"], 1),
        (eval_length, [str(out_dir), *EVAL], 1),
        (train, [*TINY_RUN, f"--init_from={out_dir}", f"--out_dir={tmp_path / 'new'}"], init_status),
        (train, [*TINY_RUN, f"--out_dir={out_dir}", "--resume", "--max_iters=3"], 1),
    ]
    for script, argv, status in runs:
        err = error_line(capsys, script, argv, status)
        assert "ckpt.pt" in err and words in err, (script.__name__, err)
    assert (out_dir / "ckpt.pt").read_bytes() == before and not (tmp_path / "new").exists()
    assert sorted(p.name for p in out_dir.iterdir()) == ["ckpt.pt"]


def _saved(ckpt, path):
    torch.save(ckpt, path)
    return path


def test_the_schema_accepts_what_train_py_writes(finished, tmp_path):
    """The schema is no stricter than train.py: its own checkpoint loads whole."""
    assert open_checkpoint(_saved(finished, tmp_path / "ckpt.pt")).keys() == finished.keys()


def test_a_checkpoint_written_before_any_evaluation_is_accepted_and_resumes(finished, tmp_path, capsys):
    """A run stopped before its first evaluation wrote best_val_loss inf, best_iter and evaluated_iter None:
    the schema takes them (a NaN or negative loss, or a negative step, is damage); --resume evaluates."""
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
    ("damaged", lambda ckpt: {**ckpt, "rng": "state"}),
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


DAMAGED_META = [  # (case, a change to meta.json's fields, words the error must hold)
    ("generator a string", {"generator": "passkey"}, "generator must name one of passkey"),
    (
        "generator of no name",
        {"generator": {"filler_segment": [4, 16]}, "sample_length": 20},
        "generator must",
    ),
    ("generator without sample_length", {"generator": {"name": "passkey"}}, "needs sample_length"),
    (
        "filler a string",
        {"generator": {"name": "passkey", "filler_segment": "4-16"}, "sample_length": 20},
        "generator must",
    ),
    ("vocab_size a string", {"vocab_size": "65"}, "vocab_size must be an int >= 1, got '65'"),
    ("chars cut short", {"chars": ["a"]}, "a char tokenizer needs chars, the 65 characters"),
]


@pytest.mark.parametrize("case, change, words", DAMAGED_META, ids=[c[0] for c in DAMAGED_META])
def test_a_damaged_meta_json_is_one_line_in_every_entry_point(tmp_path, capsys, dataset, case, change, words):
    """train.py, lab/eval_length.py and lab.perf.bench on a dataset whose meta.json is damaged: one line
    naming the file and the field, the dataset as it was."""
    name, folder, meta = dataset
    (folder / "meta.json").write_text(json.dumps(meta | change))
    runs = [
        (train, [*TINY_RUN, f"--dataset={name}", f"--out_dir={tmp_path / 'run'}"]),
        (bench, [f"--dataset={name}", "--device=cpu"]),
    ]
    for script, argv in runs:
        err = error_line(capsys, script, argv, 1)
        assert f"{folder / 'meta.json'}: " in err and words in err, err
    assert json.loads((folder / "meta.json").read_text()) == meta | change
