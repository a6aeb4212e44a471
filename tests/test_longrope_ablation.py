"""lab/experiments/longrope_ablation.py: searches varied by fitness and n-hat, each scored on what no search
saw, and its verdicts: paired over (checkpoint, search seed) against a formula, Welch's between two
searches."""

import math

import pytest

from lab.experiments import longrope_ablation as ablation


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


def test_two_searches_are_compared_by_welch_and_a_search_against_yarn_is_paired():
    """passkey - loss retrieval over three search seeds, loss 40, 50, 60% and passkey 60, 80, 70%: Welch's
    interval (variances 100 and 100 points^2, df 4, t 2.7764): +20 -+ 2.7764 sqrt(200/3); paired by search
    seed it would be +20 -+ 4.3027 x 10 / sqrt(3). loss - yarn (50% for the checkpoint) is paired: -10, 0,
    +10."""
    rows = [row("a", "loss", s, "passkey", 256, v) for s, v in enumerate((0.4, 0.5, 0.6))]
    rows += [row("a", "passkey", s, "passkey", 256, v) for s, v in enumerate((0.6, 0.8, 0.7))]
    rows += [row("a", "yarn", "", "passkey", 256, 0.5)]
    rows += [row("a", v, s, "passkey", 64, 1.0) for v in ("loss", "passkey") for s in range(3)]
    rows += [row("a", "yarn", "", "passkey", 64, 1.0)]
    text = ablation.render(rows)
    half = 2.776445 * math.sqrt(200 / 3)
    interval = f"+20 [{20 - half:+.3g}, {20 + half:+.3g}]: level"
    assert f"| passkey | loss | a passkey fitness against the loss fitness | Welch | {interval} |" in text
    half = 4.302653 * 10 / math.sqrt(3)
    interval = f"+0 [{-half:+.3g}, {half:+.3g}]: level"
    assert f"| loss | yarn | searched factors against YaRN's formula | paired | {interval} |" in text
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
