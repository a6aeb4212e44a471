"""Every script takes its flags from plumbing/cli.py: the same syntax, the same one-line errors; and the
layout rules, read from the files git tracks.

train.py and sample.py are run through main() as a user would; a mistake must stop them before any work with
exit status 2 and one line (never argparse's usage block), abbreviations are refused, and typos get a guess.
"""

import ast
import re
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

import pytest
import torch
from helpers import error_line

import sample
import train
from plumbing.cli import parse_list

ROOT = Path(__file__).resolve().parents[1]
# What a user runs: the root's scripts and the modules run with python -m (fnmatch patterns of module names).
ENTRY_POINTS = (
    "train",
    "sample",
    "lab.eval_length",
    "lab.perf.bench",
    "lab.perf.ab",
    "lab.perf.threads",
    "lab.demo.*",
    "lab.experiments.*",
    "data.*.prepare",
    "lab.course.__main__",
    "lab.finetune.__main__",
)
# train.py's run with a training method, a train.TrainConfig subclass (train.main(argv, Config)): these
# entry points import train, and no other entry point
EXTENDS_TRAIN = ("lab.finetune.__main__",)
SHARED_MODULES = (
    "model",
    "generation",
    "positions",
    "plumbing.*",
    "lab",
    "lab.tables",  # the studies' and benchmarks' tables, CSV cells and generated docs blocks
    "lab.outputs",  # the files they write, checked before the work
    "lab.measure.*",
    "lab.finetune",
    "lab.finetune.lora",
    "lab.finetune.s2",
    "lab.finetune.longlora",  # the two joined to train.py's run: the extension lab.finetune runs
    "data.common",
    "data.writing",  # writing a dataset: the prepare scripts share it
    "data.passkey.task",
    "lab.course.*",
    "lab.experiments.runs",  # the studies' and demos' trained runs: shared by them, run by none
    # each study's settings, run names and CSV columns with their readers: shared by the study and by
    # lab.experiments.findings, which writes the docs' sentences from the committed CSVs
    "lab.experiments.extrapolation_results",
    "lab.experiments.longlora_results",
    "lab.experiments.longrope_ablation_results",
    "lab.perf.ops",  # the operators a decode step launches: lab.perf.bench's column and the tests' targets
)


@pytest.mark.parametrize("script", [train, sample], ids=["train", "sample"])
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--seeed=3"], ["unrecognized arguments: --seeed=3", "did you mean --seed?", "valid flags:"]),
        (["--see=3"], ["unrecognized arguments: --see=3"]),  # an abbreviation of --seed is not --seed
        (["--seed=abc"], ["argument --seed: expected an integer, got 'abc'"]),
        (["--device=tpu"], ["choose from auto, cpu, cuda, cuda:N, mps"]),
    ],
)
def test_both_scripts_refuse_typos_abbreviations_and_bad_values_in_one_line(capsys, script, argv, words):
    """The same mistakes get the same one-line error from train.py and sample.py, naming the script."""
    err = error_line(capsys, script, argv, 2)
    assert err.startswith(f"{script.__name__}.py: error: ") and all(w in err for w in words), err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--temperatur=0.5"], ["--temperatur=0.5", "did you mean --temperature?"]),
        (["--stream=maybe"], ["argument --stream: expected a boolean"]),
        (["--top_k=-3"], ["top_k must be >= 0"]),
        (["--rope_scaling=cubic"], ["invalid choice: 'cubic'", "'linear', 'ntk', 'dynamic', 'yarn'"]),
    ],
)
def test_sample_flag_mistakes_are_one_line_errors(capsys, argv, words):
    err = error_line(capsys, sample, argv, 2)
    assert all(w in err for w in words), err


def test_sample_reads_a_config_file_like_train(tmp_path, capsys):
    """--config works for sample.py as for train.py, and an unknown key names the valid ones."""
    preset = tmp_path / "sample.toml"
    preset.write_text("temperature = 0.5\ntop_k = 0\nmax_context = 32\n")
    cfg = sample.parse_args([f"--config={preset}", "--max_context=16"])
    assert (cfg.temperature, cfg.top_k, cfg.max_context) == (0.5, None, 16)
    preset.write_text("temprature = 0.5\n")
    err = error_line(capsys, sample, [f"--config={preset}"], 2)
    assert "unknown key 'temprature'" in err and "temperature" in err


def project_files(suffix=""):
    """The project's own files (paths from the root, present in the working tree), as git tracks them: a
    virtual environment, datasets or runs inside the checkout are not the project. Skips outside a git
    checkout."""
    try:
        top = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"], capture_output=True, text=True
        )
        listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True)
    except FileNotFoundError:  # no git at all
        top = None
    if top is None or top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT:
        pytest.skip("the layout tests read the files git tracks: this tree is not a git checkout of its own")
    return [name for name in listed.stdout.split("\0") if name.endswith(suffix) and (ROOT / name).is_file()]


def module_name(path):
    """train.py -> train, data/common.py -> data.common, lab/perf/__init__.py -> perf."""
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path):
    """Every dotted name the file imports, anywhere in it (function bodies too): for `from a.b import c` both
    a.b and a.b.c, since c may be a module; relative imports resolved from the file's package."""
    package = module_name(path) if path.endswith("__init__.py") else module_name(path).rpartition(".")[0]
    package_parts = package.split(".") if package else []
    names = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package_parts[: len(package_parts) + 1 - node.level] if node.level else []
            base += node.module.split(".") if node.module else []
            names |= {".".join(base)} if base else set()
            names |= {".".join([*base, alias.name]) for alias in node.names}
    return names


def imported_modules(path):
    """The top-level packages a file imports."""
    return {name.split(".")[0] for name in imported_names(path)}


def project_modules():
    """{module name: path} of every tracked .py file but the tests."""
    return {module_name(path): path for path in project_files(".py") if not path.startswith("tests/")}


def test_no_script_imports_another_script():
    """Entry points (train.py, sample.py, lab/eval_length.py, and what runs as python -m: lab.perf.bench,
    lab.perf.ab, lab.perf.threads, lab.demo.*, lab.experiments.*, data.*.prepare) share modules (model,
    generation, plumbing/*, data/common.py, lab/experiments/runs.py), never each other, but for train.py's
    extensions (EXTENDS_TRAIN), which import train and no other; no shared module imports one either, or the
    entry points would import each other through it."""
    modules = project_modules()
    is_one = lambda name, patterns: any(fnmatch(name, pattern) for pattern in patterns)
    entry_points = {name for name in modules if is_one(name, ENTRY_POINTS) > is_one(name, SHARED_MODULES)}
    assert {"train", "sample", "lab.eval_length", "lab.perf.bench", "lab.perf.ab"} <= entry_points
    allowed = lambda name: {name, "train"} if name in EXTENDS_TRAIN else {name}
    offenders = {
        path: sorted(imported_names(path) & entry_points - allowed(name)) for name, path in modules.items()
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_every_module_is_an_entry_point_or_a_shared_module():
    """A new module says which it is by where it lives: at the root only the entry points and model.py and
    generation.py and positions.py; shared code goes in plumbing/, measuring code in lab/measure/
    (data/common.py reads the data format, data/writing.py writes it)."""
    unsorted = [
        path
        for name, path in project_modules().items()
        if not path.endswith("__init__.py")
        and not any(fnmatch(name, pattern) for pattern in ENTRY_POINTS + SHARED_MODULES)
    ]
    assert unsorted == []


def test_the_root_holds_at_most_six_modules_and_no_file_shares_a_folders_name():
    """bench.py beside a folder bench/ is the trap: with bench/__init__.py, `import bench` gets the folder."""
    files = project_files()
    assert len([path for path in files if "/" not in path and path.endswith(".py")]) <= 6
    folders = {
        (folder.parent, folder.name)
        for path in files
        for folder in PurePosixPath(path).parents
        if folder.name
    }
    stems = {(PurePosixPath(path).parent, PurePosixPath(path).stem) for path in files}
    assert sorted(str(parent / name) for parent, name in folders & stems) == []


def test_no_module_but_the_tests_edits_sys_path():
    """Everything runs from the root (python train.py, python -m lab.perf.ab, ...), where the modules import
    each other as they are; a sys.path edit would make a script work only from where it was tried, or import a
    module twice under two names."""

    def touches_sys_path(path):
        return any(
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
            for node in ast.walk(ast.parse((ROOT / path).read_text()))
        )

    assert [path for path in project_modules().values() if touches_sys_path(path)] == []


def top_level_imports(path):
    tree = ast.parse((ROOT / path).read_text())
    found = {
        alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names
    }
    return found | {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}


def test_positions_imports_nothing_from_the_repository_but_the_settings_leaf():
    """positions.py, the file a student studies, needs torch, the standard library and plumbing/fields.py
    (how a setting is declared), which needs the standard library alone."""
    stdlib = set(sys.stdlib_module_names)
    assert top_level_imports("positions.py") - stdlib == {"torch", "plumbing"}
    repository = {
        name for name in imported_names("positions.py") if name.split(".")[0] not in stdlib | {"torch"}
    }
    assert {name.rpartition(".")[0] if name.count(".") > 1 else name for name in repository} == {
        "plumbing.fields"
    }
    assert (
        top_level_imports("plumbing/fields.py") - stdlib
        == set()
        == imported_modules("plumbing/fields.py") - stdlib
    )


def test_model_imports_only_torch_and_positions():
    """`import model` needs torch and positions.py alone (OpenAI's GPT-2 weights, through the optional
    transformers, are plumbing.gpt2's)."""
    assert top_level_imports("model.py") - set(sys.stdlib_module_names) == {"torch", "positions"}
    assert imported_modules("model.py") - set(sys.stdlib_module_names) == {"torch", "positions"}


# The oldest checkpoint format: these keys, and these train_config fields.
OLD_TRAIN_CONFIG = dict(
    dataset="shakespeare_char",
    batch_size=4,
    grad_accum=1,
    learning_rate=1e-3,
    weight_decay=0.1,
    beta1=0.9,
    beta2=0.99,
    grad_clip=1.0,
    max_iters=2,
    warmup_iters=100,
    lr_decay_iters=2,
    min_lr=1e-4,
    eval_interval=2,
    eval_iters=2,
    log_interval=1,
    wandb=False,
    wandb_project="posgpt",
    wandb_run_name=None,
    out_dir="OUT",
    resume=False,
    device="cpu",
    dtype="float32",
    compile=False,
    seed=1337,
)
OLD_KEYS = {
    "model",
    "model_config",
    "train_config",
    "iter_num",
    "best_val_loss",
    "best_iter",
    "meta",
    "optimizer",
    "scaler",
    "sampler",
    "rng",
    "wandb_run_id",
}


def test_a_checkpoint_with_only_the_original_keys_samples_and_resumes(tmp_path, capsys):
    """A checkpoint dict with exactly OLD_KEYS and OLD_TRAIN_CONFIG's fields (no init_from, no finished,
    grad_accum an int) loads in sample.py and resumes in train.py."""
    flags = [
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=16",
        "--block_size=16",
        "--batch_size=4",
        "--eval_iters=2",
        "--eval_interval=2",
        "--log_interval=1",
        "--lr_decay_iters=2",
        "--device=cpu",
        "--compile=false",
        f"--out_dir={tmp_path}",
    ]
    train.main([*flags, "--max_iters=2"])
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    old = {key: ckpt[key] for key in OLD_KEYS} | {
        "train_config": OLD_TRAIN_CONFIG | {"out_dir": str(tmp_path)}
    }
    assert set(old) == OLD_KEYS
    torch.save(old, tmp_path / "ckpt.pt")
    (tmp_path / "best.pt").unlink()
    loaded, samples, _ = sample.main([f"--out_dir={tmp_path}", "--max_new_tokens=8", "--stream=off"])
    assert len(samples[0]) == 1 + 8
    capsys.readouterr()
    resumed = train.main([*flags, "--max_iters=3", "--resume"])
    assert resumed["iter_num"] == 3 and list(resumed["losses"]) == [3]
    assert re.search(r"resuming \S+ at step 2", capsys.readouterr().out)


# A checkpoint of an older format (no finished, no RoPE variants): pos=rope, 1 layer x 16 dims, block_size 16,
# 2 of 3 steps.
ROPE_FIXTURE = ROOT / "tests" / "fixtures" / "ckpt_rope_without_finished.pt"


def test_the_fixture_checkpoint_samples_and_resumes_to_the_loss_of_an_uninterrupted_run(tmp_path):
    """The fixture file samples past its block_size, and resumes to the very loss that an uninterrupted run of
    this code reaches at the same step: the file format and the training arithmetic are the fixture's."""
    flags = [
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=16",
        "--block_size=16",
        "--batch_size=4",
        "--eval_iters=2",
        "--eval_interval=2",
        "--log_interval=1",
        "--lr_decay_iters=4",
        "--device=cpu",
        "--compile=false",
        "--pos=rope",
        "--max_iters=3",
    ]
    old_dir, fresh_dir = tmp_path / "old", tmp_path / "fresh"
    old_dir.mkdir()
    (old_dir / "ckpt.pt").write_bytes(ROPE_FIXTURE.read_bytes())
    _, samples, _ = sample.main([f"--out_dir={old_dir}", "--max_new_tokens=40", "--stream=off"])
    assert len(samples[0]) == 1 + 40  # 2.5 x its block_size
    resumed = train.main([*flags, f"--out_dir={old_dir}", "--resume"])
    fresh = train.main([*flags, f"--out_dir={fresh_dir}"])
    assert resumed["iter_num"] == 3 and list(resumed["losses"]) == [3]
    assert resumed["losses"][3] == fresh["losses"][3]


def test_python_version_check_is_one_line():
    """cli.py says which Python it needs before tomllib's import could fail with a traceback."""
    source = (ROOT / "plumbing" / "cli.py").read_text()
    assert source.index("sys.version_info < (3, 11)") < source.index("import tomllib")
    code = "import sys; sys.version_info = (3, 10, 12); sys.version = '3.10.12 (fake)'; import plumbing.cli"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (
        done.returncode == 1
        and done.stderr.strip() == "posgpt needs Python 3.11 or newer (for tomllib); this is Python 3.10.12"
    ), done.stderr


def test_a_list_flag_keeps_the_order_given_and_refuses_unknown_or_repeated_names():
    """cli.parse_list, behind lab.perf.bench's and lab.perf.ab's --pos: the names in the order given,
    `everything` for all of them in their own order, and one line naming the choices for an unknown or
    repeated name."""
    choices = ("learned", "rope", "alibi")
    assert parse_list("pos", "alibi,learned", choices) == ("alibi", "learned")
    assert parse_list("pos", "all", choices, everything="all") == choices
    for bad in ("rotary", "rope,rope", "all", "rope,"):
        with pytest.raises(
            ValueError, match=r"give one or more of learned, rope, alibi, comma-separated and each once"
        ):
            parse_list("pos", bad, choices)


@pytest.mark.parametrize(
    "script, argv, names",
    [
        (train, ["--config="], "argument --config: "),
        (sample, ["--config", ""], "argument --config: "),
        (sample, ["--start=FILE:"], "--start=FILE: "),
        (sample, ["--compare", ""], "argument --compare: "),
        (sample, ["--compare", "out/a", " "], "argument --compare: "),
    ],
    ids=["config", "config-sample", "prompt-file", "compare", "compare-second"],
)
def test_an_empty_path_is_refused_as_empty_not_read_as_the_current_folder(capsys, script, argv, names):
    """An empty path (an unset shell variable) given to --config, --start=FILE: or as one of --compare's is
    refused as every other empty value is, status 2, naming the flag: not opened as '' (the current folder:
    "Is a directory", or its ckpt.pt)."""
    err = error_line(capsys, script, argv, 2)
    assert names in err and "is empty (an unset shell variable?)" in err, err
    assert "Is a directory" not in err and "ckpt.pt" not in err, err
