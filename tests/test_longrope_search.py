"""LongRoPE's search (experiments/longrope.py): its candidates always keep the paper's constraints, the
evolution never loses its best and repeats itself for a seed, and on a trained checkpoint it writes a factors
file that train.py (--init_from), sample.py and eval_length.py take."""

import csv
import json

import numpy as np
import pytest

import eval_length
import sample
import train
from experiments import longrope
from plumbing.checkpoint import checkpoint_path, load_checkpoint
from plumbing.cli import read_rope_factors
from tests.helpers import TINY_RUN


def valid(candidate, top):
    factors, n_hat = candidate
    return (
        all(1.0 <= f <= top for f in factors)
        and all(a <= b for a, b in zip(factors, factors[1:]))
        and n_hat in longrope.N_HATS
    )


def test_no_mutation_or_crossover_breaks_the_constraints():
    """Factors >= 1 (and <= the bound), non-decreasing from the fastest pair to the slowest, n-hat one of
    N_HATS: over random sizes, factors (valid or not to start with), probabilities and many generations."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        n_pairs, top = int(rng.integers(1, 40)), float(rng.uniform(1.5, 64))
        pool = [longrope.constrain(rng.uniform(0.1, 2 * top, n_pairs), top) for _ in range(4)]
        pool = [(factors, int(rng.choice(longrope.N_HATS))) for factors in pool]
        assert all(valid(c, top) for c in pool)
        for _ in range(20):
            a, b = (pool[i] for i in rng.integers(len(pool), size=2))
            pool.append(longrope.mutate(a, rng, float(rng.uniform(0, 1)), top))
            pool.append(longrope.crossover(a, b, rng, top))
            assert valid(pool[-1], top) and valid(pool[-2], top)


def toy_fitness(candidate):
    """A smooth loss, its minimum at factors (1, 2, 4, 8) and n-hat 4: the search has something to find."""
    return float(np.sum(np.log(np.asarray(candidate[0]) / [1, 2, 4, 8]) ** 2)) + abs(candidate[1] - 4) / 100


def test_evolution_keeps_its_best_and_repeats_for_a_seed():
    cfg = longrope.SearchConfig(checkpoint="-", factor=8, population=10, generations=8, parents=3)
    seeds = [((8.0,) * 4, 0), ((1.0, 1.0, 1.0, 1.0), 0), ((8.0,) * 4, 0)]  # a seed given twice counts once
    runs = [longrope.evolve(toy_fitness, seeds, cfg, 16.0, np.random.default_rng(5), log=lambda _: None)]
    runs.append(longrope.evolve(toy_fitness, seeds, cfg, 16.0, np.random.default_rng(5), log=lambda _: None))
    (best, history), again = runs
    assert again == runs[0]
    bests = [h["best"] for h in history]
    assert all(b <= a for a, b in zip(bests, bests[1:]))  # elitism: never worse
    assert bests[-1] < min(toy_fitness(s) for s in seeds)  # and it found better than its seeds


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("longrope") / "rope"
    train.main([*TINY_RUN, "--pos=rope", "--max_iters=4", "--eval_interval=4", f"--out_dir={folder}"])
    return folder


def test_the_search_on_a_checkpoint_ends_no_worse_than_its_initial_population(rope_run, tmp_path, capsys):
    out = tmp_path / "search"
    flags = ["--factor=4", "--population=6", "--generations=3", "--parents=2", "--windows=2"]
    longrope.main([str(rope_run), *flags, f"--out={out}"])
    with open(out / "fitness.csv") as f:
        history = list(csv.DictReader(f))
    assert len(history) == 3
    assert float(history[-1]["best"]) <= float(history[0]["best"])
    assert (out / "factors.png").stat().st_size > 0
    settings = read_rope_factors(out / "factors.json")
    assert settings["rope_original_len"] == 16 and len(settings["rope_long_factor"]) == 4
    with pytest.raises(SystemExit) as stop:  # the output is not overwritten
        longrope.main([str(rope_run), *flags, f"--out={out}"])
    assert stop.value.code == 2 and "exists" in capsys.readouterr().err


def test_searched_factors_work_through_every_entry_point(rope_run, tmp_path, capsys):
    """The factors file: train.py fine-tunes at 4 T with it (recorded in the checkpoint), sample.py and
    eval_length.py apply it to the plain checkpoint, and the fine-tuned one samples as recorded."""
    factors = tmp_path / "factors.json"
    table = {"type": "longrope", "short_factor": [1] * 4, "long_factor": [1, 1.5, 3, 4], "keep_first": 2}
    factors.write_text(json.dumps(table))
    tuned = tmp_path / "tuned"
    train.main(
        [
            *TINY_RUN,
            f"--init_from={rope_run}",
            "--block_size=64",
            f"--rope_factors={factors}",
            f"--out_dir={tuned}",
        ]
    )
    config = load_checkpoint(checkpoint_path(tuned))["model_config"]
    assert config["rope_scaling"] == "longrope" and config["rope_original_len"] == 16
    assert config["rope_long_factor"] == [1, 1.5, 3, 4] and config["rope_keep_first"] == 2
    for argv in ([f"--out_dir={rope_run}", f"--rope_factors={factors}"], [f"--out_dir={tuned}"]):
        sample.main([*argv, "--max_new_tokens=40", "--device=cpu", "--stream=false"])
        assert "rope scaling longrope" in capsys.readouterr().out
    csv_path = tmp_path / "rows.csv"
    eval_length.main(
        [
            str(rope_run),
            "--lengths=1,4",
            f"--rope_factors={factors}",
            "--max_windows=2",
            "--csv",
            str(csv_path),
        ]
        + ["--device=cpu", "--progress=false", "--rope_scalings=yarn"]
    )
    with open(csv_path) as f:
        rows = {(row["scaling"], row["length"]) for row in csv.DictReader(f)}
    assert {("longrope", "16"), ("longrope", "64"), ("yarn", "64")} <= rows
    factors.write_text(json.dumps(table | {"original_max_position_embeddings": 64}))  # for another T
    eval_length.main(
        [str(rope_run), "--lengths=1", f"--rope_factors={factors}", "--max_windows=2", "--csv", str(csv_path)]
        + ["--device=cpu", "--progress=false", "--rope_scalings=yarn"]
    )
    with open(csv_path) as f:
        assert {row["scaling"] for row in csv.DictReader(f)} == {"plain", "yarn"}
