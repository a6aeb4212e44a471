"""Every user error is one line, before the work starts where it can be known then: each bad input below runs
through the real entry point (main(argv) in-process; a subprocess where the input is a signal or a resource
limit) and must give one line on stderr, a non-zero exit status and no traceback, and leave every file that
existed before as it was."""

import importlib.util
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY_RUN

import sample
import train
from lab import eval_length
from lab.demo import probe
from lab.experiments import extrapolation
from lab.perf import bench

ROOT = Path(__file__).resolve().parents[1]
TINY = TINY_RUN
TINY_BENCH = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=8",
    "--batch_size=2",
    "--train_steps=1",
    "--warmup_steps=1",
    "--gen_multiples",
    "1",
    "--repeats=1",
    "--matmul_size=128",
    "--device=cpu",
    "--pos=rope",
]
EVAL = ["{ckpt}", "--lengths=1", "--max_windows=1", "--device=cpu", "--progress=false"]
SCRIPTS = {
    "sample": (sample, "sample.py"),
    "train": (train, "train.py"),
    "bench": (bench, "python -m lab.perf.bench"),
    "eval_length": (eval_length, "python -m lab.eval_length"),
    "probe": (probe, "python -m lab.demo.probe"),
    "extrapolation": (extrapolation, "python -m lab.experiments.extrapolation"),
}
NO_MATPLOTLIB = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="--plot needs matplotlib"
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny rope checkpoint, trained for two steps on the embedded shakespeare_char."""
    out_dir = tmp_path_factory.mktemp("trained") / "rope"
    train.main([*TINY, "--pos=rope", f"--out_dir={out_dir}"])
    return out_dir


@pytest.fixture
def files(tmp_path, trained):
    """What a user has before the bad command: a checkpoint folder, prior results, a file where a folder may
    be expected, an empty folder, a read-only one, and TOML files that are no valid presets."""
    shutil.copytree(trained, tmp_path / "ckpt")
    (tmp_path / "prior.csv").write_text("checkpoint,loss\nearlier run,1.5\n")
    (tmp_path / "afile").write_text("a file, not a folder\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "readonly").mkdir(mode=0o555)
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfetemperature = 0.5\n")
    (tmp_path / "inf.toml").write_text("temperature = inf\n")
    return tmp_path


def snapshot(folder):
    """{path: bytes} of every file under folder."""
    return {path: path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def exit_and_stderr(capsys, main, argv):
    """(exit status, stderr) of main(argv), which must exit. sys.exit(message) is how Python ends with status
    1 and the message on stderr, as it does outside pytest."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    status, err = exit_info.value.code, capsys.readouterr().err
    if isinstance(status, str):
        status, err = 1, err + status + "\n"
    return status, err


def case(script, argv, status, *words, marks=(), id=None):
    """One bad input: the script's main(argv) exits with status and one line holding every word."""
    return pytest.param(script, argv, status, words, marks=marks, id=id)


CASES = [
    # NaN and infinity pass every range check (nan > 0, nan < 0 are both False): refused where floats are read
    case(
        "sample",
        ["--out_dir={ckpt}", "--temperature=inf"],
        2,
        "argument --temperature: expected a finite number, got 'inf'",
        id="sample-temperature-inf",
    ),
    case(
        "sample",
        ["--out_dir={ckpt}", "--rope_scaling=yarn", "--rope_factor=inf"],
        2,
        "argument --rope_factor: expected a finite number",
        id="sample-rope-factor-inf",
    ),
    case(
        "sample",
        ["--out_dir={ckpt}", "--config={tmp}/inf.toml"],
        2,
        "inf.toml",
        "--temperature: expected a finite",
        id="sample-config-inf",
    ),
    case(
        "train",
        [*TINY, "--out_dir={tmp}/run", "--learning_rate=nan"],
        2,
        "argument --learning_rate: expected a finite number, got 'nan'",
        id="train-learning-rate-nan",
    ),
    case(
        "train",
        [*TINY, "--out_dir={tmp}/run", "--weight_decay=nan"],
        2,
        "--weight_decay: expected a finite",
        id="train-weight-decay-nan",
    ),
    case(
        "train",
        [*TINY, "--out_dir={tmp}/run", "--grad_clip=inf"],
        2,
        "--grad_clip: expected a finite",
        id="train-grad-clip-inf",
    ),
    case(
        "train",
        [*TINY, "--out_dir={tmp}/run", "--rope_base=inf"],
        2,
        "--rope_base: expected a finite",
        id="train-rope-base-inf",
    ),
    case(
        "probe",
        ["--checkpoints={tmp}/none", "--ridge=nan"],
        2,
        "--ridge: expected a finite",
        id="probe-ridge-nan",
    ),
    case(
        "extrapolation",
        ["--quick", "--out_root={tmp}/study", "--device=cpu", "--learning_rate=nan"],
        2,
        "--learning_rate: expected a finite",
        id="extrapolation-learning-rate-nan",
    ),
    # files given on the command line
    case(
        "sample",
        ["--out_dir={ckpt}", "--config={tmp}/binary.toml"],
        2,
        "--config",
        "binary.toml",
        "not a usable UTF-8 text file (UnicodeDecodeError",
        id="config-not-utf8",
    ),
    case(
        "sample",
        ["--out_dir={ckpt}", "--start=FILE:{tmp}/folder"],
        1,
        "prompt file",
        "Is a directory",
        id="prompt-file-is-a-folder",
    ),
    # outputs that cannot be written: found before the evaluation or benchmark, not after it
    case(
        "eval_length",
        [*EVAL, "--csv={tmp}/prior.csv", "--positions_csv={tmp}/afile/positions.csv"],
        1,
        "--positions_csv",
        "afile is a file, not a folder",
        id="eval-output-under-a-file",
    ),
    case(
        "eval_length",
        [*EVAL, "--csv={tmp}/folder"],
        1,
        "--csv",
        "is a folder; give a file name",
        id="eval-output-is-a-folder",
    ),
    case(
        "eval_length",
        [*EVAL, "--csv={tmp}/readonly/loss.csv"],
        1,
        "--csv",
        "cannot write there",
        id="eval-output-in-a-read-only-folder",
    ),
    case(
        "eval_length",
        [*EVAL, "--csv={ckpt}/best.pt"],
        1,
        "is an input of this run",
        id="eval-output-is-the-input",
    ),
    case(
        "eval_length",
        [*EVAL, "--csv={tmp}/prior.csv", "--positions_csv={tmp}/prior.csv"],
        1,
        "--csv writes that file too",
        id="eval-two-outputs-one-file",
    ),
    case(
        "eval_length",
        [*EVAL, "--plot={tmp}/loss.xyz"],
        2,
        "matplotlib writes no .xyz file",
        "png",
        marks=NO_MATPLOTLIB,
        id="eval-plot-format",
    ),
    case(
        "bench",
        [*TINY_BENCH, "--json={tmp}/afile/bench.json"],
        1,
        "--json",
        "afile is a file, not a folder",
        id="bench-output-under-a-file",
    ),
    case(
        "bench",
        [*TINY_BENCH, "--json={tmp}/folder"],
        1,
        "--json",
        "is a folder",
        id="bench-output-is-a-folder",
    ),
    # memory: caught where an allocation is refused (tests/test_out_of_memory.py: every entry point)
    case(
        "sample",
        ["--out_dir={ckpt}", "--max_new_tokens=1000000000000"],
        1,
        "out of memory (",
        "lower --max_new_tokens or --num_samples",
        id="sample-memory",
    ),
]


@pytest.mark.parametrize("script, argv, status, words", CASES)
def test_a_bad_input_is_one_line_before_any_work(files, capsys, script, argv, status, words):
    module, prog = SCRIPTS[script]
    if "{tmp}/readonly" in " ".join(argv) and os.access(files / "readonly", os.W_OK):
        pytest.skip("this user writes into read-only folders (root)")
    before = snapshot(files)
    argv = [arg.format(tmp=files, ckpt=files / "ckpt") for arg in argv]
    got, err = exit_and_stderr(capsys, module.main, argv)
    lines = err.strip().splitlines()
    assert got == status and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err and all(word in lines[0] for word in words), err
    assert snapshot(files) == before  # nothing written, truncated or left behind


def run_script(args, **kwargs):
    """A script of the repository in a new Python process, from the root
    (TIKTOKEN_CACHE_DIR and the like kept)."""
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, "-u", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


@pytest.mark.skipif(os.name != "posix", reason="SIGINT to another process")
def test_ctrl_c_stops_sample_quietly_with_status_130(trained):
    """Ctrl-C while sample.py streams: exit status 130, as a shell reports an interrupted command,
    and no traceback."""
    process = run_script(["sample.py", f"--out_dir={trained}", "--max_new_tokens=1000000", "--device=cpu"])
    first = process.stdout.readline()  # the model is loaded and generating once the header line is out
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert first.startswith("pos=rope") and process.returncode == 130, (first, err)
    assert err == ""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="needs POSIX resource limits")
def test_a_full_disk_is_found_before_the_evaluation_and_keeps_the_prior_csv(trained, tmp_path):
    """No byte can be written (RLIMIT_FSIZE 0 stands for a full disk; SIGXFSZ ignored, so a write fails with
    an error instead of killing the process): lab/eval_length.py says so in one line before it evaluates, and
    the CSV of an earlier run is left whole."""
    prior = tmp_path / "loss.csv"
    prior.write_text("checkpoint,loss\nearlier run,1.5\n")

    def no_file_space():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    process = run_script(
        [
            "-m",
            "lab.eval_length",
            str(trained),
            "--lengths=1",
            "--max_windows=1",
            "--device=cpu",
            "--progress=false",
            f"--csv={prior}",
        ],
        preexec_fn=no_file_space,
    )
    out, err = process.communicate(timeout=120)
    assert process.returncode == 1 and out == "", (out, err)
    assert (
        err.startswith(f"python -m lab.eval_length: error: --csv={prior}: cannot write there (")
        and err.count("\n") == 1
    ), err
    assert prior.read_text() == "checkpoint,loss\nearlier run,1.5\n" and os.listdir(tmp_path) == ["loss.csv"]


def test_config_given_twice_is_read_in_order(tmp_path):
    """--config a --config b: both files are read, b's keys over a's, and flags over both (as --help says)."""
    (tmp_path / "a.toml").write_text("temperature = 0.5\ntop_k = 10\nseed = 1\n")
    (tmp_path / "b.toml").write_text("top_k = 20\nseed = 2\n")
    cfg = sample.parse_args(
        [f"--config={tmp_path / 'a.toml'}", f"--config={tmp_path / 'b.toml'}", "--seed=3"]
    )
    assert (cfg.temperature, cfg.top_k, cfg.seed) == (0.5, 20, 3)


# A Ctrl-C as an entry point imports torch: sent from the import system as torch's import starts, the moment
# (seconds long) where Python's KeyboardInterrupt would print a traceback from inside the import
INTERRUPTED_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, CtrlC())
entry = sys.argv[1]
if entry.endswith(".py"):
    sys.argv = [entry, "--help"]
    runpy.run_path(entry, run_name="__main__")
else:  # as `python -m entry --help`: sys.argv[0] is "-m" while the module is looked for
    sys.argv = ["-m", "--help"]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "entry",
    [
        "train.py",
        "sample.py",
        "lab.eval_length",
        "lab.perf.bench",
        "lab.demo.figures",
        "lab.demo.permutation",
        "lab.demo.probe",
        "lab.experiments.extrapolation",
        "lab.experiments.longlora",
        "lab.experiments.longrope",
        "lab.experiments.longrope_ablation",
        "lab.perf.ab",
    ],
)
def test_a_ctrl_c_while_torch_is_imported_is_status_130_without_a_traceback(entry):
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, entry], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 130 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.count("\n") <= 1 and "Traceback" not in done.stderr, done.stderr
