"""Memory is caught where it runs out, never predicted: an allocation refused (the CPU allocator's "can't
allocate memory", MemoryError, CUDA's torch.OutOfMemoryError) is one line naming what to lower, status 1,
through every entry point, with every checkpoint as it was. Where a position scheme's own code allocated it,
the line names the scheme's settings that sized it (T5's buckets, FIRE's hidden layer).

Each size here makes one allocation of terabytes (eval_length's: 74 GB), which the kernel refuses at once,
before anything is touched; a machine that might grant one (overcommit_memory=1, or memory of half its
size) skips them."""

import subprocess
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN, error_line, train_error_line

import sample
import train
from lab import eval_length
from lab.experiments import runs
from lab.perf import ab, bench
from plumbing import hardware
from plumbing.errors import UserError

TB = 10**12
TRAIN = [arg for arg in TINY_RUN if not arg.startswith("--batch_size")]
BENCH = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--matmul_size=128", "--pos=rope"]


def machine_bytes():
    """This machine's RAM and swap (/proc/meminfo), or None where it does not say."""
    try:
        lines = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return sum(int(lines[name].split()[0]) * 1024 for name in ("MemTotal", "SwapTotal"))
    except (OSError, KeyError, ValueError):
        return None


def overcommits_always():
    path = Path("/proc/sys/vm/overcommit_memory")
    return path.is_file() and path.read_text().strip() == "1"


SIZE = machine_bytes()
pytestmark = pytest.mark.skipif(
    overcommits_always() or SIZE is None or SIZE > TB // 4,
    reason="this machine might grant a terabyte allocation and then touch it",
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny rope checkpoint, trained for two steps on the embedded shakespeare_char."""
    out_dir = tmp_path_factory.mktemp("trained") / "rope"
    train.main([*TINY_RUN, "--pos=rope", f"--out_dir={out_dir}"])
    return out_dir


def snapshot(folder):
    """{path: bytes} of every file under folder."""
    return {path: path.read_bytes() for path in Path(folder).rglob("*") if path.is_file()}


@pytest.mark.parametrize(
    "flags, words",
    [
        # the batch: torch.randint of 10**12 indices, 8 TB
        (["--batch_size=1000000000000"], "lower --batch_size or --block_size (raise --grad_accum"),
        # T5's table, nn.Embedding(10**12 buckets, 2 heads): 8 TB, built with the model
        (
            ["--batch_size=4", "--pos=t5", f"--t5_num_buckets={TB}", f"--t5_max_distance={10 * TB}"],
            f"pos=t5's own allocation, sized by its settings --t5_num_buckets={TB} and "
            f"--t5_max_distance={10 * TB} (off the defaults): lower them, or lower --batch_size",
        ),
        # FIRE's hidden layer at the first forward: 256 x 256 pairs x 10**7 units x 4 bytes, 2.6 TB
        (
            ["--batch_size=4", "--pos=fire", "--fire_hidden=10000000", "--block_size=256"],
            "pos=fire's own allocation, sized by its setting --fire_hidden=10000000 (off the defaults): "
            "lower it, or lower --batch_size",
        ),
    ],
    ids=["batch", "t5-table", "fire-hidden-layer"],
)
def test_a_run_that_cannot_fit_is_one_line_naming_what_to_lower(flags, words, tmp_path, capsys):
    """train.py with a size whose one allocation is terabytes: status 1, one line `out of memory (torch's
    reason): ...` naming the flags to lower, first the scheme's own settings off their defaults where its code
    allocated (T5's table as the model is built, FIRE's hidden layer in the first forward), no traceback; no
    checkpoint written."""
    err = train_error_line(capsys, [*TRAIN, *flags, f"--out_dir={tmp_path / 'run'}"], 1)
    assert "out of memory (" in err and "can't allocate memory" in err and words in err, err
    assert not list((tmp_path / "run").glob("*.pt"))


def test_a_resumed_run_that_cannot_fit_leaves_its_checkpoints_as_they_were(trained, tmp_path, capsys):
    """--resume with a batch of 10**12: the one line and status 1, and every file of the run folder (ckpt.pt,
    best.pt, the log) byte for byte as before."""
    run = tmp_path / "run"
    run.mkdir()
    for path in trained.iterdir():
        (run / path.name).write_bytes(path.read_bytes())
    before = snapshot(run)
    flags = [*TRAIN, "--batch_size=1000000000000", "--max_iters=4", "--resume", f"--out_dir={run}"]
    err = train_error_line(capsys, flags, 1)
    assert "out of memory (" in err and "lower --batch_size" in err, err
    assert snapshot(run) == before


def test_a_study_run_that_cannot_fit_fails_in_one_line_with_its_reason(tmp_path):
    """A study's run past memory (lab.experiments.runs.run_python, as the studies train: their fine-tunes at
    long lengths are not estimated first): train.py's own out-of-memory line in the run's output, and the
    study's one UserError naming the command and that output."""
    log, run = tmp_path / "train.log", tmp_path / "run"
    argv = ["train.py", *TRAIN, f"--batch_size={TB}", f"--out_dir={run}"]
    with open(log, "w") as f, pytest.raises(UserError, match=r"failed \(exit status 1\); see "):
        runs.run_python(argv, stdout=f, stderr=subprocess.STDOUT, said=f"see {log}")
    assert "train.py: error: out of memory (" in log.read_text() and not list(run.glob("*.pt"))


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--max_new_tokens=1000000000000"], "lower --max_new_tokens or --num_samples"),  # the KV cache
        (
            ["--num_samples=1000000000000"],
            "lower --max_new_tokens or --num_samples",
        ),  # the prompts: MemoryError
    ],
    ids=["max_new_tokens", "num_samples"],
)
def test_a_generation_that_cannot_fit_is_one_line_naming_what_to_lower(trained, flags, words, capsys):
    """sample.py asked for terabytes of tokens or samples: status 1, one line with what to lower."""
    err = error_line(capsys, sample, [f"--out_dir={trained}", "--device=cpu", "--stream=off", *flags], 1)
    assert "out of memory (" in err and words in err, err


def test_a_checkpoint_whose_model_cannot_fit_says_so(trained, tmp_path, capsys):
    """A checkpoint whose model_config says block_size 10**12: RoPE's tables at that length (8 TB of
    positions alone) are refused as the model is built, one line naming the file and its block_size, and
    that no generation setting helps (at RoPE's defaults no setting of the scheme sized it)."""
    ckpt = torch.load(trained / "ckpt.pt", weights_only=True)
    ckpt["model_config"]["block_size"] = TB
    (tmp_path / "huge").mkdir()
    torch.save(ckpt, tmp_path / "huge" / "ckpt.pt")
    err = error_line(capsys, sample, [f"--out_dir={tmp_path / 'huge'}", "--max_new_tokens=8"], 1)
    path = tmp_path / "huge" / "ckpt.pt"
    assert f"the model of {path} (block_size=1,000,000,000,000, n_layer=1" in err, err
    assert "does not fit: use another checkpoint" in err and "own allocation" not in err, err


@pytest.mark.skipif(SIZE is None or 2 * SIZE > 96_000**2 * 8, reason="this machine might grant 74 GB")
def test_an_evaluation_that_cannot_fit_names_its_flags(tmp_path, capsys):
    """eval_length on a FIRE checkpoint at 96,000 tokens: the causal mask's int64 distances alone are 74 GB
    (and FIRE's hidden layer beyond them, at its default size): one line, lower --lengths or --batch_size."""
    out_dir = tmp_path / "fire"
    train.main([*TINY_RUN, "--pos=fire", f"--out_dir={out_dir}"])
    flags = [str(out_dir), "--lengths=96000", "--max_windows=1", "--device=cpu", "--progress=false"]
    err = error_line(capsys, eval_length, flags, 1)
    assert "out of memory (" in err and "lower --lengths or --batch_size" in err, err
    assert "own allocation" not in err, err  # the causal mask's, and FIRE's default hidden layer: the length


@pytest.mark.parametrize(
    "script, argv, words",
    [
        (bench, ["--matmul_size=10000000"], "lower --matmul_size"),  # 400 TB a matrix
        (bench, [*BENCH, "--gen_multiples", "--batch_size=1000000000000"], "lower --batch_size"),
        (bench, [*BENCH, "--train_steps=0", "--gen_multiples", "1000000000000"], "lower --gen_multiples"),
        (ab, ["--against=HEAD", "--new_tokens=1000000000000"], "lower --new_tokens"),
    ],
    ids=["bench-matmul", "bench-training", "bench-generation", "ab-decode"],
)
def test_the_lab_benchmarks_that_cannot_fit_name_their_own_flags(script, argv, words, capsys):
    """lab.perf.bench and lab.perf.ab past memory: status 1 and, after the lines of the work begun (the
    threads chosen), one error line naming their own flag to lower, no traceback."""
    with pytest.raises(SystemExit) as exit_info:
        script.main([*argv, "--device=cpu"] if script is bench else argv)
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert exit_info.value.code == 1 and "Traceback" not in err, err
    assert last.startswith(f"{script.PROG}: error: out of memory (") and words in last, err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_running_out_of_memory_is_the_same_one_line():
    """torch.cuda.OutOfMemoryError, from asking for more than the card holds, through the same boundary:
    the UserError `out of memory (CUDA out of memory. ...): ADVICE`, status 1."""
    _, total = torch.cuda.mem_get_info()
    with pytest.raises(UserError) as error, hardware.out_of_memory("lower --batch_size"):
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")
    message = str(error.value)
    assert message.startswith("out of memory (CUDA out of memory.") and message.endswith(
        ": lower --batch_size"
    )
    assert error.value.status == 1 and "\n" not in message
