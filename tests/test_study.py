"""The study (python -m lab.experiments.extrapolation): seeds give runs of their own, recorded in their
checkpoints, and the summary over seeds says which orderings every seed keeps. Commands are read by train.py's
own parser (lab.experiments.runs.plan), runs are real tiny train.py runs."""

import pytest
import torch

import train
from lab.experiments import extrapolation as study
from lab.experiments.runs import plan
from positions import POS_SCHEMES


def test_seeds_give_every_run_its_own_seed_and_folder_the_first_seed_train_pys_own():
    cfg = study.parse_args(["--seeds=3", "--extra"])
    plans = plan(study.base_commands(cfg, "shakespeare_char"))
    per_seed = len(POS_SCHEMES) + len(study.EXTRA_RUNS)  # every scheme, then the extra RoPE runs
    assert len(plans) == 3 * per_seed and len({p.out_dir for p in plans}) == 3 * per_seed
    by_folder = {p.out_dir: p for p in plans}
    for pos in POS_SCHEMES:
        first = by_folder[f"out/shakespeare_char_{pos}"]  # the README's `python train.py --pos=X` run
        assert first.train_config["seed"] == 1337 and first.model_config["pos"] == pos
        for seed in (1338, 1339):
            assert by_folder[f"out/shakespeare_char_{pos}_seed{seed}"].train_config["seed"] == seed
    assert (
        by_folder["out/shakespeare_char_rope_frac0.25_seed1339"].model_config["pos_settings"]["rope_fraction"]
        == 0.25
    )
    assert by_folder["out/shakespeare_char_rope_nope4"].model_config["pos_settings"]["nope_interval"] == 4


def test_passkey_study_trains_with_its_preset_into_folders_of_its_own():
    cfg = study.parse_args(["--task=passkey", "--seeds=2"])
    plans = plan(study.base_commands(cfg, "passkey"))
    assert {p.out_dir for p in plans} >= {"out/passkey_alibi", "out/passkey_alibi_seed1338"}
    assert all(p.train_config["dataset"] == "passkey" and p.train_config["batch_size"] == 32 for p in plans)


def test_passkey_study_trains_nope_longer_with_its_own_preset_only():
    """NoPE learns to copy last (docs/extrapolation.md): 5000 steps where the other schemes get the preset's
    3000; another preset's runs are trained as it says."""
    steps = {
        p.out_dir: (p.train_config["max_iters"], p.train_config["lr_decay_iters"])
        for p in plan(study.base_commands(study.parse_args(["--task=passkey", "--extra"]), "passkey"))
    }
    assert steps.pop("out/passkey_none") == (5000, 5000)
    assert set(steps.values()) == {(3000, 3000)} and len(steps) == len(POS_SCHEMES) - 1 + len(
        study.EXTRA_RUNS
    )
    gpu = study.parse_args(["--task=passkey", "--config=configs/passkey_gpu.toml"])
    assert {p.train_config["max_iters"] for p in plan(study.base_commands(gpu, "passkey_ctx256"))} == {3000}


def test_runs_of_two_seeds_differ_and_record_their_seed(tmp_path):
    tiny = [
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=16",
        "--block_size=16",
        "--batch_size=4",
        "--device=cpu",
        "--compile=false",
        "--eval_iters=1",
        "--max_iters=2",
        "--log_interval=1000",
    ]
    weights = {}
    for seed in (1337, 1338):
        train.main([*tiny, f"--seed={seed}", f"--out_dir={tmp_path / str(seed)}"])
        ckpt = torch.load(tmp_path / str(seed) / "ckpt.pt", map_location="cpu", weights_only=True)
        assert ckpt["train_config"]["seed"] == seed
        weights[seed] = ckpt["model"]["transformer.wte.weight"]
    assert not torch.equal(weights[1337], weights[1338])


def test_summary_gives_mean_and_spread_and_marks_orderings_that_some_seed_reverses():
    cfg = study.parse_args(["--seeds=3"])
    per_seed = [  # rope beats alibi in every seed; alibi and none swap in seed 2
        {("x_rope", "plain", 64): 1.70, ("x_alibi", "plain", 64): 1.80, ("x_none", "plain", 64): 1.85},
        {("x_rope", "plain", 64): 1.72, ("x_alibi", "plain", 64): 1.86, ("x_none", "plain", 64): 1.84},
        {("x_rope", "plain", 64): 1.74, ("x_alibi", "plain", 64): 1.81, ("x_none", "plain", 64): 1.86},
    ]
    text = study.summary(cfg, per_seed, 64)
    assert "| x_rope | plain | 1.720 ± 0.020 |" in text
    assert "64 tokens (1 T): x_rope < x_alibi ~ x_none" in text


def test_retrieval_summary_pools_correct_answers_over_seeds_with_their_interval():
    cfg = study.parse_args(["--task=passkey", "--seeds=2"])
    per_seed = [
        {("p_rope", "plain", 64): (50, 50), ("p_alibi", "plain", 64): (20, 50)},
        {("p_rope", "plain", 64): (40, 50), ("p_alibi", "plain", 64): (30, 50)},
    ]
    text = study.summary(cfg, per_seed, 64)
    assert "| p_rope | plain | 90% [83%, 94%] |" in text  # 90 of 100: Wilson (0.826, 0.945)
    assert "64 tokens (1 T): p_rope > p_alibi" in text


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--seeds=0"], ["seeds must be >= 1"]),
        (["--task=recall"], ["--task", "loss", "passkey"]),
        (["--config=configs/none.toml"], ["configs/none.toml", "no such file"]),
        (["--lengths=0,1"], ["lengths must be positive multiples of T"]),
        (["--search_seeds=0", "--longrope", "--schemes=rope"], ["search_seeds must be >= 1"]),
        (["--search_seeds=3"], ["--search_seeds repeats LongRoPE's search", "add --longrope"]),
    ],
)
def test_study_flag_errors_are_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        study.main(argv)
    err = capsys.readouterr().err.strip()
    assert (
        exit_info.value.code == 2
        and err.startswith("python -m lab.experiments.extrapolation: error: ")
        and "\n" not in err
    )
    for word in words:
        assert word in err


def test_longrope_study_searches_fine_tunes_and_extends_progressively(monkeypatch, tmp_path):
    """--longrope per seed: factors searched for the rope run at 4 T, a fine-tune at 4 T with them, then from
    it factors searched at 8 T and at T, each put on the fine-tuned weights by a 0-step run; the results
    under a name of their own."""
    cfg = study.parse_args(["--schemes=rope", "--longrope", "--seeds=2", f"--out_root={tmp_path}"])
    assert study.results_name(cfg) == "extrapolation_rope_longrope"
    assert [name for name, _ in study.base_runs(cfg)] == ["rope"]
    searches, commands = [], []
    monkeypatch.setattr(study, "run_python", lambda args, **kw: searches.append(args))
    monkeypatch.setattr(study, "train_runs", lambda cfg, more, duration=None: commands.extend(more))
    factors, runs = study.longrope_runs(cfg, "shakespeare_char", 64, 1338, ["--max_iters=200", "--seed=1338"])
    source = f"{tmp_path}/shakespeare_char_rope_seed1338"  # no search there yet: each one runs
    tuned = f"{source}_ctx256_longrope"
    assert factors == f"{source}_longrope_x4/factors.json"
    assert runs == [tuned, f"{tuned}_x8", f"{tuned}_short"]
    assert [search[:4] for search in searches] == [
        ["-m", "lab.experiments.longrope", source, "--factor=4"],
        ["-m", "lab.experiments.longrope", tuned, "--factor=8"],
        ["-m", "lab.experiments.longrope", tuned, "--short"],
    ]
    ft, x8, short = commands
    assert {
        f"--init_from={source}",
        "--block_size=256",
        f"--rope_factors={factors}",
        "--max_iters=200",
    } <= set(ft)
    assert ft[-1] == f"--out_dir={tuned}"
    for applied, name in ((x8, "x8"), (short, "short")):
        assert {f"--init_from={tuned}", "--max_iters=0", f"--out_dir={tuned}_{name}"} <= set(applied)
        assert f"--rope_factors={tuned}_longrope_{name}/factors.json" in applied


def test_longrope_study_on_passkey_keeps_every_run_on_the_fine_tunes_data(monkeypatch, tmp_path):
    """With --task passkey the fine-tune trains on data/passkey_ctx256, and so must the 0-step runs that put
    the searched factors on its weights: train.py's default dataset has another vocabulary."""
    cfg = study.parse_args(["--task=passkey", "--schemes=rope", "--longrope", f"--out_root={tmp_path}"])
    commands = []
    monkeypatch.setattr(study, "run_python", lambda args, **kw: None)
    monkeypatch.setattr(study, "train_runs", lambda cfg, more, duration=None: commands.extend(more))
    study.longrope_runs(cfg, "passkey", 64, 1337, ["--dataset=passkey_ctx256", "--max_iters=200"])
    assert len(commands) == 3
    for command in commands:
        assert "--dataset=passkey_ctx256" in command, command


def test_longrope_search_seeds_each_search_into_a_folder_of_their_own_and_are_evaluated(
    monkeypatch, tmp_path
):
    """--search_seeds 3: three searches at 4 T for the rope run, the first the fine-tune's, each with a seed
    of its own and put on the rope run's weights by a 0-step run on its data, which the study evaluates."""
    cfg = study.parse_args(["--schemes=rope", "--longrope", "--search_seeds=3", f"--out_root={tmp_path}"])
    searches, commands = [], []
    monkeypatch.setattr(study, "run_python", lambda args, **kw: searches.append(args))
    monkeypatch.setattr(study, "train_runs", lambda cfg, more, duration=None: commands.extend(more))
    factors, runs = study.longrope_runs(cfg, "passkey", 64, 1338, ["--max_iters=200"])
    source = f"{tmp_path}/passkey_rope_seed1338"
    searched = [f"{source}_x4_search{k}" for k in (1, 2, 3)]
    assert runs[-3:] == searched and factors == f"{source}_longrope_x4/factors.json"
    at_4t = [s for s in searches if s[2] == source]
    outs = [f"{source}_longrope_x4", f"{source}_longrope_x4_search2", f"{source}_longrope_x4_search3"]
    assert [(s[3], s[4], s[5]) for s in at_4t] == [
        ("--factor=4", f"--seed={seed}", f"--out={out}") for seed, out in zip((1338, 2338, 3338), outs)
    ]
    zero = commands[-3:]
    for command, out, run in zip(zero, outs, searched):
        assert {f"--init_from={source}", "--dataset=passkey", "--max_iters=0", f"--out_dir={run}"} <= set(
            command
        )
        assert f"--rope_factors={out}/factors.json" in command
    plain = study.parse_args(["--schemes=rope", "--longrope", f"--out_root={tmp_path}"])
    assert len(study.longrope_runs(plain, "passkey", 64, 1338, [])[1]) == 3  # one search: the runs as before


def test_search_spread_gives_each_training_seeds_searches_mean_spread_and_range():
    cfg = study.parse_args(["--schemes=rope", "--longrope", "--search_seeds=3", "--seeds=2"])
    per_seed = {
        1337: {
            ("x_rope", "plain", 256): 2.0,
            **{(f"x_rope_x4_search{k}", "longrope", 256): v for k, v in ((1, 1.5), (2, 1.7), (3, 1.9))},
        },
        1338: {(f"x_rope_x4_search{k}", "longrope", 256): 1.6 for k in (1, 2, 3)},
    }
    text = study.search_spread(cfg, per_seed, 64)[0]
    assert "| 1337 | x_rope_x4 | longrope | 4 T | 1.700 ± 0.200 | 1.500 to 1.900 |" in text
    assert "| 1338 | x_rope_x4 | longrope | 4 T | 1.600 ± 0.000 | 1.600 to 1.600 |" in text
    assert "x_rope |" not in text  # the rope run's own row is no search
    text = study.summary(cfg, list(per_seed.values()), 64)
    assert "x_rope_x4_search1" in text and "x_rope_x4_search" not in text.split("ranked by the mean")[1]


def test_under_three_seeds_every_verdict_is_inconclusive():
    """Two seeds give a paired interval (t with 1 degree of freedom), one seed a difference alone; neither
    gives a word: ALiBi over RoPE at 2 T by 40 and 60 points, then a fine-tune in one seed."""
    per_seed = {
        1337: {("p_alibi", "plain", 128): (45, 50), ("p_rope", "plain", 128): (25, 50)},
        1338: {("p_alibi", "plain", 128): (50, 50), ("p_rope", "plain", 128): (20, 50)},
    }
    per_seed[1337] |= {
        ("p_rope_ctx256_linear", "linear", 256): (5, 50),
        ("p_rope_ctx256_plain", "plain", 256): (45, 50),
    }
    rows = study.verdict_table(study.COMPARISONS["passkey"], per_seed, 64, loss=False).splitlines()[2:]
    # differences 0.4 and 0.6: mean 0.5, sd 0.141, half-width t(0.975, 1) x 0.1 = 12.706 x 0.1 = 1.27
    assert rows == [
        "| ALiBi retrieves past T, RoPE not | alibi at 2 T | rope at 2 T | 2 | +50 [-77, +177] points "
        "| inconclusive (2 seeds) |",
        "| PI fine-tuned (Chen et al., Table 4) | rope_ctx256_linear at 4 T | rope_ctx256_plain at 4 T | 1 "
        "| -80 points, no interval | inconclusive (1 seed) |",
    ]


def test_cells_take_the_seed_from_the_folder_name_fine_tunes_included_and_pool_depths():
    rows = [
        {"checkpoint": f"out/p_{name}", "scaling": scaling, "block_size": T, "length": "128", "depth": depth}
        | {"trials": "50", "correct": correct}
        for name, scaling, T, depth, correct in [
            ("rope", "plain", "64", "0", "10"),
            ("rope", "plain", "64", "1", "20"),
            ("rope_seed1338", "plain", "64", "0", "30"),
            ("rope_seed1338_ctx256_yarn", "yarn", "256", "0", "40"),
        ]
    ]
    per_seed, trained = study.read_cells(rows, "passkey")
    assert per_seed == {
        1337: {("p_rope", "plain", 128): (30, 100)},
        1338: {("p_rope", "plain", 128): (30, 50), ("p_rope_ctx256_yarn", "yarn", 128): (40, 50)},
    }
    assert trained == {"p_rope": 64, "p_rope_ctx256_yarn": 256}


def test_tables_flag_rewrites_the_summary_from_the_csvs_and_keeps_the_per_seed_tables(monkeypatch, tmp_path):
    """--tables trains and evaluates nothing; a seed's CSV beside the study's adds only the seeds it lacks."""
    monkeypatch.setattr(study, "train_runs", lambda *a, **kw: pytest.fail("a run trained"))
    monkeypatch.setattr(study, "run_python", lambda *a, **kw: pytest.fail("a script ran"))
    head = "checkpoint,pos,scaling,block_size,length,loss,loss_beyond,stderr,windows\n"
    line = lambda folder, length, loss: f"out/{folder},alibi,plain,64,{length},{loss},,,64\n"
    (tmp_path / "extrapolation.csv").write_text(
        head + line("s_alibi", 64, 1.8) + line("s_alibi_seed1338", 64, 1.9)
    )
    extra = line("s_alibi_seed1338", 64, 9.9) + line("s_alibi_seed1339", 64, 2.0)  # 1338: the study's wins
    (tmp_path / "extrapolation_seed1339.csv").write_text(head + extra)
    (tmp_path / "extrapolation_table.md").write_text("old summary\n\nSeed 1337:\n\ntable\n\nMeasured ...\n")
    study.main(["--tables", f"--results={tmp_path}"])
    text = (tmp_path / "extrapolation_table.md").read_text()
    assert text.startswith("Over 3 seed(s) (1337, 1338, 1339): mean validation loss")
    assert "| s_alibi | plain | 1.900 ± 0.100 |" in text
    assert text.endswith("\n\nSeed 1337:\n\ntable\n\nMeasured ...\n") and "old summary" not in text
