"""The core (the root's modules, plumbing/, data/, configs/) imports nothing of lab/ and works without it: in
a copy of the checkout with lab/ deleted, python train.py trains, python sample.py samples and the core's
tests pass."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_RUN

ROOT = Path(__file__).resolve().parents[1]
# tests of the core alone (they import nothing of lab/): the schemes, RoPE's scalings, the schedule, and
# every older checkpoint format sampled and resumed
CORE_TESTS = ["test_positions.py", "test_rope_scaling.py", "test_schedule.py",
              "test_older_checkpoint_formats_sample_and_resume.py"]  # fmt: skip


def tracked():
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the core is read from the files git tracks")
    return [name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file()]


def lab_imports(source):
    """The lab modules a module's source imports (inside functions too), and any string naming one (what it
    could hand importlib)."""
    tree = ast.parse(source)
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]  # level 0
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    names += [text for text in strings if isinstance(text, str) and re.fullmatch(r"lab(\.\w+)+", text)]
    return sorted(name for name in names if name == "lab" or name.startswith("lab."))


def test_nothing_outside_lab_imports_lab():
    core = [name for name in tracked() if name.endswith(".py") and not name.startswith(("lab/", "tests/"))]
    assert "train.py" in core and "plumbing/checkpoint.py" in core
    found = {name: lab_imports((ROOT / name).read_text()) for name in core}
    assert {name: names for name, names in found.items() if names} == {}


def test_the_import_check_sees_an_import_inside_a_function_and_a_name_for_importlib():
    source = "import os\ndef f():\n    from lab.finetune import lora\nimport_module('lab.perf.bench')\n"
    assert lab_imports(source) == ["lab.finetune", "lab.perf.bench"]


def test_the_core_trains_samples_and_passes_its_tests_without_lab(tmp_path):
    copy = tmp_path / "core"
    for name in tracked():
        if not name.startswith("lab/"):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    run = lambda *args: subprocess.run(
        [sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True
    )
    trained = run("train.py", *TINY_RUN, "--out_dir=out/core")
    assert trained.returncode == 0 and "done in" in trained.stdout, trained.stdout[-2000:] + trained.stderr
    sampled = run("sample.py", "--out_dir=out/core", "--max_new_tokens=8", "--device=cpu")
    assert sampled.returncode == 0 and "tokens/s" in sampled.stdout, sampled.stderr
    tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", *[f"tests/{name}" for name in CORE_TESTS])
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-3000:] + tests.stderr
    assert not (copy / "lab").exists()
