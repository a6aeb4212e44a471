"""DDP through torchrun, on CPU with gloo: two processes train as one with the same global batch.

Each test launches `torchrun --standalone --nproc_per_node=2` as a user would, on a tiny model; no mocks.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import signalled_in_the_first_evaluation

import train
from plumbing import checkpoint, distributed, resume
from plumbing.errors import UserError
from plumbing.run_folder import LOCK_NAME

ROOT = Path(__file__).resolve().parents[1]
# torchrun gives each worker one thread unless told otherwise; say so, keep the parent's pytest thread count
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
FLAGS = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=16",
    "--batch_size=4",
    "--grad_accum=2",
    "--device=cpu",
    "--compile=false",
    "--max_iters=6",
    "--eval_interval=3",
    "--eval_iters=4",
    "--log_interval=1",
    "--learning_rate=1e-2",
    "--min_lr=1e-3",
    "--warmup_iters=2",
    "--lr_decay_iters=40",
]
# The two runs train on the same tokens (micro-batch j of a step comes from stream j, whichever rank draws it)
# and differ only in how float32 gradients are summed: DDP's all-reduce of the two ranks' halves against one
# process accumulating both. Measured on this machine: weights bit-identical after 6 steps, final val loss
# 3.4027288 in both, 6e-8 apart; the bound leaves room for other summation orders.
TOLERANCE = 1e-5


def torchrun(*args, nproc=2):
    # torchrun is `python -m torch.distributed.run`: this interpreter's, whether or not its bin/ is on PATH
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # a rank that aborts (gloo at interpreter exit, for one) fails torchrun or leaves these in its output
    aborted = re.search(
        r"Aborted|terminate called|SIGABRT|Signal 6|exitcode\s*:\s*-", done.stdout + done.stderr
    )
    assert done.returncode == 0 and not aborted, (
        f"torchrun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same flags through torchrun with 2 processes and through one process.
    -> (torchrun's out_dir, its log, the single process's out_dir, its summary)"""
    ddp_dir, single_dir = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("single")
    done = torchrun("train.py", *FLAGS, f"--out_dir={ddp_dir}")
    single = train.main([*FLAGS, f"--out_dir={single_dir}"])
    return ddp_dir, done.stdout, single_dir, single


def test_torchrun_two_processes_match_one_process_with_the_same_global_batch(runs):
    """torchrun with 2 processes finishes on every rank, rank 0 alone logs and writes one checkpoint (ckpt.pt
    and its best.pt, no per-rank copies or leftovers), and its losses and weights match one process's with the
    same global batch (grad_accum=2) within TOLERANCE."""
    ddp_dir, log, single_dir, single = runs
    assert sorted(p.name for p in ddp_dir.iterdir()) == ["best.pt", "ckpt.pt"]
    assert log.count("step 6/6 |") == 1 and "2 processes x 1 micro-batches" in log  # one rank logs
    ddp, one = (
        checkpoint.load_checkpoint(ddp_dir / "ckpt.pt"),
        checkpoint.load_checkpoint(single_dir / "ckpt.pt"),
    )
    assert ddp["iter_num"] == one["iter_num"] == 6 and ddp["best_iter"] == one["best_iter"] == 6
    print(
        f"\nval loss after 6 steps: torchrun x2 {ddp['best_val_loss']!r}, "
        f"one process {one['best_val_loss']!r}"
    )
    assert abs(ddp["best_val_loss"] - one["best_val_loss"]) <= TOLERANCE
    step_losses = [float(x) for x in re.findall(r"step \d/6 \| loss (\S+)", log)]
    assert step_losses == pytest.approx(
        [round(single["losses"][s], 4) for s in range(1, 7)], abs=1e-4 + TOLERANCE
    )
    assert max((ddp["model"][k] - one["model"][k]).abs().max().item() for k in one["model"]) <= TOLERANCE
    assert len(ddp["rng"]) == 2 and len(one["rng"]) == 1  # each rank's generators are saved


def test_a_sigterm_during_a_torchrun_evaluation_cuts_it_short_and_saves(tmp_path):
    """torchrun passes a SIGTERM on to its workers: rank 0 stops its evaluation within a batch, tells the
    others, and every rank saves and stops, where the whole evaluation would take minutes."""
    out_dir = tmp_path / "ddp"
    flags = [*FLAGS, "--max_iters=100000", "--eval_iters=100000", f"--out_dir={out_dir}"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    _, out, _ = signalled_in_the_first_evaluation([*command, "train.py", *flags], signal.SIGTERM, ENV, 120)
    assert f"stopped by SIGTERM after step 0: saved {out_dir / 'ckpt.pt'}" in out, out
    assert checkpoint.open_checkpoint(out_dir / "ckpt.pt")["iter_num"] == 0
    assert not (out_dir / LOCK_NAME).exists()


def test_a_torchrun_checkpoint_resumes_in_one_process(runs, tmp_path):
    """Each rank's data stream is a function of the step, not of the process count: a checkpoint written by 2
    processes continues in 1 process as the 1-process run does."""
    ddp_dir, _, single_dir, _ = runs
    for name, source in (("from_ddp", ddp_dir), ("from_single", single_dir)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt.pt").write_bytes((source / "ckpt.pt").read_bytes())
    from_ddp = train.main([*FLAGS, f"--out_dir={tmp_path / 'from_ddp'}", "--max_iters=8", "--resume"])
    from_single = train.main([*FLAGS, f"--out_dir={tmp_path / 'from_single'}", "--max_iters=8", "--resume"])
    assert list(from_ddp["losses"]) == [7, 8]
    assert from_ddp["losses"] == pytest.approx(from_single["losses"], abs=TOLERANCE)


COUNT_ALL_REDUCES = """
import sys
from dataclasses import replace
sys.path.insert(0, {root!r})
from data.common import prepare_data
from plumbing import distributed, resume
import train
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

cfg, model_config = train.parse_args({flags!r})
procs = distributed.start_processes(cfg)
data_dir, meta = prepare_data(cfg.dataset, procs)
model_config = replace(model_config, vocab_size=meta["vocab_size"])
cfg = resume.resolve_runtime(cfg, model_config, procs.device, procs.world_size)
run = train.build(cfg, model_config, meta, data_dir, procs)
calls = []

def counting_allreduce(process_group, bucket):  # DDP's own all-reduce, counted
    calls.append(bucket.index())
    return allreduce_hook(process_group, bucket)

run.train_model.register_comm_hook(None, counting_allreduce)
per_step = []
for it in range(3):
    before = len(calls)
    train.train_step(run, train.get_lr(it, cfg), cfg.grad_clip)
    per_step.append(len(calls) - before)
print(
    f"rank {{procs.rank}}: {{len(run.samplers)}} micro-batches, all-reduces per step {{per_step}}",
    flush=True,
)
distributed.end_processes(procs, clean=True)
"""


def test_gradients_are_all_reduced_once_per_step_not_per_micro_batch(tmp_path):
    """With grad_accum=4 each of 2 ranks runs 2 micro-batches per step; DDP all-reduces the gradient (one
    bucket for a model this small) in the last micro-batch's backward only, through train_step's no_sync."""
    flags = [f for f in FLAGS if not f.startswith("--grad_accum")] + [
        "--grad_accum=4",
        f"--out_dir={tmp_path}",
    ]
    script = tmp_path / "count_all_reduces.py"
    script.write_text(textwrap.dedent(COUNT_ALL_REDUCES.format(root=str(ROOT), flags=flags)))
    out = torchrun(str(script)).stdout
    for rank in (0, 1):
        assert f"rank {rank}: 2 micro-batches, all-reduces per step [1, 1, 1]" in out, out


def test_grad_accum_must_divide_among_the_processes(tmp_path):
    """grad_accum micro-batches are shared evenly: 3 among 2 processes is a one-line error naming a fix."""
    cfg, model_config = train.parse_args(["--device=cpu", "--grad_accum=3", f"--out_dir={tmp_path}"])
    with pytest.raises(UserError, match=r"grad_accum=3 is not divisible by the 2 processes.*multiple of 2"):
        with resume.open_run(cfg, model_config, distributed.Processes(world_size=2), 0.0, None):
            pass
    assert not any(tmp_path.iterdir())  # refused before out_dir is taken


def test_torchrun_without_grad_accum_runs_one_micro_batch_per_process(tmp_path):
    """`torchrun --nproc_per_node=2 train.py` with --grad_accum left out: each process runs one micro-batch, a
    step is 2 x batch_size x block_size tokens, and the header says why; the checkpoint records
    grad_accum=2."""
    flags = [f for f in FLAGS if not f.startswith(("--grad_accum", "--max_iters"))] + ["--max_iters=2"]
    log = torchrun("train.py", *flags, f"--out_dir={tmp_path}").stdout
    assert (
        "128 tokens/step | 2 processes x 1 micro-batches (one per process: --grad_accum not given)" in log
    ), log
    assert checkpoint.load_checkpoint(tmp_path / "ckpt.pt")["train_config"]["grad_accum"] == 2


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_torchrun_on_two_gpus_uses_nccl_and_matches_one_gpu(tmp_path):
    """On 2 GPUs (nccl, bf16 autocast) the run finishes on both ranks and lands near the 1-GPU run."""
    flags = [f for f in FLAGS if f != "--device=cpu"] + ["--device=cuda"]
    torchrun("train.py", *flags, f"--out_dir={tmp_path / 'ddp'}")
    single = train.main([*flags, f"--out_dir={tmp_path / 'single'}"])
    ddp = checkpoint.load_checkpoint(tmp_path / "ddp" / "ckpt.pt")
    assert abs(ddp["best_val_loss"] - single["best_val_loss"]) < 0.05  # bf16: a looser bound than float32's
