"""experiments/longrope_ablation.py: searches varied by fitness and n-hat, each scored on what no search saw,
and its verdicts the paired differences over (checkpoint, search seed) pairs."""

import math

import pytest

from experiments import longrope_ablation as ablation


def row(checkpoint, variant, seed, task, length, value):
    return dict(
        checkpoint=checkpoint,
        variant=variant,
        search_seed=str(seed),
        task=task,
        length=str(length),
        value=str(value),
    )


def test_a_formula_no_search_varies_pairs_with_every_search_seed_of_its_checkpoint():
    rows = [row("a", "yarn", "", "loss", 256, 2.0), row("b", "yarn", "", "loss", 256, 3.0)]
    rows += [row(c, "loss", s, "loss", 256, 1.0) for c in "ab" for s in (0, 1)]
    assert ablation.cells(rows, "yarn", "loss", 256) == {
        ("a", "0"): 2.0,
        ("a", "1"): 2.0,
        ("b", "0"): 3.0,
        ("b", "1"): 3.0,
    }


def test_verdicts_are_paired_t_intervals_over_the_search_pairs():
    """passkey - loss retrieval over three search seeds: +10, +20, +30 points: mean 20, sd 10, t(2) 4.3027."""
    rows = [row("a", "loss", s, "passkey", 256, 0.5) for s in range(3)]
    rows += [row("a", "passkey", s, "passkey", 256, 0.5 + 0.1 * (s + 1)) for s in range(3)]
    rows += [row("a", v, s, "passkey", 64, 1.0) for v in ("loss", "passkey") for s in range(3)]
    text = ablation.render(rows)
    half = 4.302653 * 10 / math.sqrt(3)
    interval = f"+20 [{20 - half:+.3g}, {20 + half:+.3g}]: level"
    assert f"| passkey | loss | a passkey fitness against the loss fitness | {interval} |" in text
    assert "| passkey | 100% ± 0 | 70% ± 10 |" in text


def test_bad_settings_are_one_line_errors_before_any_search(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(ablation, "run", lambda *a: pytest.fail("the ablation started"))
    for argv, words in (
        ([str(tmp_path), "--factor=1"], "factor must be > 1"),
        ([str(tmp_path), "--variants=ppl"], "invalid choice"),
        ([str(tmp_path), "--seeds=0"], "seeds must be >= 1"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            ablation.main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and "\n" not in err and words in err, err
