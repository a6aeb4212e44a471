"""lab.perf.bench runs end to end on a tiny model, reports only finite figures, writes its JSON, and refuses
bad flags in one line. Speed itself is measured by lab.perf.bench, never asserted here."""

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import error_line

from lab.perf import ab, bench
from positions import POS_SCHEMES

ROOT = Path(__file__).resolve().parent.parent

TINY = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=8",
    "--batch_size=2",
    "--train_steps=2",
    "--warmup_steps=1",
    "--gen_multiples",
    "1",
    "2",
    "--repeats=1",
    "--matmul_size=128",
    "--device=cpu",
]


def numbers(tree):
    """Every int and float in a nested dict/list (booleans are not figures)."""
    if isinstance(tree, dict):
        return [n for value in tree.values() for n in numbers(value)]
    if isinstance(tree, list):
        return [n for value in tree for n in numbers(value)]
    return [tree] if isinstance(tree, (int, float)) and not isinstance(tree, bool) else []


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    report = bench.main([*TINY, f"--json={path}"])
    return report, json.loads(path.read_text())


def test_every_scheme_is_trained_and_generated_with_finite_figures(tiny_report):
    report, _ = tiny_report
    assert list(report["training"]) == list(POS_SCHEMES) == list(report["generation"])
    figures = numbers(report["training"]) + numbers(report["generation"]) + [report["peak_flops"]]
    assert figures and all(math.isfinite(x) and x >= 0 for x in figures)
    for t in report["training"].values():
        assert t["timed_steps"] == 2 and t["ms_per_step"] > 0 and 0 < t["mfu"]
        assert t["flops_per_token"] > 6 * t["params"] - 6 * 8 * 16  # 6N (less the learned table) + attention


def test_cached_sampler_gives_the_reference_tokens_at_every_length(tiny_report):
    """The benchmark checks the samplers agree; on a tiny model they must
    (a mismatch reads NO in the table)."""
    report, _ = tiny_report
    for g in report["generation"].values():
        assert [row["new_tokens"] for row in g["rows"]] == [8, 16]
        assert all(row["cached_matches_reference"] is True and row["speedup"] > 0 for row in g["rows"])


def test_json_holds_the_figures_the_machine_and_the_command_line(tiny_report):
    report, written = tiny_report
    assert written == json.loads(json.dumps(report))
    assert {
        "command",
        "date",
        "machine",
        "source",
        "config",
        "peak_flops",
        "peak_source",
        "memory",
        "training",
        "generation",
        "compiled_decoding",
    } <= set(written)
    assert {"platform", "cpu_count", "gpu", "torch", "torch_threads"} <= set(written["machine"])
    assert written["command"].startswith("python -m lab.perf.bench --n_layer=1")
    assert written["config"]["device"] == "cpu" and written["config"]["dtype"] == "float32"
    assert {
        "ms_per_step",
        "tokens_per_sec",
        "compile_s",
        "flops_per_token",
        "tflops",
        "mfu",
        "peak_memory_mb",
    } <= set(written["training"]["rope"])
    row = written["generation"]["rope"]["rows"][0]
    assert {
        "cached_tok_s",
        "reference_tok_s",
        "speedup",
        "compiled_tok_s",
        "cached_matches_reference",
    } <= set(row)


def test_json_replaces_a_report_this_command_wrote_and_no_other_unless_replace(tiny_report, tmp_path, capsys):
    """A file of the user's at --json (a script, JSON of other keys, a JSON list) is refused in one line
    before any work (no threads line) and kept; --replace replaces it; a report this command wrote is replaced
    again without a flag, the normal rerun; --replace without --json is a usage error."""
    fast = [*TINY, "--pos=rope", "--train_steps=0", "--gen_multiples", "1"]
    kept = {
        "train.py": "print('mine')\n",
        "notes.json": '{"command": "mine", "config": {}}\n',
        "list.json": "[1, 2]\n",
    }
    for name, text in kept.items():
        (tmp_path / name).write_text(text)
        err = error_line(capsys, bench, [*fast, f"--json={tmp_path / name}"], 1)
        assert err.endswith(
            f"--json={tmp_path / name}: that file exists and is no earlier output of this command (not a "
            "JSON report with the keys command, machine, config); give another file, or add --replace to "
            "replace it"
        )
        assert (tmp_path / name).read_text() == text
    own = tmp_path / "bench.json"
    own.write_text(json.dumps(tiny_report[1], indent=2) + "\n")  # an earlier run's report
    bench.main([*fast, f"--json={own}"])
    assert json.loads(own.read_text())["command"] == shlex.join([*bench.PROG.split(), *fast, f"--json={own}"])
    replaced = tmp_path / "notes.json"
    bench.main([*fast, f"--json={replaced}", "--replace"])
    assert list(json.loads(replaced.read_text())["generation"]) == ["rope"]
    capsys.readouterr()
    err = error_line(capsys, bench, [*fast, "--replace"], 2)
    assert err.endswith("--replace applies to --json only: leave it out, or give --json"), err


def test_every_figure_comes_with_the_min_and_max_of_its_repeats(tiny_report):
    report, _ = tiny_report
    for t in report["training"].values():
        assert t["step_ms_min"] <= t["ms_per_step"] <= t["step_ms_max"]
    for g in report["generation"].values():
        for row in g["rows"]:
            for name in ("cached", "reference"):
                low, high = row[f"{name}_tok_s_range"]
                assert 0 < low <= row[f"{name}_tok_s"] <= high
    assert isinstance(report["warnings"], list)


def test_a_wide_spread_or_a_busy_machine_is_called_unreliable():
    """The loud note: a figure whose repeats spread by more than UNRELIABLE_SPREAD (max/min), and a CPU run
    whose threads plus the load average exceed the cores; a steady figure on an idle machine gets none."""
    cfg = bench.BenchConfig(device="cpu")
    machine = {"load_average": 0.1, "cpu_count": 2, "torch_threads": 1}
    steady = {"step_ms_min": 40.0, "step_ms_max": 44.0}
    rows = [{"new_tokens": 64, "cached_tok_s_range": [100.0, 400.0], "reference_tok_s_range": None}]
    rows[0]["compiled_tok_s_range"] = None
    report = {"machine": machine, "training": {"rope": steady}, "generation": {"alibi": {"rows": rows}}}
    (spread,) = bench.warnings(report, cfg)
    assert "alibi cached tok/s at 64 4.0x" in spread and "rope" not in spread
    busy = {"machine": machine | {"load_average": 1.9}, "training": {"rope": steady}, "generation": {}}
    assert "busy: load average 1.9 on 2 cores" in bench.warnings(busy, cfg)[0]
    quiet = {"machine": machine, "training": {"rope": steady}, "generation": {}}
    assert bench.warnings(quiet, cfg) == []


def test_quick_sets_a_short_run():
    cfg = bench.BenchConfig(quick=True, train_steps=500)
    assert {name: getattr(cfg, name) for name in bench.QUICK} == bench.QUICK


def test_several_schemes_are_measured_in_the_order_given():
    """--pos=a,b,c: only those, in that order (a run cut short by a timeout keeps the first ones), training
    and generation alike."""
    report = bench.main([*TINY, "--pos=rope,learned", "--gen_multiples", "1"])
    assert list(report["training"]) == ["rope", "learned"] == list(report["generation"])


def test_reference_past_its_limit_is_reported_skipped_not_run():
    report = bench.main([*TINY, "--pos=alibi", "--train_steps=0", "--reference_max_tokens=8"])
    short, long = report["generation"]["alibi"]["rows"]
    assert short["reference_tok_s"] > 0 and long["reference_tok_s"] is None and "skipped" in long["reference"]
    assert long["cached_matches_reference"] is True  # checked against the shorter reference's tokens
    assert report["training"] == {}


def test_generation_runs_in_the_dtype_asked_and_the_table_and_json_say_which(monkeypatch, capsys, tmp_path):
    """--dtype=bfloat16: every sampler gets the model cast to bfloat16 (its KV caches too, lm_head's dtype),
    each generation row and the table's dtype column say bfloat16; a CPU's default stays float32."""
    seen = []  # (weights' dtype, first layer's KV cache dtype) per generate_cached call

    def spy(model, *args, **kwargs):
        out = generate_cached(model, *args, **kwargs)
        seen.append((model.lm_head.weight.dtype, model.transformer.h[0].attn.kv_cache.k.dtype))
        return out

    generate_cached = bench.generate_cached
    monkeypatch.setattr(bench, "generate_cached", spy)
    fast = [*TINY, "--pos=rope", "--train_steps=0", "--gen_multiples", "1"]
    for asked, dtype in ((["--dtype=bfloat16"], torch.bfloat16), ([], torch.float32)):
        seen.clear()
        path = tmp_path / f"{dtype}.json"
        report = bench.main([*fast, *asked, f"--json={path}"])
        name = str(dtype).removeprefix("torch.")
        assert seen and set(seen) == {(dtype, dtype)}
        rows = json.loads(path.read_text())["generation"]["rope"]["rows"]
        assert (
            [row["dtype"] for row in rows]
            == [name]
            == [r["dtype"] for r in report["generation"]["rope"]["rows"]]
        )
        table = capsys.readouterr().out.splitlines()
        head = next(line for line in table if line.startswith("| pos | dtype |"))
        (row,) = [line for line in table if line.startswith("| rope |")]
        assert row.split(" | ")[1] == name and head.split(" | ")[1] == "dtype"


def test_no_warmup_steps_times_every_step():
    """--warmup_steps=0: every step is timed, the first one (compiling, with --compile) among them; no
    first-step or compile time is reported apart."""
    report = bench.main([*TINY, "--pos=rope", "--warmup_steps=0", "--gen_multiples"])
    rope = report["training"]["rope"]
    assert rope["timed_steps"] == 2 and rope["ms_per_step"] > 0 and rope["first_step_s"] is None


def test_a_preset_gives_its_model_and_batch_and_flags_override_it():
    """--config takes the model keys and batch settings of a training preset, ignores its training-only keys
    (learning_rate, max_iters, ...), and takes the vocabulary from its dataset."""
    cfg = bench.parse_args(["--config", "configs/cpu_recipe.toml", "--n_layer=2"])
    assert (cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.batch_size, cfg.bias) == (
        64,
        2,
        4,
        128,
        12,
        False,
    )
    assert (cfg.device, cfg.compile, cfg.vocab_size) == ("cpu", False, 65)
    big = bench.parse_args(["--config=configs/gpt2_124m.toml", "--grad_accum=2", "--device=cpu"])
    assert (big.n_layer, big.n_embd, big.block_size, big.batch_size, big.grad_accum) == (12, 768, 1024, 16, 2)
    assert big.vocab_size == 50257


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--pos=rotary"], ["pos='rotary'", "give all, or one or more of learned, sinusoidal, rope"]),
        (["--pos=rope,rope"], ["each once"]),
        (["--train_step=3"], ["did you mean --train_steps?"]),
        (["--gen_multiples", "0"], ["gen_multiples must be >= 1"]),
        (["--n_head=3"], ["must be divisible by n_head=3"]),
        (["--config=configs/missing.toml"], ["--config configs/missing.toml"]),
        (["--config"], ["--config: expected one argument"]),
        (["--device=tpu"], ["choose from auto, cpu, cuda, cuda:N, mps"]),
    ],
)
def test_bad_flags_are_one_line_errors(capsys, argv, words):
    err = error_line(capsys, bench, argv, 2)
    assert all(w in err for w in words), err


def test_a_presets_bad_values_are_one_line_errors_naming_the_choices(capsys, tmp_path):
    """A preset's values go through the flags' own checks (a bad dtype names the valid ones), and so do those
    of a BenchConfig built in code; an unknown dataset names the datasets there are."""
    preset = tmp_path / "bad.toml"
    preset.write_text('dtype = "bf16"\nlearning_rate = 1e-3\n')
    err = error_line(capsys, bench, [f"--config={preset}"], 2)
    assert str(preset) in err and "'bf16'" in err and "bfloat16" in err, err
    with pytest.raises(ValueError, match="dtype='bf16' is not one of auto, .*bfloat16"):
        bench.BenchConfig(dtype="bf16")
    err = error_line(capsys, bench, ["--dataset=shakespear", "--vocab_size=65"], 2)
    assert "dataset='shakespear' is not a dataset here" in err and "shakespeare_char" in err, err


# A revision whose model.py carries its own cached generation (no generation.py): GPT.generate_cached.
GPT_GENERATE_CACHED_REVISION = "491106f"


def skip_without_git_history(revision="HEAD"):
    """lab.perf.ab --against reads model.py from git history: a tarball or a shallow clone may not hold it."""
    try:
        found = (
            subprocess.run(
                ["git", "-C", str(ROOT), "cat-file", "-e", f"{revision}:model.py"], capture_output=True
            ).returncode
            == 0
        )
    except FileNotFoundError:  # no git at all
        found = False
    if not found:
        pytest.skip(
            f"lab.perf.ab --against needs {revision}:model.py from git history, which this checkout lacks"
        )


def test_ab_checks_model_versions_before_timing_them():
    """lab.perf.ab: model.py loaded from a git revision (HEAD) decodes the same tokens beside this tree's (it
    refuses to time either otherwise); training steps too. Every figure is finite. Speed is not asserted."""
    skip_without_git_history()
    decoding = ab.main(["--against=HEAD", "--pos=rope,alibi", "--new_tokens=6", "--rounds=1"])
    training = ab.main(["--against=HEAD", "--measure=train", "--pos=learned,rope", "--steps=1", "--rounds=1"])
    assert [row[0] for row in decoding] == ["rope", "alibi"]
    assert [row[0] for row in training] == ["learned", "rope"]
    assert all(math.isfinite(x) and x > 0 for row in decoding + training for x in row[1:])


def test_ab_loads_a_revisions_generation_py_against_its_own_model_py():
    """A revision's generation.py imports that revision's model.py (not this tree's), and `import model` still
    means this tree's afterwards."""
    skip_without_git_history()
    side = ab.side_at("HEAD")
    assert sys.modules["generation_at_revision"].sample_next is side.module.sample_next
    assert side.module is not ab.current and sys.modules["model"] is ab.current


def test_ab_measures_a_revision_whose_gpt_holds_generate_cached():
    """A revision without generation.py has GPT.generate_cached as a method: lab.perf.ab calls that one
    there."""
    skip_without_git_history(GPT_GENERATE_CACHED_REVISION)
    decoding = ab.main(
        [f"--against={GPT_GENERATE_CACHED_REVISION}", "--pos=rope", "--new_tokens=6", "--rounds=1"]
    )
    assert [row[0] for row in decoding] == ["rope"] and all(x > 0 for x in decoding[0][1:])


def test_ab_ratio_against_learned_is_the_geometric_mean_of_paired_rounds():
    """lab.perf.ab's ratio pairs each round with learned's round: rounds at 1.0x and 1.21x give 1.1x (not the
    medians' ratio), inside its t interval; a constant ratio, a zero-width interval; one round, none."""
    cell = ab.against([2.0, 2.42], [2.0, 2.0])
    ratio, low, high = map(float, cell.replace("x learned [", " ").replace(",", " ").rstrip("]").split())
    assert cell.startswith("1.100x learned [") and low < 1.0 < 1.21 < high
    assert ab.against([2.0, 4.0, 3.0], [1.0, 2.0, 1.5]) == "2.000x learned [2.000, 2.000]"
    assert ab.against([3.0], [2.0]) == "1.500x learned"
