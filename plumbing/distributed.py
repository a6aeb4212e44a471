"""Processes: one, or one per GPU under torchrun training a replica each (DDP: nccl on CUDA, gloo on CPU);
rank 0 alone logs, evaluates, saves. Without torchrun every collective is a no-op: train.py has one path."""

import gc
import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from plumbing.errors import UserError
from plumbing.hardware import resolve_device


@dataclass(frozen=True)
class Processes:
    """This process's place among those torchrun started; the defaults describe `python train.py`."""

    rank: int = 0  # 0 .. world_size - 1; rank 0 logs, evaluates and writes checkpoints
    local_rank: int = 0  # rank on this machine: the GPU this process uses
    world_size: int = 1
    device: str | None = None  # cuda:LOCAL_RANK under torchrun on CUDA; None: cfg.device decides
    launched: bool = False  # True under torchrun: a process group exists
    command: str | None = None  # what started them, as typed (resume_command): a checkpoint records it

    @property
    def master(self):
        return self.rank == 0

    def log(self, text):
        if self.master:
            print(text, flush=True)  # flushed: a log piped to tee shows each line as it comes

    def share(self, values, device):
        """values (a list of floats) from rank 0, on every rank."""
        if not self.launched:
            return values
        shared = torch.tensor(values if self.master else [0.0] * len(values), device=device)
        dist.broadcast(shared, src=0)
        return shared.tolist()

    def gather(self, obj):
        """[obj of rank 0, obj of rank 1, ...] on rank 0, None elsewhere."""
        if not self.launched:
            return [obj]
        gathered = [None] * self.world_size if self.master else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    def resume_command(self, argv, resuming, prog="train.py"):
        """The command that continues this run: the same launcher, program (train.py, or `python -m NAME`) and
        flags (argv), plus --resume."""
        launcher = f"torchrun --standalone --nproc_per_node={self.world_size}" if self.launched else "python"
        program = prog.replace("python -m ", "-m ")  # torchrun runs a module as python does: -m NAME
        return f"{launcher} {program} {shlex.join([*argv, *([] if resuming else ['--resume'])])}"


def launched_by_torchrun():
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def check_torchrun_device(device):
    """ValueError unless torchrun can use the device: nccl needs CUDA, gloo runs on the CPU."""
    if launched_by_torchrun() and resolve_device(device).split(":")[0] not in ("cuda", "cpu"):
        raise ValueError(f"under torchrun device must be cuda (nccl) or cpu (gloo), got {device!r}")


def start_processes(cfg):
    """Join torchrun's process group on cfg.device, or return the single-process Processes()."""
    if not launched_by_torchrun():
        return Processes()
    rank, local_rank, world_size = (int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = resolve_device(cfg.device)
    timeout = timedelta(minutes=30)  # for the ranks waiting while rank 0 writes a GPT-2-sized checkpoint
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"  # one GPU per process, whatever cuda:N the flags named
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(device))
    else:  # cpu: check_torchrun_device refused the rest
        dist.init_process_group("gloo", timeout=timeout)
    return Processes(rank, local_rank, world_size, device, launched=True)


@contextmanager
def processes(cfg):
    """The Processes of this run, ended together after the block (cleanly unless an unexpected error)."""
    procs = start_processes(cfg)
    try:
        yield procs
    except BaseException as e:
        end_processes(procs, isinstance(e, UserError))
        raise
    end_processes(procs, True)


def end_processes(procs, clean):
    """Wait for all ranks (clean end only: after an unexpected error another may be stuck), free what refers
    to the process group, then destroy it (else a gloo worker can abort during interpreter finalization)."""
    if not procs.launched:
        return
    if clean:
        dist.barrier()
    gc.collect()  # reference cycles (the model, DDP's reducer) go now, not in finalization
    dist.destroy_process_group()
