"""The LongLoRA study (lab/experiments/longlora.py) runs the authors' recipe: PI at the extension factor for
every fine-tune of their settings, their optimizer, each setting at the rate it chose on validation data,
reported on data the choice never saw; its tables, here and in the docs, are its CSVs' and nothing else."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_RUN

import train
from lab.experiments import longlora
from lab.finetune import __main__ as finetune
from lab.tables import generated_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def flags_of(command):
    return dict(flag.removeprefix("--").partition("=")[::2] for flag in command)


def test_every_setting_of_the_authors_trains_with_pi_at_the_extension_and_their_optimizer(tmp_path):
    """Their Table 2's settings with PI (linear x4), full attention beside them; no weight decay, a constant
    rate after 20 warmup steps, LoRA dropout 0; each run by python -m lab.finetune, read back through its own
    flags (train.py's and LongLoRA's)."""
    cfg = longlora.StudyConfig(out_root=str(tmp_path))
    authors = [name for name in longlora.SETTINGS if name.startswith("pi_")]
    assert authors == ["pi_full", "pi_s2", "pi_s2_lora", "pi_s2_lora_embed_norm"]
    base = tmp_path / "base"
    train.main([*TINY_RUN, f"--out_dir={base}", "--n_head=2", "--max_iters=0"])
    for name in authors:
        command, out = longlora.fine_tune_command(cfg, base, name, 5e-4, 1000, 1338)
        given = flags_of(command)
        assert given["rope_scaling"] == "linear" and float(given["rope_factor"]) == longlora.EXTENSION
        assert given["warmup_iters"] == "20" and given["weight_decay"] == "0"
        assert float(given["min_lr"]) == float(given["learning_rate"]) == 5e-4  # constant after warmup
        assert ("lora_rank" in given) == ("lora" in name) and given.get("lora_dropout", "0") == "0"
        assert ("s2_attn" in given) == ("s2" in name) and out.endswith("_seed1338")
        assert command[:2] == ["-m", "lab.finetune"]
        tiny = [flag for flag in command[2:] if not flag.startswith(("--block_size", "--dataset"))]
        training, model = train.parse_args([*tiny, "--block_size=64"], finetune.Config)  # what it records
        scaling = model.pos_settings
        assert (scaling.rope_scaling, scaling.rope_factor, scaling.rope_original_len) == ("linear", 4.0, 16)
        assert training.weight_decay == 0 and training.min_lr == 5e-4
        adapters = training
        assert adapters.lora_rank in (0, 8) and (adapters.lora_rank == 0 or adapters.lora_dropout == 0)


def test_the_ablations_are_labelled_and_the_group_of_2t_sees_every_distance_up_to_2t():
    assert {name for name in longlora.SETTINGS if name.startswith("none_")} == {
        "none_full",
        "none_s2",
        "none_s2_lora",
        "none_s2_lora_embed_norm",
        "none_s2_g128",
    }
    assert "--rope_scaling" not in " ".join(longlora.SETTINGS["none_s2"])
    assert longlora.SETTINGS["none_s2_g128"] == ("--s2_attn", "--s2_group=128")
    assert all(
        name.startswith("yarn_") for name in longlora.SETTINGS if "yarn" in " ".join(longlora.SETTINGS[name])
    )


def fake_study(monkeypatch, tmp_path, loss_of_rate):
    """The study with training, evaluation and timing faked: -> (train.py commands, cfg)"""
    trained = []
    monkeypatch.setattr(longlora, "ensure_trained", lambda commands, **kw: trained.extend(commands))
    monkeypatch.setattr(longlora, "run_python", lambda args, **kw: None)
    monkeypatch.setattr(longlora, "draw_pattern", lambda path: path)

    def evaluate(cfg, task, folders, path, data, multiples=longlora.LENGTHS):
        cells = {}
        for folder in folders:
            name = Path(folder).name
            rate = float(re.search(r"_lr([0-9.e-]+)_", name).group(1)) if "_lr" in name else 1e-3
            seed = int(name.rsplit("seed", 1)[-1]) if "seed" in name else 0
            for m in multiples:
                value = loss_of_rate(rate) + seed / 1e4 + ("s2" in name) * 0.1 + ("_4000steps" in name) * 0.02
                cells[(name, m * longlora.T)] = value if task == "loss" else 1 - value / 2
        return cells

    monkeypatch.setattr(longlora, "evaluate", evaluate)
    monkeypatch.setattr(
        longlora, "step_cost", lambda cfg, n, name, flags: dict.fromkeys(longlora.COST, 1) | {"method": name}
    )
    results = tmp_path / "results"
    cfg = longlora.StudyConfig(out_root=str(tmp_path / "out"), results=str(results))
    longlora.run_study(cfg, results, [])
    return trained, cfg


def test_each_setting_is_trained_over_the_seeds_at_the_rate_it_chose_on_validation(monkeypatch, tmp_path):
    trained, cfg = fake_study(monkeypatch, tmp_path, loss_of_rate=lambda rate: abs(rate - 5e-4) * 100)
    runs = [flags_of(command) for command in trained]
    assert runs[0]["pos"] == "rope" and "init_from" not in runs[0]  # the base
    sweep = [r for r in runs[1:] if r["seed"] == "1337" and r["max_iters"] == "1000"]
    assert {(r["out_dir"].split("/")[-1].split("_lr")[0], float(r["learning_rate"])) for r in sweep} == {
        (name, rate) for name in longlora.SETTINGS for rate in cfg.rates
    }
    others = [r for r in runs if r["seed"] in ("1338", "1339") and r["max_iters"] == "1000"]
    assert len(others) == 2 * len(longlora.SETTINGS) and {float(r["learning_rate"]) for r in others} == {5e-4}
    curve = [r for r in runs if r.get("max_iters") in ("250", "500", "2000", "4000")]  # every seed
    assert {(r["out_dir"].split("/")[-1].split("_lr")[0], r["seed"]) for r in curve} == {
        (s, seed) for s in longlora.CURVE_SETTINGS for seed in ("1337", "1338", "1339")
    }
    table = (tmp_path / "results" / "longlora_table.md").read_text()
    assert "| pi_full | 0.174 | **0.134** | 0.384 |" in table  # the rate table, the chosen rate in bold
    assert "| pi_s2 | pi_full | S²-Attn in training comes close to full attention | -5 points" in table
    # the budget table: each PI setting's longest budget against the one before, paired over the seeds
    assert "| pi_full | 4000 | 2000 | -1 points [-1, -1]: worse | +0.02 [+0.02, +0.02]: worse |" in table


def test_the_study_refuses_a_results_file_that_is_a_folder_before_training(monkeypatch, tmp_path, capsys):
    (tmp_path / "longlora.csv").mkdir()
    monkeypatch.setattr(longlora, "run_study", lambda *a: pytest.fail("the study started"))
    with pytest.raises(SystemExit) as exit_info:
        longlora.main([f"--results={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code != 0 and err.startswith(f"{longlora.PROG}: error: ") and "\n" not in err
    assert err.endswith("longlora.csv: is a folder; give a file name")


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--jobs=1000"], "jobs=1000: give 1 to"),
        (["--out_root=README.md"], "README.md is a file, not a folder"),
        (["--out_root=/proc/longlora"], "--out_root=/proc/longlora: cannot write there"),
    ],
)
def test_the_study_refuses_more_jobs_than_cores_or_an_unwritable_out_root_first(
    monkeypatch, tmp_path, capsys, flags, words
):
    monkeypatch.setattr(longlora, "run_study", lambda *a: pytest.fail("the study started"))
    with pytest.raises(SystemExit) as exit_info:
        longlora.main([f"--results={tmp_path}", *flags])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code != 0 and err.startswith(f"{longlora.PROG}: error: ") and "\n" not in err, err
    assert words in err, err


def test_run_as_a_script_it_says_how_to_run_it_in_one_line():
    done = subprocess.run(
        [sys.executable, "lab/experiments/longlora.py"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "lab/experiments/longlora.py: error: run it from the repository root as "
        "`python -m lab.experiments.longlora`"
    ]


def test_the_docs_longlora_tables_are_their_csvs():
    """docs/longlora_table.md, and every block the docs take from it, are what the study's code makes of
    docs/longlora.csv and docs/longlora_cost.csv: no number typed by hand."""
    found = longlora.read_tables(DOCS)
    assert (
        (DOCS / "longlora_table.md").read_text(encoding="utf-8").startswith(longlora.render(found) + "\n\n")
    )
    blocks = {}
    for page in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        blocks |= {
            n: b for n, b in generated_blocks(page.read_text(encoding="utf-8")).items() if "longlora" in n
        }
    assert blocks.keys() >= {"longlora_verdicts", "longlora_retrieval"}
    assert all(found[name][1] == body for name, body in blocks.items())


def test_budgets_train_each_setting_at_its_chosen_rate_from_their_base_and_replace_only_their_rows(
    monkeypatch, tmp_path
):
    """--budgets after the whole study: each named setting at each of its budgets over the seeds, at the rate
    the sweep chose, from {out_root}/{budget_base}; its budget rows replace that setting's, every other row is
    kept, each row's base column names its base, and the table's footer keeps the study's line beside its
    own."""
    trained, cfg = fake_study(monkeypatch, tmp_path, loss_of_rate=lambda rate: abs(rate - 5e-4) * 100)
    results = Path(cfg.results)
    before = longlora.read_rows(results / "longlora.csv", longlora.CSV_COLUMNS, longlora.PROG)
    (results / "longlora_table.md").write_text(
        "tables\n\nMeasured by `python -m lab.experiments.longlora`.\n"
    )
    trained.clear()
    budgets = ["pi_s2_lora:8000", "pi_full:16000,8000"]
    cfg = longlora.StudyConfig(out_root=cfg.out_root, results=str(results), budgets=budgets, seeds=2)
    longlora.run_budgets(cfg, results, ["--budgets", *budgets])
    runs = [flags_of(command) for command in trained]
    assert runs[0]["out_dir"] == f"{cfg.out_root}/passkey_rope_budget" and "init_from" not in runs[0]
    tuned = {(r["out_dir"].split("/")[-1].split("_lr")[0], r["max_iters"], r["seed"]) for r in runs[1:]}
    assert tuned == {
        (s, n, seed)
        for s, n in (("pi_s2_lora", "8000"), ("pi_full", "8000"), ("pi_full", "16000"))
        for seed in ("1337", "1338")
    }
    assert all(r["init_from"] == runs[0]["out_dir"] and float(r["learning_rate"]) == 5e-4 for r in runs[1:])
    after = longlora.read_rows(results / "longlora.csv", longlora.CSV_COLUMNS, longlora.PROG)
    replaced = lambda r: r["phase"] == "budget" and r["setting"] in ("pi_s2_lora", "pi_full")
    assert [r for r in after if not replaced(r)] == [r for r in before if not replaced(r)]
    assert {r["base"] for r in after if replaced(r)} == {"passkey_rope_budget (seed 1337)"}
    assert {r["base"] for r in after if not replaced(r)} == {"passkey_rope (seed 1337)"}
    assert {(r["setting"], r["steps"]) for r in after if replaced(r)} == {
        ("pi_s2_lora", "8000"),
        ("pi_full", "8000"),
        ("pi_full", "16000"),
    }
    table = (results / "longlora_table.md").read_text()
    assert "\n\nMeasured by `python -m lab.experiments.longlora`.\n\nBudget rows measured " in table
    assert "`python -m lab.experiments.longlora --budgets pi_s2_lora:8000 pi_full:16000,8000`" in table


@pytest.mark.parametrize(
    "budgets, words", [(["pi_fool:100"], "'pi_fool' is no setting"), (["pi_full:0"], "steps >= 1")]
)
def test_a_budget_of_no_setting_or_no_steps_is_refused(budgets, words):
    with pytest.raises(ValueError, match=words):
        longlora.StudyConfig(budgets=budgets)
