"""The GPU preset of the length study (configs/extrapolation_gpu.toml, `--preset gpu`), end to end on a CPU at
tiny sizes: its settings come from the file and flags override them, its base runs train --jobs at once, and a
later run with more --seeds keeps the finished runs and their evaluation and writes every seed's rows to the
same CSV."""

import csv

import pytest

from lab.experiments import extrapolation as study

# train.py flags that shrink the preset's 10.7M-parameter model and its schedule to a few seconds on a CPU
TINY = "--n_layer=1 --n_head=2 --n_embd=16 --block_size=32 --batch_size=4 --max_iters=3 --lr_decay_iters=3"
TINY += " --warmup_iters=1 --eval_interval=3 --eval_iters=1 --log_interval=1 --compile=false"


def test_the_gpu_preset_reads_its_file_and_flags_override_it():
    cfg = study.parse_args(["--preset", "gpu"])
    assert (cfg.config, cfg.device, cfg.jobs) == ("configs/shakespeare_char.toml", "cuda", 7)
    assert "--max_iters=2000" in cfg.train_flags and cfg.results == "docs/shakespeare_char"
    cfg = study.parse_args(["--preset", "gpu", "--task", "passkey", "--jobs=2", "--device=cpu"])
    assert (cfg.config, cfg.device, cfg.jobs) == ("configs/passkey_gpu.toml", "cpu", 2)
    assert cfg.out_root == "out/passkey_gpu"


def test_an_unknown_preset_is_one_line_naming_the_presets(capsys):
    with pytest.raises(SystemExit) as exit_info:
        study.main(["--preset", "tpu"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err and "'gpu'" in err, err


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_the_gpu_preset_runs_end_to_end_at_tiny_sizes_and_a_later_run_adds_a_seed(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    argv = ["--preset", "gpu", "--device=cpu", "--schemes", "alibi", f"--train_flags={TINY}", "--jobs=2"]
    argv += ["--lengths=1,2", "--max_windows=2", f"--out_root={out}", f"--results={results}"]
    study.main(argv)
    first = out / "shakespeare_char_alibi"
    assert (out / "shakespeare_char_alibi.log").is_file()  # trained by the --jobs pool, its output apart
    assert {r["checkpoint"] for r in rows(results / "extrapolation_alibi.csv")} == {str(first)}
    kept = (first / "ckpt.pt", out / "extrapolation_alibi_seed1337.csv")
    stamps = [path.stat().st_mtime_ns for path in kept]
    study.main([*argv, "--seeds=2"])
    assert [path.stat().st_mtime_ns for path in kept] == stamps  # the run and its evaluation kept
    found = {r["checkpoint"] for r in rows(results / "extrapolation_alibi.csv")}
    assert found == {str(first), str(out / "shakespeare_char_alibi_seed1338")}
    assert "Over 2 seed(s)" in (results / "extrapolation_alibi_table.md").read_text(encoding="utf-8")
