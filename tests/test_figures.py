"""python -m lab.demo.figures: the figures are deterministic, the analytic ones use the model's formulas,
those of trained models come from the checkpoints given, and a missing extrapolation table is skipped, not an
error. (The instruments behind the model figures are checked against the model itself in
tests/test_demo.py.)"""

import math
from dataclasses import asdict

import pytest
import torch

from data.common import ensure_prepared, load_meta
from lab.demo import figures
from model import GPT, GPTConfig
from positions import POS_SCHEMES, apply_rope, rope_cos_sin, rope_frequencies

pytest.importorskip("matplotlib")


def test_analytic_figures_are_byte_identical_across_runs(tmp_path):
    """Same command, same PNG bytes: fixed seeds and no date or version in the files, so committed figures
    only change when what they show changes."""
    for run in ("a", "b"):  # the figures' own functions, at a smaller size than the committed ones, for speed
        (tmp_path / run).mkdir()
        figures.figure_sinusoidal(tmp_path / run, dim=64, n_pos=64)
        figures.figure_rope_decay(tmp_path / run, head_dim=32, max_distance=256, n_pairs=100)
    for name in ("sinusoidal.png", "rope_decay.png"):
        first, second = (tmp_path / run / name for run in ("a", "b"))
        assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert first.read_bytes() == second.read_bytes(), name


def test_rope_decay_bound_is_one_at_distance_zero_and_decays_on_average():
    """Su et al. 3.4.3: (1/(d/2)) sum_j |S_j|, relative to distance 0, starts at 1, never exceeds it, and its
    average over successive stretches of 128 tokens goes down (it ripples, so only on average)."""
    bound = figures.rope_decay_bound(torch.arange(1024), head_dim=128)
    assert bound[0].item() == pytest.approx(1.0, abs=1e-12)
    assert bound.max().item() <= 1.0 + 1e-12
    stretches = bound.view(8, 128).mean(dim=1)
    assert (stretches[1:] < stretches[:-1]).all(), stretches


def test_rope_decay_scores_are_apply_ropes_scores():
    """The figure's closed form for <R_m q, k> equals rotating q with the model's apply_rope, in float64."""
    head_dim = 16
    inv_freq = rope_frequencies(head_dim)[0].double()
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 3, head_dim, dtype=torch.float64, generator=g)
    distances = torch.tensor([0, 1, 5, 77, 1000])
    closed_form = figures.rope_scores(q, k, distances, inv_freq)  # (3, 5)
    cos, sin = rope_cos_sin(distances, inv_freq)
    rotated = apply_rope(q[:, None, :].expand(3, len(distances), head_dim), cos, sin)  # q at position m
    torch.testing.assert_close(closed_form, (rotated * k[:, None, :]).sum(-1), rtol=0, atol=1e-12)


def test_sinusoidal_wavelengths_span_two_pi_to_61342_tokens_at_gpt2_width():
    """The wavelength panel's numbers: 2 pi for the fastest pair, 61,342.7 tokens for the slowest at
    d = 768."""
    wavelengths = figures.sinusoidal_wavelengths(768)
    assert wavelengths[0].item() == pytest.approx(2 * math.pi)
    assert round(wavelengths[-1].item(), 1) == 61342.7


def test_missing_extrapolation_table_is_skipped_with_a_message(tmp_path, capsys):
    """Before the extrapolation study has run there is no CSV:
    the figure is skipped, with a line saying why."""
    written = figures.main(["--only=extrapolation", f"--out={tmp_path}", f"--csv={tmp_path / 'none.csv'}"])
    assert written == [] and not (tmp_path / "extrapolation.png").exists()
    assert "skipping extrapolation" in capsys.readouterr().out


def test_extrapolation_figure_reads_the_studys_csv(tmp_path):
    """The curves come from the study's columns (checkpoint, pos, scaling, block_size, length, loss,
    loss_beyond, stderr, windows), read as written, an empty loss_beyond inside the trained length
    included."""
    table = tmp_path / "extrapolation.csv"
    table.write_text(
        "checkpoint,pos,scaling,block_size,length,loss,loss_beyond,stderr,windows\n"
        "out/a,rope,,64,64,1.7,,0.01,10\nout/a,rope,,64,256,2.2,2.4,0.02,10\n"
        "out/a,rope,ntk,64,256,2.0,2.1,0.02,10\nout/b,alibi,,64,256,1.8,1.8,0.02,10\n"
    )
    curves = figures.read_extrapolation(table)
    assert [r["loss"] for r in curves[("out/a", "rope", "none")]] == [1.7, 2.2]
    assert math.isnan(curves[("out/a", "rope", "none")][0]["loss_beyond"])
    written = figures.main(["--only=extrapolation", f"--out={tmp_path}", f"--csv={table}"])
    assert written == [tmp_path / "extrapolation.png"] and written[0].stat().st_size > 0


def test_unknown_figure_name_is_one_line_naming_the_figures(capsys):
    with pytest.raises(SystemExit) as exit_info:
        figures.main(["--only=sinusoidal,heatmap"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'heatmap'" in err and "rope_decay" in err, err


def tiny_checkpoints(folder):
    """One random tiny model per scheme, saved as train.py saves them (the fields open_model reads), on the
    shakespeare_char vocabulary: enough to draw the figures of trained models without training."""
    meta = load_meta(ensure_prepared("shakespeare_char"))
    for i, pos in enumerate(POS_SCHEMES):
        torch.manual_seed(i)
        config = GPTConfig.from_flat(
            block_size=16, vocab_size=meta["vocab_size"], n_layer=2, n_head=2, n_embd=16, bias=False, pos=pos
        )
        ckpt = {
            "model": GPT(config).state_dict(),
            "model_config": asdict(config),
            "meta": meta,
            "train_config": {"dataset": "shakespeare_char"},
            "iter_num": 0,
            "best_val_loss": 4.2,
            "best_iter": 0,
            "wandb_run_id": None,
        }
        (folder / pos).mkdir(parents=True)
        torch.save(ckpt, folder / pos / "ckpt.pt")


def test_model_figures_come_from_the_checkpoints_given_and_are_deterministic(tmp_path):
    """--checkpoints DIR is used as given (nothing is trained),
    and the same checkpoints give the same bytes."""
    tiny_checkpoints(tmp_path / "ckpts")
    for run in ("a", "b"):
        written = figures.main(
            ["--only=qk_terms,attention", f"--checkpoints={tmp_path / 'ckpts'}", f"--out={tmp_path / run}"]
        )
        assert sorted(p.name for p in written) == ["attention.png", "attention_distance.png", "qk_terms.png"]
    for name in ("attention.png", "attention_distance.png", "qk_terms.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
