"""
Processes: one, or one per GPU under torchrun. Joining torchrun's group, the few collectives the training loop
needs, and ending every rank cleanly.

Launched by torchrun, every process trains a replica (DistributedDataParallel, nccl on CUDA, gloo on CPU); rank 0
alone logs, evaluates and writes checkpoints. Without torchrun, Processes() describes the single process and every
collective is a no-op, so train.py has one code path.
"""

import gc
import inspect
import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from plumbing.errors import UserError
from plumbing.hardware import resolve_device


@dataclass(frozen=True)
class Processes:
    """This process's place among those torchrun started; the defaults describe `python train.py`, one
    process."""

    rank: int = 0  # 0 .. world_size - 1; rank 0 logs, evaluates and writes checkpoints
    local_rank: int = 0  # rank on this machine: the GPU this process uses
    world_size: int = 1
    device: str | None = None  # cuda:LOCAL_RANK under torchrun on CUDA; None: cfg.device decides
    launched: bool = False  # True under torchrun: a process group exists

    @property
    def master(self):
        return self.rank == 0

    def log(self, text):
        if self.master:
            print(text, flush=True)  # flushed: a log piped to a file or tee shows each line as it comes

    def barrier(self):
        if self.launched:
            dist.barrier()

    def agree(self, loss, stop, device):
        """(mean loss over all processes, whether any process was asked to stop): one all-reduce and one host
        sync per step, so that every rank stops at the same step and sees the same loss."""
        if not self.launched:
            return loss.item(), stop
        summed = torch.stack([loss.float(), torch.tensor(float(stop), device=device)])
        dist.all_reduce(summed)  # SUM; a NaN on any rank makes the mean NaN on every rank
        total, stops = summed.tolist()
        return total / self.world_size, stops > 0

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

    def resume_command(self, argv, resuming):
        """The command that continues this run: the same launcher and flags (argv), plus --resume."""
        launcher = (
            f"torchrun --standalone --nproc_per_node={self.world_size} train.py"
            if self.launched
            else "python train.py"
        )
        return " ".join([launcher, shlex.join([*argv, *([] if resuming else ["--resume"])])])


def launched_by_torchrun():
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def check_torchrun_device(device):
    """ValueError unless torchrun can use the device: nccl needs CUDA, gloo runs on the CPU."""
    if launched_by_torchrun() and resolve_device(device).split(":")[0] not in ("cuda", "cpu"):
        raise ValueError(f"under torchrun device must be cuda (nccl) or cpu (gloo), got {device!r}")


def start_processes(cfg):
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) on cfg.device, or return the single-process
    Processes()."""
    if not launched_by_torchrun():
        return Processes()
    rank, local_rank, world_size = (int(os.environ[name]) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = resolve_device(cfg.device)
    # a rank that waits in a collective while rank 0 evaluates and writes a GPT-2-sized checkpoint must not time out
    timeout = timedelta(minutes=30)
    if device.startswith("cuda"):
        device = f"cuda:{local_rank}"  # one GPU per process, whatever cuda:N the flags named
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(device))
    else:  # cpu: check_torchrun_device refused the rest
        dist.init_process_group("gloo", timeout=timeout)
    return Processes(rank, local_rank, world_size, device, launched=True)


@contextmanager
def processes(cfg):
    """The Processes of this run (start_processes) while the block runs, ended together after it
    (end_processes): cleanly after a return or a UserError, which every rank meets at the same point; after
    anything else another rank may be stuck in a collective, and torchrun stops it."""
    procs, clean = start_processes(cfg), False
    try:
        yield procs
        clean = True
    except UserError:
        clean = True
        raise
    finally:
        end_processes(procs, clean)


def end_processes(procs, clean):
    """End every rank together: wait for all (clean end only: after an unexpected error the others may be
    stuck in a collective, and torchrun stops them), free what still refers to the process group, then destroy
    it. Without this a gloo worker can abort at exit, when a gloo thread frees finished work that holds Python
    tensors during interpreter finalization."""
    if not procs.launched:
        return
    if clean:
        dist.barrier()
    gc.collect()  # what reference cycles still hold (the model, DDP's reducer) goes now, not in finalization
    dist.destroy_process_group()


def micro_steps_per_rank(grad_accum, procs):
    """How many of a step's grad_accum micro-batches this rank runs: grad_accum is a total over all processes,
    so it must divide among them."""
    if grad_accum % procs.world_size:
        raise UserError(
            f"grad_accum={grad_accum} is not divisible by the {procs.world_size} processes torchrun started; "
            f"each runs grad_accum / world_size micro-batches: use a multiple of {procs.world_size}, or leave "
            "--grad_accum out for one micro-batch per process"
        )
    return grad_accum // procs.world_size


def wrap_ddp(module, procs, device_type):
    """module in DistributedDataParallel under torchrun, as it is otherwise. DDP need not broadcast buffers
    before every forward: ours (RoPE's cos/sin, ALiBi's slopes) are computed from the config, the same on
    every rank. The flag is forward_sync_buffers in newer torch, broadcast_buffers in older."""
    if not procs.launched:
        return module
    device_ids = [procs.local_rank] if device_type == "cuda" else None
    no_sync = (
        "forward_sync_buffers"
        if "forward_sync_buffers" in inspect.signature(DDP).parameters
        else "broadcast_buffers"
    )
    return DDP(module, device_ids=device_ids, **{no_sync: False})
