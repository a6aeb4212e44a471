"""Passkey retrieval: the dataset states each key where it is asked to, the scorer counts what a model
retrieves, the two scoring paths agree, and lab/eval_length.py --task=passkey writes what it promises."""

import csv
import json
import os
import shutil
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import error_line

import train
from data.common import DATA_ROOT, load_meta
from data.passkey import prepare as passkey_prepare
from data.passkey.task import (
    CHARS,
    FILLER,
    KEY_DIGITS,
    MARKER,
    draw_filler,
    eval_sample,
    filler_length,
    is_eval_key,
    training_sample,
)
from lab import eval_length
from lab.measure.retrieval import (
    answers_by_forward,
    answers_by_greedy,
    count_correct,
    passkey_batch,
    wilson_interval,
)
from model import GPT, GPTConfig
from plumbing.tokenizers import get_tokenizer
from positions import POS_SCHEMES

STOI = {c: i for i, c in enumerate(CHARS)}


@pytest.mark.parametrize("length", [13, 65, 300])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_eval_sample_states_its_key_once_at_the_depth_asked(length, depth):
    rng = np.random.default_rng(7)
    sample = eval_sample(rng, length, depth)
    n_filler = filler_length(length)
    assert len(sample.text) == length and sample.text.count(MARKER) == 2  # stated once, asked once
    assert sample.statement_start == round(depth * n_filler)  # the filler characters before the statement
    assert sample.text[sample.statement_start :].startswith(f"{MARKER}{sample.key}.")
    assert (
        sample.text[sample.answer_start - 1 :] == f"{MARKER}{sample.key}"
        and sample.answer_start == length - 5
    )
    assert is_eval_key(int(sample.key))
    filler = (
        sample.text[: sample.statement_start]
        + sample.text[sample.statement_start + 7 : sample.answer_start - 1]
    )
    assert len(filler) == n_filler and set(filler) <= set(FILLER)


def test_filler_repeats_one_segment_of_4_to_16_characters():
    rng = np.random.default_rng(3)
    periods = []
    for _ in range(200):
        filler = draw_filler(rng, 200)
        assert len(filler) == 200 and set(filler) <= set(FILLER)
        periods.append(next(n for n in range(1, 201) if filler == (filler[:n] * (200 // n + 1))[:200]))
    assert 4 <= min(periods) and max(periods) <= 16 and len(set(periods)) == 13  # every length drawn


def test_passkey_meta_records_the_filler_it_was_made_with(tmp_path):
    meta = passkey_prepare.prepare(tmp_path / "pk", block_size=32, train_samples=4, val_samples=2)
    assert meta["generator"] == {"name": "passkey", "filler_segment": [4, 16]}


@pytest.fixture
def passkey_without_generator():
    """data/<name>: a passkey dataset whose meta.json names no "generator", so its filler segments are of 8
    to 32 characters, not the task's 4 to 16."""
    name = f"test_passkey_old_{os.getpid()}"
    passkey_prepare.prepare(DATA_ROOT / name, block_size=32, train_samples=8, val_samples=4)
    meta_path = DATA_ROOT / name / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["generator"]
    meta_path.write_text(json.dumps(meta))
    yield name
    shutil.rmtree(DATA_ROOT / name)


def test_a_passkey_dataset_without_a_recorded_generator_is_refused_in_one_line_and_kept(
    capsys, passkey_without_generator, tmp_path
):
    """Trained on it, a model would be scored on filler unlike its training:
    train.py says how to make it again."""
    folder = DATA_ROOT / passkey_without_generator
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    err = error_line(
        capsys,
        train,
        [
            f"--dataset={passkey_without_generator}",
            "--block_size=32",
            "--max_iters=1",
            f"--out_dir={tmp_path / 'run'}",
        ],
        status=1,
    )
    assert "filler segments of 8 to 32 characters, the task's are now 4 to 16" in err, err
    assert (
        f"python -m data.passkey.prepare --block_size 32 --name {passkey_without_generator} --replace" in err
    ), err
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before and not (tmp_path / "run").exists()


def test_training_keys_and_evaluation_keys_are_apart_and_about_one_in_ten():
    rng = np.random.default_rng(0)
    for _ in range(200):
        assert not is_eval_key(int(training_sample(rng, 65, "train").key))
    share = np.mean([is_eval_key(k) for k in range(100_000)])
    assert 0.09 < share < 0.11
    # the split does not follow a digit: each last digit is about as common among evaluation keys
    last = np.bincount([k % 10 for k in range(100_000) if is_eval_key(k)], minlength=10)
    assert last.min() > 0.8 * last.mean()


def test_a_sample_too_short_for_its_key_is_refused():
    with pytest.raises(ValueError, match="cannot hold a statement and its question"):
        eval_sample(np.random.default_rng(0), 12, 0.5)


def test_passkey_dataset_round_trips_through_its_vocabulary_and_windows_hold_whole_samples(tmp_path):
    data_dir = tmp_path / "pk"
    meta = passkey_prepare.prepare(data_dir, block_size=32, train_samples=40, val_samples=8)
    assert load_meta(data_dir) == meta and meta["sample_length"] == 33 and meta["chars"] == CHARS
    tokenizer = get_tokenizer(meta)
    val = np.fromfile(data_dir / "val.bin", dtype=meta["dtype"])
    text = tokenizer.decode(val.tolist())
    assert tokenizer.encode(text) == val.tolist()
    samples = [text[i : i + 33] for i in range(0, len(text), 33)]
    assert all(sample.count(MARKER) == 2 and is_eval_key(int(sample[-KEY_DIGITS:])) for sample in samples)
    from data.common import BatchSampler

    x, y = BatchSampler(data_dir, 32, 16, seed=3).get_batch("train")
    for row in torch.cat([x, y[:, -1:]], 1).tolist():
        window = tokenizer.decode(row)  # a whole sample: the question and answer end it
        assert window.count(MARKER) == 2 and window[-KEY_DIGITS - 1] == MARKER
        assert not is_eval_key(int(window[-KEY_DIGITS:]))


# -----------------------------------------------------------------------------
# The scorer, on toy models that retrieve perfectly or not at all


class CopyAfterMarker(nn.Module):
    """Predicts, at each position, the character that followed the first marker as many places after it as
    this position is after the last marker: a perfect passkey retriever, written by hand."""

    length_limit = None

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.full((B, T, len(CHARS)), -1.0)
        for b, row in enumerate(idx.tolist()):
            markers = [i for i, token in enumerate(row) if token == STOI[MARKER]]
            for p in range(T):
                seen = [m for m in markers if m <= p]
                if len(seen) == 2:
                    logits[b, p, row[seen[0] + p - seen[1] + 1]] = 1.0
        return logits, None


class FixedKey(nn.Module):
    """Always answers 12345."""

    length_limit = None

    def forward(self, idx):
        B, T = idx.shape
        logits = torch.zeros(B, T, len(CHARS))
        logits[:, :, STOI["1"]] = 1.0
        logits[:, -KEY_DIGITS:, [STOI[d] for d in "12345"]] += torch.eye(KEY_DIGITS) * 2
        return logits, None


def test_scorer_gives_all_to_a_model_that_copies_after_the_marker_and_chance_to_a_fixed_answer():
    tokens, answer_start = passkey_batch(STOI, 40, 0.5, 30, seed=0)
    # read in 40 tokens, the last digit a target only: at L = T the answer sits where training puts it
    assert tokens.shape == (30, 41) and answer_start == 36
    assert count_correct(CopyAfterMarker(), tokens, answer_start) == 30
    assert count_correct(FixedKey(), tokens, answer_start) == 0  # chance is 1e-5 per trial


@pytest.mark.parametrize(
    "correct, trials, low, high",
    [
        (0, 50, 0.0, 0.0713),  # the 95% Wilson interval, as statsmodels' proportion_confint(method="wilson")
        (50, 50, 0.9287, 1.0),
        (25, 50, 0.3664, 0.6336),
        (8, 10, 0.4902, 0.9433),
    ],
)
def test_wilson_interval_matches_known_values(correct, trials, low, high):
    assert wilson_interval(correct, trials) == pytest.approx((low, high), abs=1e-4)


@pytest.mark.parametrize("pos", POS_SCHEMES)
@pytest.mark.parametrize("length", [24, 48])  # inside and (2 x) past T = 24
def test_forward_and_greedy_scoring_agree_on_exact_match(pos, length):
    """The forward pass with an answer appended scores it all correct exactly when greedy decoding (KV cache)
    writes it: checked with the model's own greedy answer (all correct) and with one digit changed (none)."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig.from_flat(block_size=24, vocab_size=len(CHARS), n_layer=2, n_head=2, n_embd=32, pos=pos)
    ).eval()
    tokens, answer_start = passkey_batch(STOI, length, 0.5, 6, seed=1)
    greedy = answers_by_greedy(model, tokens, answer_start)
    tokens[:, answer_start:] = greedy
    assert torch.equal(answers_by_forward(model, tokens, answer_start), greedy)
    assert count_correct(model, tokens, answer_start) == 6
    tokens[:, -1] = (tokens[:, -1] + 1 - STOI["0"]) % 10 + STOI["0"]  # another last digit: no longer greedy's
    assert count_correct(model, tokens, answer_start) == 0


# -----------------------------------------------------------------------------
# lab/eval_length.py --task=passkey


def test_passkey_csv_has_the_promised_columns_and_one_line_per_cell(tmp_path):
    torch.manual_seed(0)
    model = GPT(
        GPTConfig.from_flat(block_size=16, vocab_size=len(CHARS), n_layer=1, n_head=2, n_embd=16, pos="rope")
    )
    ckpt = tmp_path / "ckpt.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "model_config": asdict(model.config),
            "meta": {"tokenizer": "char", "vocab_size": len(CHARS), "chars": CHARS},
            "train_config": {"dataset": "passkey"},
        },
        ckpt,
    )
    out = tmp_path / "passkey.csv"
    rows = eval_length.main(
        [
            str(ckpt),
            "--task=passkey",
            "--lengths=1,2",
            "--depths=0,1",
            "--trials=4",
            "--rope_scalings=linear",
            "--csv",
            str(out),
            "--progress=false",
        ]
    )
    with open(out, newline="") as f:
        lines = list(csv.reader(f))
    assert tuple(lines[0]) == eval_length.PASSKEY_COLUMNS
    assert len(lines) - 1 == 2 * 2 * 2  # (plain, linear) x 2 lengths x 2 depths
    for line in lines[1:]:
        record = dict(zip(lines[0], line))
        assert int(record["trials"]) == 4 and 0 <= int(record["correct"]) <= 4
        low, high = float(record["ci_low"]), float(record["ci_high"])
        assert low <= float(record["accuracy"]) <= high
    assert {row.scaling for row in rows} == {"plain", "linear"}


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--task=recall"], ["--task", "choose from 'loss', 'passkey'"]),
        (["--task=passkey", "--depths=0,1.5"], ["--depths", "1.5", "fractions from 0 to 1"]),
        (["--task=passkey", "--trials=0"], ["trials must be >= 1"]),
        (["--task=passkey", "--positions_csv=p.csv"], ["--positions_csv", "--task=loss only"]),
    ],
)
def test_passkey_flag_errors_are_one_line(capsys, argv, words):
    err = error_line(capsys, eval_length, ["out/x", *argv], 2)
    for word in words:
        assert word in err


def test_passkey_on_a_checkpoint_of_another_vocabulary_is_one_line(capsys, tmp_path):
    model = GPT(GPTConfig.from_flat(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=16, pos="rope"))
    ckpt = tmp_path / "ckpt.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "model_config": asdict(model.config),
            "meta": {"tokenizer": "char", "vocab_size": 65, "chars": [chr(32 + i) for i in range(65)]},
            "train_config": {"dataset": "shakespeare_char"},
        },
        ckpt,
    )
    err = error_line(capsys, eval_length, [str(ckpt), "--task=passkey", "--progress=false"], 1)
    assert "passkey vocabulary" in err
