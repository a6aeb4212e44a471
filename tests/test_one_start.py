"""Every entry point starts the same way: its settings' rules declared once (an empty path, a device's name,
--threads) and checked by check_fields; an unknown flag or preset key says where the flags of training methods
live; a checkpoint records the command that trained it, which train.py --resume's refusal gives; a study
never writes where it reads."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_BLOCK, TINY_RUN, error_line, train_error_line

import sample
import train
from lab import eval_length
from lab.experiments import extrapolation_results, longrope
from lab.perf import ab, bench
from plumbing.checkpoint import load_checkpoint, save_checkpoint
from plumbing.cli import device_flag, threads_flag

ROOT = Path(__file__).resolve().parents[1]
POINTER = "(training methods' flags: python -m lab.NAME --help)"
CONFIGS = {
    "train": train.TrainConfig,
    "sample": sample.SampleConfig,
    "eval_length": eval_length.EvalConfig,
    "bench": bench.BenchConfig,
    "ab": ab.ABConfig,
    "longrope": longrope.SearchConfig,
    "extrapolation": extrapolation_results.StudyConfig,
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_device_and_threads_are_declared_once_with_their_rule(name):
    """Each config's --device is plumbing.cli.device_flag and its --threads threads_flag: the rule lives in
    the field's metadata (check_fields runs it), not in the config's __post_init__."""
    declared = {f.name: f for f in dataclasses.fields(CONFIGS[name])}
    if "device" in declared:
        assert declared["device"].metadata["rule"] == device_flag().metadata["rule"]
    if "threads" in declared:
        assert declared["threads"].metadata["rule"] == threads_flag().metadata["rule"]
    assert "device" in declared or "threads" in declared


@pytest.mark.parametrize(
    "config, values, words",
    [
        (train.TrainConfig, dict(out_dir=""), "--out_dir is empty (an unset shell variable?)"),
        (train.TrainConfig, dict(init_from=" "), "--init_from is empty (an unset shell variable?)"),
        (train.TrainConfig, dict(dataset=""), "--dataset is empty (an unset shell variable?)"),
        (sample.SampleConfig, dict(compare=[]), "--compare is empty (an unset shell variable?)"),
        (sample.SampleConfig, dict(out_dir=""), "--out_dir is empty (an unset shell variable?)"),
        (train.TrainConfig, dict(device="gpu"), "device='gpu' is not a device"),
        (sample.SampleConfig, dict(threads="0"), "--threads=0: give auto or a number of threads"),
    ],
)
def test_a_config_built_in_code_is_checked_by_the_same_declared_rules(config, values, words):
    """The path rule and the device and threads checks hold for a config however it is built (flags, a
    preset, code): one ValueError line."""
    with pytest.raises(ValueError) as raised:
        config(**values)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_an_unknown_flag_of_train_py_says_where_training_methods_flags_live(capsys):
    """--lora_rank=4 --s2_attn to train.py: one line, status 2, the valid flags, then the pointer to the
    lab's commands (generic: no method named)."""
    err = train_error_line(capsys, ["--lora_rank=4", "--s2_attn"], 2)
    assert "unrecognized arguments: --lora_rank=4 --s2_attn" in err and err.endswith(POINTER)


def test_an_unknown_preset_key_says_where_training_methods_flags_live(capsys, tmp_path):
    """A TOML preset with lora_rank = 4: one line, status 2, naming the file and the key, then the pointer."""
    preset = tmp_path / "p.toml"
    preset.write_text("lora_rank = 4\n")
    err = train_error_line(capsys, [f"--config={preset}"], 2)
    assert f"{preset}: unknown key 'lora_rank'" in err and err.endswith(POINTER)


def test_the_pointer_is_said_only_by_the_commands_that_train(capsys):
    """sample.py takes no training flags: its unknown flag ends with its own valid flags."""
    err = error_line(capsys, sample, ["--lora_rank=4"], 2)
    assert "unrecognized arguments: --lora_rank=4" in err and POINTER not in err


def test_train_py_records_the_command_that_trained_it(tmp_path):
    """The checkpoint's "command" is the command as typed: the program and its flags."""
    train.main([*TINY_RUN, f"--out_dir={tmp_path}"])
    command = load_checkpoint(tmp_path / "ckpt.pt")["command"]
    assert command.startswith("python train.py --n_layer=1 ") and command.endswith(f"--out_dir={tmp_path}")


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    """A LoRA + S²-Attn run of python -m lab.finetune from a tiny base run."""
    from lab.finetune import __main__ as finetune  # the core's tests run without lab/

    base, tuned = tmp_path_factory.mktemp("base"), tmp_path_factory.mktemp("tuned")
    train.main([*TINY_RUN, f"--out_dir={base}"])
    flags = [f"--init_from={base}", f"--block_size={2 * TINY_BLOCK}", f"--out_dir={tuned}"]
    finetune.main([*TINY_RUN, *flags, "--s2_attn", "--lora_rank=2"])
    return base, tuned


def test_resuming_another_commands_run_gives_its_command_plus_resume(capsys, fine_tuned):
    """train.py --resume of lab.finetune's run: one line, status 1, giving the command that trained it with
    --resume; the checkpoint is left as it was."""
    base, tuned = fine_tuned
    before = (tuned / "ckpt.pt").read_bytes()
    flags = [f"--init_from={base}", f"--block_size={2 * TINY_BLOCK}", f"--out_dir={tuned}", "--resume"]
    err = train_error_line(capsys, [*TINY_RUN, *flags], 1)
    said = err.split("resume it with the command that trained it: ", 1)[1]
    assert said.startswith("python -m lab.finetune --n_layer=1 ") and said.endswith("--lora_rank=2 --resume")
    assert (tuned / "ckpt.pt").read_bytes() == before


def test_an_older_checkpoint_without_its_command_still_names_the_flags(capsys, fine_tuned, tmp_path):
    """A file written before checkpoints recorded the command: the refusal names the flags it took, as
    before, and the file otherwise opens (a missing "command" is no damage)."""
    base, tuned = fine_tuned
    older = tmp_path / "older"
    older.mkdir()
    ckpt = load_checkpoint(tuned / "ckpt.pt")
    del ckpt["command"]
    save_checkpoint(ckpt, older / "ckpt.pt")
    flags = [f"--init_from={base}", f"--block_size={2 * TINY_BLOCK}", f"--out_dir={older}", "--resume"]
    err = train_error_line(capsys, [*TINY_RUN, *flags], 1)
    assert "lora_rank" in err and err.endswith("resume it with the command that trained it")


def study(*argv):
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["lab.experiments.extrapolation", "--quick", "--results=data/shakespeare_char"], "--results"),
        (["lab.experiments.extrapolation", "--quick", "--results=configs"], "--results"),
        (["lab.experiments.extrapolation", "--quick", "--results=out/x", "--out_root=data/r"], "--out_root"),
        (["lab.experiments.longlora", "--quick", "--results=data/shakespeare_char"], "--results"),
    ],
    ids=["results-in-a-dataset", "results-in-configs", "out_root-in-data", "longlora"],
)
def test_a_study_never_writes_where_it_reads(argv, flag):
    """A study's output in a folder it reads (data/, where every dataset is; configs/, its presets) is
    refused in one line before any run (a study replaces its own results: the rule does not depend on
    that); nothing is written there."""
    before = sorted(p.name for p in (ROOT / "data").rglob("*"))
    done = study(*argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "a folder this run reads" in lines[0], done.stderr
    assert f"{flag}=" in lines[0] and "Traceback" not in done.stderr
    assert sorted(p.name for p in (ROOT / "data").rglob("*")) == before


def test_a_refused_study_leaves_no_folder_its_checks_made(tmp_path):
    """The writability check makes an output's folders to probe them: a study refused after it (here its
    --out_root, in data/) removes them again, so a refused command leaves nothing on disk."""
    results = tmp_path / "new" / "results"
    done = study("lab.experiments.extrapolation", "--quick", f"--results={results}", "--out_root=data/r")
    assert done.returncode == 1 and "--out_root" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == [] and not (ROOT / "data" / "r").exists()


def test_a_search_never_writes_over_its_checkpoint_or_dataset(capsys, tmp_path):
    """lab.experiments.longrope --out in the dataset's folder it measures on: one line, before the search."""
    run = tmp_path / "run"
    train.main([*TINY_RUN, f"--out_dir={run}"])
    capsys.readouterr()
    err = error_line(capsys, longrope, [str(run), "--out=data/shakespeare_char", "--device=cpu"], 1)
    assert "--out=" in err and "a folder this run reads" in err
    assert not (ROOT / "data" / "shakespeare_char" / "factors.json").exists()
