"""LongRoPE's search (lab/experiments/longrope.py): its candidates always keep the paper's constraints, the
evolution never loses its best and repeats itself for a seed, and on a trained checkpoint it writes a factors
file that train.py (--init_from), sample.py and lab/eval_length.py take."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import sample
import train
from lab import eval_length
from lab.experiments import longrope
from lab.measure.losses import validation_tokens
from lab.measure.retrieval import count_correct, passkey_batch
from model import GPTConfig
from plumbing.checkpoint import checkpoint_path, load_checkpoint, open_model
from plumbing.fields import changed_fields
from positions import RotaryPositions
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


def read_rope_factors(path):
    """The settings a factors file gives, as RoPE's Settings read it (those not at their default)."""
    return changed_fields(RotaryPositions.Settings(rope_factors=str(path)))


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
    lab/eval_length.py apply it to the plain checkpoint, and the fine-tuned one samples as recorded."""
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
    config = load_checkpoint(checkpoint_path(tuned))["model_config"]["pos_settings"]
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
    csv_path.unlink()
    with pytest.raises(SystemExit) as exit_info:  # refused before any row
        eval_length.main(
            [
                str(rope_run),
                "--lengths=1",
                f"--rope_factors={factors}",
                "--max_windows=2",
                "--csv",
                str(csv_path),
            ]
            + ["--device=cpu", "--progress=false", "--rope_scalings=yarn"]
        )
    assert exit_info.value.code == 2 and not csv_path.exists()


def test_the_search_never_measures_an_evaluation_window(rope_run, tmp_path, monkeypatch):
    """Every window the loss fitness reads lies in the dataset's train.bin; lab/eval_length.py and the study
    evaluate val.bin (lab.measure.losses.validation_tokens): another file, so no window is shared."""
    seen, real = [], longrope.window_losses

    def recording(model, tokens, length, starts, *rest):
        seen.append((Path(tokens.filename), len(tokens), length, list(starts)))
        return real(model, tokens, length, starts, *rest)

    monkeypatch.setattr(longrope, "window_losses", recording)
    flags = ["--factor=4", "--population=3", "--generations=1", "--parents=1", "--windows=3"]
    longrope.main([str(rope_run), *flags, f"--out={tmp_path / 'search'}"])
    dataset = load_checkpoint(checkpoint_path(rope_run))["train_config"]["dataset"]
    evaluated = Path(validation_tokens(dataset).filename)
    assert eval_length.validation_tokens is validation_tokens and evaluated.name == "val.bin"
    assert len(seen) >= 3  # a fitness per candidate
    for path, n_tokens, length, starts in seen:
        assert path == evaluated.with_name("train.bin") and not path.samefile(evaluated)
        assert len(starts) == 3 and all(0 <= s and s + length + 1 <= n_tokens for s in starts)


def test_the_factors_bound_is_the_released_searchs_unless_top_is_given():
    """microsoft/LongRoPE draws every factor from [1, 1 + scale], scale = L/T; --top=X caps at X L/T."""
    assert longrope.bound(longrope.SearchConfig(checkpoint="-"), 64, 16) == 5
    assert longrope.bound(longrope.SearchConfig(checkpoint="-", top=2), 64, 16) == 8
    assert longrope.bound(longrope.SearchConfig(checkpoint="-", short=True), 16, 16) == 2


def test_a_fixed_n_hat_is_kept_by_every_candidate(rope_run, tmp_path):
    out = tmp_path / "n_hat"
    flags = ["--factor=4", "--population=6", "--generations=3", "--parents=2", "--windows=2", "--mutation=1"]
    longrope.main([str(rope_run), *flags, "--n_hat=8", f"--out={out}"])
    with open(out / "fitness.csv") as f:
        assert {row["n_hat"] for row in csv.DictReader(f)} == {"8"}
    factors = read_rope_factors(out / "factors.json")
    assert factors["rope_keep_first"] == 8 and max(factors["rope_long_factor"]) <= 5  # 1 + L/T


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--device=gpu"], ["device='gpu'", "auto, cpu, cuda"]),
        (["--fitness=ppl"], ["fitness='ppl'", "loss or passkey"]),
        (["--n_hat=-1"], ["n_hat must be >= 0"]),
        (["--top=0.5"], ["top must be >= 1"]),
        (["--passkey_seed=0"], ["passkey_seed must be >= 1", "lab/eval_length.py's evaluation samples"]),
        (["--fitness=passkey"], ["passkey vocabulary", "--fitness=loss"]),  # a shakespeare_char checkpoint
    ],
)
def test_bad_search_settings_are_one_line_errors_before_any_work(rope_run, monkeypatch, capsys, flags, words):
    monkeypatch.setattr(longrope, "evolve", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(SystemExit) as stop:
        longrope.main([str(rope_run), *flags])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith(f"{longrope.PROG}: error: ") and "\n" not in err, err
    assert all(word in err for word in words), err


def test_an_unwritable_out_is_a_one_line_error_before_the_search(rope_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(longrope, "evolve", lambda *a, **k: pytest.fail("searched"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        longrope.main([str(rope_run), f"--out={tmp_path / 'file' / 'search'}"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code != 0 and "\n" not in err and "is a file, not a folder" in err, err


def test_a_factor_beyond_the_train_split_is_a_one_line_error_naming_that_split(rope_run, monkeypatch, capsys):
    """The loss fitness reads windows of the train split (never an evaluation window): the error says so."""
    monkeypatch.setattr(longrope, "evolve", lambda *a, **k: pytest.fail("searched"))
    with pytest.raises(SystemExit) as stop:
        longrope.main([str(rope_run), "--factor=100000"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code != 0 and "\n" not in err and "-token train split" in err, err
    assert not Path(f"{rope_run}_longrope_x100000").exists()  # no folder made for a search that cannot run


# A tiny RoPE model trained to retrieve (2 layers x 64 dims, T = 32; 100% of the keys at T, 0% at 2 T plain):
#     python -m data.passkey.prepare --block_size=32
#     python train.py --dataset=passkey_ctx32 --block_size=32 --n_layer=2 --n_head=2 --n_embd=64 --bias=false
#         --batch_size=64 --learning_rate=2e-3 --min_lr=2e-4 --max_iters=5000 --lr_decay_iters=5000
#         --warmup_iters=100 --eval_interval=1000 --eval_iters=5 --compile=false
# its best.pt (step 4000) without the optimizer's state.
PASSKEY_RETRIEVER = Path(__file__).parent / "fixtures" / "passkey_retriever_rope.pt"


def fitness_and_retrieval(candidates, length, short):
    """{name: (passkey fitness, keys retrieved of 48)} of the trained retriever with each candidate's factors
    as its short or long ones, on the search's own samples (16 per depth 0, 0.5, 1) of `length` tokens."""
    ckpt = load_checkpoint(PASSKEY_RETRIEVER)
    config = GPTConfig(**ckpt["model_config"]).flat()  # its fields and settings, by name
    stoi = longrope.passkey_vocabulary(ckpt, PASSKEY_RETRIEVER)
    seed = longrope.SearchConfig(checkpoint="-").passkey_seed
    samples = [passkey_batch(stoi, length, depth, 16, seed) for depth in (0.0, 0.5, 1.0)]
    results = {}
    for name, factors in candidates.items():  # the model extended by s = 2 (its attention factor)
        chosen = longrope.settings(config, (tuple(factors), 0), short, 2.0)
        model = open_model(PASSKEY_RETRIEVER, "cpu", ckpt, longrope=chosen)[0]
        fitness = longrope.passkey_fitness(model, samples, "cpu")
        results[name] = (fitness, sum(count_correct(model, *sample) for sample in samples))
    return results


def test_passkey_fitness_ranks_a_candidate_that_retrieves_above_one_that_does_not():
    """On a trained checkpoint, at L = T (the --short search: short factors): factors of 1 keep the positions
    it was trained on and it retrieves every key; factors of 4 squeeze them and it retrieves none. The passkey
    fitness (the key digits' loss, lower is better) ranks them so."""
    pairs = 16  # head size 32
    candidates = {"keeps positions": [1.0] * pairs, "squeezes them": [4.0] * pairs}
    results = fitness_and_retrieval(candidates, 32, short=True)
    (kept, kept_correct), (squeezed, squeezed_correct) = results["keeps positions"], results["squeezes them"]
    assert (kept_correct, squeezed_correct) == (48, 0)
    assert kept < squeezed


def test_passkey_fitness_prefers_factors_that_retrieve_past_the_trained_length():
    """At L = 2 T (long factors): plain RoPE's factors of 1 retrieve no key, YaRN's formula some; the passkey
    fitness ranks YaRN's first, as a search must to find factors that retrieve."""
    head_dim = 32
    yarn = longrope.longrope_baselines(head_dim, 10000.0, 2.0, 32)["yarn"].tolist()
    results = fitness_and_retrieval({"plain": [1.0] * (head_dim // 2), "yarn": yarn}, 64, short=False)
    assert results["yarn"][1] > results["plain"][1] == 0
    assert results["yarn"][0] < results["plain"][0]
