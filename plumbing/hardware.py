"""What a script runs on: the device (auto: cuda, then mps, then cpu), the precision (auto: bfloat16 on CUDA,
float32 elsewhere), the CPU threads, the hardware's peak speed (for MFU), and the one boundary for running out
of memory (out_of_memory)."""

import os
import re
import time
import traceback
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import fields

import torch
import torch.nn as nn

from model import GPTConfig
from plumbing.errors import UserError, first_line, out_of_memory_error
from positions import PositionScheme

DTYPES = ("auto", "float32", "bfloat16", "float16")

# Dense bf16 tensor-core peak FLOP/s per GPU from NVIDIA's data sheets (fp16 for V100, T4), matched against
# torch.cuda.get_device_name, first match wins (H100 alone: SXM). MFU (PaLM, Chowdhery et al. 2022, appendix
# B) is the model FLOPs achieved over this peak.
PEAK_FLOPS = {
    r"\bH200\b.*\bNVL\b": 835e12, r"\bH200\b": 989e12, r"\bH100\b.*\bPCIe\b": 756e12,
    r"\bH100\b.*\bNVL\b": 835e12, r"\bH100\b": 989e12, r"\bB200\b": 2250e12, r"\bA100\b": 312e12,
    r"\bL40S\b": 362e12, r"\bL4\b": 121e12, r"\bA10\b": 125e12, r"\bV100\b": 125e12,
    r"\bT4\b": 65e12}  # fmt: skip


def check_device_name(device):  # when flags are parsed; check_device asks the machine as the run starts
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", device):
        raise ValueError(f"device={device!r} is not a device; choose from auto, cpu, cuda, cuda:N, mps")


def check_device(device):
    """A usage UserError (status 2) if this machine lacks the device asked for."""
    backends = {"cuda": ("torch.cuda", torch.cuda), "mps": ("torch.backends.mps", torch.backends.mps)}
    name, backend = backends.get(device.split(":")[0], (None, None))
    if backend and not backend.is_available():
        raise UserError(f"device={device!r} but {name}.is_available() is False; try --device=auto or cpu", 2)


def check_threads(threads):
    """A ValueError naming --threads unless auto or a whole number from 1 to the cores: more threads than
    cores only take turns on them, each slowing the others (docs/perf.md, Threads)."""
    cores = os.cpu_count() or 1
    # str.isdigit() takes '¹' and '٣', which int() refuses or reads: ASCII digits only
    if threads != "auto" and not (threads.isascii() and threads.isdigit() and 1 <= int(threads) <= cores):
        give = f"give auto or a number of threads from 1 to {cores} (the cores)"
        raise ValueError(f"--threads={threads}: {give}")


def runnable_others(reads=5, interval=0.01):
    """The tasks other than this one running or waiting for a core now (/proc/stat's procs_running, the
    fewest of a few reads, as one read may catch a task that wakes for a moment), or None where there is no
    /proc/stat. A load average counts for a minute a process that has ended."""
    counts = []
    for i in range(reads):
        with suppress(OSError, StopIteration, ValueError), open("/proc/stat") as f:
            counts.append(next(int(line.split()[1]) for line in f if line.startswith("procs_running ")))
        if i < reads - 1 and counts:
            time.sleep(interval)
    return max(0, min(counts) - 1) if counts else None


def use_threads(threads, device):
    """Set torch's intra-op CPU threads from --threads -> the line saying what was chosen and why. auto keeps
    OMP_NUM_THREADS where set, and torch's default off the CPU; on a CPU, the cores the tasks running now
    leave free, as a thread beside another process's slows both far more than it gains (docs/perf.md)."""
    cores = os.cpu_count() or 1
    if threads != "auto":
        n, why = int(threads), "--threads"
    elif os.environ.get("OMP_NUM_THREADS"):
        n, why = torch.get_num_threads(), "OMP_NUM_THREADS"
    elif not str(device).startswith("cpu"):
        n, why = torch.get_num_threads(), f"torch's default on {device}"
    elif (others := runnable_others()) is None:
        n, why = cores, "auto: every core, as this system does not say what runs on them"
    else:
        n, why = max(1, cores - others), f"auto: the cores the {others} other running tasks leave free"
    torch.set_num_threads(n)
    return f"threads: {n} of {cores} cores ({why}); --threads=N sets them"


def resolve_device(device):
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"


def resolve_dtype(dtype, device_type):
    if dtype != "auto":
        return dtype
    if device_type == "cuda":  # bfloat16 keeps float32's exponent range, so it needs no loss scaling
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"  # CPU autocast is slower than float32 for models this small


def precision(cfg):
    """(autocast context, GradScaler) for cfg.dtype on cfg.device, both resolved; float32: no autocast."""
    device_type, dtype = cfg.device.split(":")[0], cfg.dtype
    if device_type == "cuda":  # TF32 matmuls: ~free speed on Ampere and later, ample precision for training
        torch.set_float32_matmul_precision("high")
    autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type, getattr(torch, dtype))
    # float16's 5-bit exponent underflows small gradients: scale the loss up, unscale before the step
    return autocast, torch.amp.GradScaler(device_type, enabled=dtype == "float16")


def format_bytes(n):
    """1234567 -> '1.2 MB' (powers of 1000, as df and free -H print sizes)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


@contextmanager
def out_of_memory(advice):
    """The one memory boundary: an allocation refused where it happens (errors.out_of_memory_error: CUDA's
    torch.OutOfMemoryError, the CPU allocator's refusal, MemoryError) becomes the UserError `out of memory
    (torch's reason): ADVICE`, status 1; advice names the flags that size the work inside the block. Nothing
    is predicted from the shapes, and nothing is written on the way out: every checkpoint stays as it was.
    Where a position scheme's own code made the allocation, the settings of it that sized it come first."""
    try:
        yield
    except Exception as e:
        if not out_of_memory_error(e):
            raise
        enforce = r"^\[enforce fail at [^\]]*\] err == 0\. "  # the CPU's: c10's assertion before the reason
        reason = first_line(re.sub(enforce, "", str(e).strip()), type(e).__name__)
        scheme = scheme_sized(e.__traceback__)
        raise UserError(
            f"out of memory ({reason}): {scheme + ', or ' if scheme else ''}{advice}", 1
        ) from None


def scheme_sized(tb):
    """Where traceback tb passes through a position scheme's own code (a frame whose self is a PositionScheme:
    building its tables or parameters, computing its score bias): "pos=fire's own allocation, sized by its
    setting --fire_hidden=10000000 (off the defaults): lower it"; else None. The rule: the whole-numbered
    settings of that scheme set away from their defaults (counts: T5's buckets, FIRE's hidden units) sized
    it; at their defaults the GPT's shape (block_size, n_head) did, which the caller's advice names (given
    after it in any case). The settings are read from the GPTConfig the traceback's frames hold (the
    scheme's __init__(self, config), a GPT's self.config): the scheme's class says which scheme, no name."""
    frames = [frame for frame, _ in traceback.walk_tb(tb)]
    schemes = [f.f_locals["self"] for f in frames if isinstance(f.f_locals.get("self"), PositionScheme)]
    configs = []
    for value in (value for frame in frames for value in frame.f_locals.values()) if schemes else ():
        config = getattr(value, "config", None) if isinstance(value, nn.Module) else value  # a GPT's
        if isinstance(config, GPTConfig) and isinstance(config.pos_settings, type(schemes[-1]).Settings):
            configs.append(config)  # schemes[-1]: the innermost scheme frame, the one allocating
    if not configs:
        return None
    settings, pos = configs[-1].pos_settings, configs[-1].pos
    values = {f.name: (getattr(settings, f.name), f.default) for f in fields(settings)}
    counts = [f"--{name}={v}" for name, (v, default) in values.items() if type(v) is int and v != default]
    if not counts:
        return None
    one = len(counts) == 1
    given = f"setting {counts[0]}" if one else f"settings {' and '.join(counts)}"
    return (
        f"pos={pos}'s own allocation, sized by its {given} (off the defaults): lower {'it' * one or 'them'}"
    )


def synchronize(device):
    """Wait for the device's queued kernels, so that a clock read after it is the real time."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)
    elif str(device) == "mps":
        torch.mps.synchronize()


def peak_flops_of(gpu_name):
    return next((flops for pattern, flops in PEAK_FLOPS.items() if re.search(pattern, gpu_name)), None)


def peak_flops(device):
    """The device's peak FLOP/s for MFU, or None (CPU, MPS, a GPU not in PEAK_FLOPS): then no MFU logged."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if str(device).startswith("cuda") else None


def speed(seconds, tokens, flops, peak=None, n_devices=1):
    """A step's ms, tokens/s, model TFLOP/s, and MFU (over all devices' peak) where the peak is known."""
    metrics = dict(ms_per_iter=seconds * 1e3, tokens_per_sec=tokens / seconds, tflops=flops / seconds / 1e12)
    return metrics | (dict(mfu=flops / seconds / (peak * n_devices)) if peak else {})
