"""
Train a GPT on one dataset with one position scheme. Every experiment in this repository runs this script.

    python train.py                                          # ~2 minutes on 2 CPU cores: shakespeare_char, rope
    python train.py --pos=learned --max_iters=500
    python train.py --config configs/cpu_recipe.toml --pos=alibi
    python train.py --config configs/shakespeare_char.toml   # nanoGPT's GPU recipe, one GPU
    torchrun --standalone --nproc_per_node=8 train.py --config configs/gpt2_124m.toml --pos=rope
    python train.py --resume                                 # the same command plus --resume continues the run

Settings, lowest priority first: the TrainConfig defaults below and nanoGPT's CPU-recipe model (MODEL_DEFAULTS),
then the TOML file given with --config, then flags. Every field of TrainConfig and GPTConfig is a flag, written
`--x=v` or `--x v`; `python train.py --help` lists them. vocab_size is the exception: it comes from the dataset.

Launched by torchrun, every process trains a replica (DistributedDataParallel, nccl on CUDA, gloo on CPU) and
runs grad_accum / world_size of the grad_accum micro-batches of each step; rank 0 alone logs, evaluates and writes
checkpoints. A step's tokens, batch_size * block_size * grad_accum, do not depend on the number of processes.

Every evaluation writes {out_dir}/ckpt.pt (the latest state) and, when the validation loss improved, best.pt
(sample.py reads best.pt first). Both are written atomically and hold the same plain dict:
    model          state_dict of the uncompiled GPT (no `_orig_mod.` prefix: nanoGPT issue #325)
    model_config   dataclasses.asdict(GPTConfig), so GPT(GPTConfig(**ckpt["model_config"])) rebuilds the model
    train_config   dataclasses.asdict(TrainConfig) as run (device, dtype, compile and out_dir resolved)
    iter_num       optimizer steps taken when it was saved
    best_val_loss  the best validation loss so far (in best.pt, the loss of its own step)
    best_iter      the step of best_val_loss (None before the first evaluation)
    meta           the dataset's meta (tokenizer, vocabulary), so sampling needs nothing but this file
    optimizer      the AdamW state_dict
    scaler         the float16 GradScaler's state_dict ({} unless dtype is float16)
    sampler        {"train": ..., "eval": ...}: batches drawn per split (BatchSampler.state_dict), to resume the streams
    rng            one dict per rank of the random generators' states: python, numpy, torch, cuda (None on CPU)
    wandb_run_id   the Weights & Biases run this training logs to (None without --wandb), continued on --resume
It holds only tensors and plain Python data, so load_checkpoint reads it with torch.load(weights_only=True).
"""

import argparse
import difflib
import gc
import importlib.util
import inspect
import math
import os
import pickle
import random
import re
import shlex
import shutil
import signal
import sys
import threading
import time
import tomllib
import typing
import uuid
from contextlib import nullcontext, suppress
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data.common import BatchSampler, EncodingUnavailable, ensure_prepared, load_meta
from model import GPT, POS_SCHEMES, GPTConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps"

# The model train.py builds unless told otherwise: nanoGPT's CPU recipe for shakespeare_char (its README,
# "I only have a macbook"), small enough to learn something in minutes on a laptop. model.py's GPTConfig
# defaults are GPT-2 small instead. bias=False is nanoGPT train.py's default: a little faster, no worse.
MODEL_DEFAULTS = MappingProxyType(dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))

# Micro-batch j of every step (j < grad_accum) is drawn from the sampler's stream j, by whichever rank runs it, so
# a step trains on the same tokens whatever the number of processes. Evaluation draws from a stream of its own,
# so how often and how long one evaluates never changes what is trained on.
EVAL_STREAM = 2**31 - 1

# Dense (no sparsity) bf16 tensor-core peak FLOP/s per GPU from NVIDIA's data sheets, fp16 for the GPUs without
# bf16 (V100, T4); matched against torch.cuda.get_device_name, first match wins. MFU (PaLM, Chowdhery et al.
# 2022, appendix B) is the model FLOPs achieved over this peak.
PEAK_FLOPS = (
    (r"\bH200\b.*\bNVL\b", 835e12),
    (r"\bH200\b", 989e12),
    (r"\bH100\b.*\bPCIe\b", 756e12),
    (r"\bH100\b.*\bNVL\b", 835e12),
    (r"\bH100\b", 989e12),  # SXM
    (r"\bB200\b", 2250e12),
    (r"\bA100\b", 312e12),
    (r"\bL40S\b", 362e12),
    (r"\bL4\b", 121e12),
    (r"\bA10\b", 125e12),
    (r"\bV100\b", 125e12),
    (r"\bT4\b", 65e12),
)


@dataclass
class TrainConfig:
    # data
    dataset: str = "shakespeare_char"  # a folder under data/; the embedded ones are prepared on first use
    batch_size: int = 12  # sequences per micro-batch, each block_size tokens long
    grad_accum: int = 1  # micro-batches per optimizer step, over all processes (each runs grad_accum / world_size)
    # AdamW; model.configure_optimizers decays 2-D weights only
    learning_rate: float = 1e-3  # peak learning rate, reached at the end of warmup
    weight_decay: float = 0.1  # decoupled weight decay (Loshchilov & Hutter 2019)
    beta1: float = 0.9  # momentum: decay of the gradient's running mean
    beta2: float = 0.99  # decay of the squared gradient's mean; 0.99 > GPT-2's 0.95 as few tokens per step are noisy
    grad_clip: float = 1.0  # rescale the gradient when its global norm exceeds this; 0 disables
    # learning rate schedule: linear warmup, cosine decay to min_lr at lr_decay_iters, then flat (see get_lr)
    max_iters: int = 2000  # optimizer steps in the run; the defaults make nanoGPT's CPU recipe, ~2 min on 2 cores
    warmup_iters: int = 100  # steps of linear warmup from ~0 to learning_rate
    lr_decay_iters: int | None = None  # step where the cosine reaches min_lr; None: max_iters
    min_lr: float = 1e-4  # floor of the schedule, ~learning_rate / 10 (Chinchilla)
    # evaluation and logging
    eval_interval: int = 250  # steps between train/val loss estimates, each followed by a checkpoint
    eval_iters: int = 50  # batches per split averaged in each estimate (configs/cpu_recipe.toml: 200, steadier)
    log_interval: int = 50  # steps between log lines
    wandb: bool = False  # log to Weights & Biases (pip install wandb; WANDB_MODE=offline logs to files only)
    wandb_project: str = "posgpt"  # the W&B project the run goes to
    wandb_run_name: str | None = None  # the W&B run's display name; None: out_dir's folder name
    # system
    out_dir: str = "out/{dataset}_{pos}"  # {dataset} and {pos} are filled in, so schemes don't overwrite each other
    resume: bool = False  # continue from out_dir/ckpt.pt: weights, optimizer, step, RNG and data streams
    device: str = "auto"  # auto: cuda, then mps, then cpu; under torchrun each process takes cuda:LOCAL_RANK
    dtype: str = "auto"  # autocast dtype; auto: bfloat16 on CUDA (float16 + loss scaling if unsupported), else float32
    compile: bool | None = None  # torch.compile; None: on CUDA only (on CPU compiling costs more than it saves)
    seed: int = 1337  # seeds the initialisation, the dropout masks and the batch streams

    def __post_init__(self):
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        for name in ("batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip", "min_lr", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr={self.min_lr} must not exceed learning_rate={self.learning_rate}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ValueError(f"device={self.device!r} is not a device; choose one of {DEVICE_CHOICES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not a dtype; choose one of {', '.join(DTYPES)}")
        if not self.wandb_project.strip():
            raise ValueError("wandb_project must not be empty")


# -----------------------------------------------------------------------------
# Command line and config files


class UsageError(Exception):
    """A bad flag, value or config file; parse_args turns it into a one-line message and exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print the whole usage block, dozens of lines here; raise so parse_args prints one line
        raise UsageError(message)


def parse_bool(text):
    """true/false, 1/0, yes/no, on/off in any case (`--compile=False` as nanoGPT writes it)."""
    value = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
    if text.lower() not in value:
        raise argparse.ArgumentTypeError(f"expected a boolean (true/false, 1/0, yes/no), got {text!r}")
    return value[text.lower()]


def parse_int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def parse_float(text):
    # float, not int: `--dropout=0` is 0.0 (nanoGPT's configurator refused it as the wrong type)
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


# --help text per setting; the dataclass comments say more. GPTConfig fields missing here still get a flag.
HELP = {
    "dataset": "folder under data/",
    "batch_size": "sequences per micro-batch",
    "grad_accum": "micro-batches per optimizer step, over all processes",
    "learning_rate": "peak learning rate",
    "weight_decay": "AdamW weight decay on 2-D weights",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the gradient norm to this, 0 disables",
    "max_iters": "optimizer steps",
    "warmup_iters": "steps of linear warmup",
    "lr_decay_iters": "step where the cosine decay reaches min_lr; None means max_iters",
    "min_lr": "learning rate at and after lr_decay_iters",
    "eval_interval": "steps between loss estimates and checkpoints",
    "eval_iters": "batches per split in each estimate",
    "log_interval": "steps between log lines",
    "wandb": "log to Weights & Biases",
    "wandb_project": "W&B project",
    "wandb_run_name": "W&B run name; None means out_dir's folder name",
    "out_dir": "checkpoint folder; {dataset} and {pos} are filled in",
    "resume": "continue the run saved in out_dir/ckpt.pt",
    "device": f"one of {DEVICE_CHOICES}",
    "dtype": "autocast dtype",
    "compile": "torch.compile; None means on CUDA only",
    "seed": "random seed",
    "block_size": "context length in tokens",
    "n_layer": "transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "model width, divisible by n_head",
    "dropout": "dropout probability",
    "bias": "biases in Linear and LayerNorm",
    "pos": "position scheme",
    "rope_base": "RoPE base b in theta_i = b^(-2i/head_dim)",
    "rope_scaling": "RoPE context extension (linear, ntk, dynamic, yarn), usually set when sampling",
    "rope_factor": "context extension factor: target context / block_size",
}
CHOICES = {"pos": POS_SCHEMES, "dtype": DTYPES}  # listed in --help; the dataclasses check every other value


def flag_names():
    """Every setting that is a flag and may appear in a config file: all fields but vocab_size."""
    return [f.name for f in fields(TrainConfig)] + [f.name for f in fields(GPTConfig) if f.name != "vocab_size"]


def default_values():
    model = {f.name: f.default for f in fields(GPTConfig)} | MODEL_DEFAULTS
    return {f.name: f.default for f in fields(TrainConfig)} | model


def flag_type(annotation):
    """(kind, argparse type) for a field annotated int, float, bool or str, or one of them | None."""
    args = typing.get_args(annotation)
    kind = next((t for t in args if t is not type(None)), annotation)
    convert = {bool: parse_bool, int: parse_int, float: parse_float}.get(kind, str)
    if type(None) not in args:
        return kind, convert
    return kind, lambda text: None if text.lower() == "none" else convert(text)


def build_parser():
    """One flag per field of TrainConfig and GPTConfig (model.py's new fields get theirs without an edit here).
    Defaults are SUPPRESSed so that parse_args sees only what was given, to layer flags over the config file;
    --help shows the effective default."""
    defaults = default_values()
    parser = ArgumentParser(
        prog="train.py",
        description="Train a GPT with a chosen position scheme. Flags override --config, which overrides the defaults.",
        allow_abbrev=False,  # --n_lay=2 is a typo, not --n_layer
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file (configs/*.toml)")
    for title, config_class in (("training", TrainConfig), ("model", GPTConfig)):
        group = parser.add_argument_group(title)
        for name, annotation in typing.get_type_hints(config_class).items():
            if name not in flag_names():
                continue
            kind, convert = flag_type(annotation)
            kwargs = dict(nargs="?", const=True, metavar="BOOL") if kind is bool else {}  # `--compile` alone: true
            help_text = f"{HELP.get(name, f'GPTConfig.{name}')} (default: {defaults[name]})"
            group.add_argument(f"--{name}", type=convert, choices=CHOICES.get(name), help=help_text, **kwargs)
    return parser


def read_config_file(parser, path):
    """The settings in a TOML file, checked by the same parser as the flags (TOML is data: nothing is executed)."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise UsageError(f"--config {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"--config {path}: not valid TOML: {e}") from None
    valid = flag_names()
    unknown = [key for key in table if key not in valid]
    if unknown:
        raise UsageError(f"{path}: unknown key {', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}")
    for key, value in table.items():
        if not isinstance(value, (str, int, float, bool)):
            raise UsageError(f"{path}: {key} must be a string, number or boolean, got {value!r}")
    try:  # through the flags' own converters and choices, so a file can't hold what a flag couldn't
        return vars(parser.parse_args([f"--{key}={value}" for key, value in table.items()]))
    except UsageError as e:
        raise UsageError(f"{path}: {e}") from None


def format_out_dir(template, dataset, pos):
    try:
        return template.format(dataset=dataset, pos=pos)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(f"out_dir={template!r}: only {{dataset}} and {{pos}} can be filled in ({e!r})") from None


def explain(message):
    """Add the valid flags to argparse's `unrecognized arguments` (and a guess at the one meant)."""
    if not message.startswith("unrecognized arguments"):
        return message
    valid = [f"--{name}" for name in ["config", *flag_names()]]
    given = message.split(":", 1)[1].split()[0].split("=")[0]
    guess = difflib.get_close_matches(given, valid, n=1, cutoff=0.7)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return f"{message}{hint}; valid flags: {' '.join(valid)}"


def parse_args(argv=None):
    """Flags (and --config) -> (TrainConfig, GPTConfig). vocab_size is GPTConfig's default until train() reads
    the dataset. Any mistake exits with status 2 and one line naming the valid choices."""
    parser = build_parser()
    try:
        flags = vars(parser.parse_args(argv))
        from_file = read_config_file(parser, flags.pop("config")) if "config" in flags else {}
        values = default_values() | from_file | flags
        model_names = {f.name for f in fields(GPTConfig)}
        cfg = TrainConfig(**{k: v for k, v in values.items() if k not in model_names})
        model_config = GPTConfig(**{k: v for k, v in values.items() if k in model_names})
        format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos)
        check_device(cfg.device)
        if launched_by_torchrun() and resolve_device(cfg.device).split(":")[0] not in ("cuda", "cpu"):
            raise ValueError(f"under torchrun device must be cuda (nccl) or cpu (gloo), got {cfg.device!r}")
    except (UsageError, ValueError) as e:
        parser.exit(2, f"{parser.prog}: error: {explain(str(e))}\n")
    return cfg, model_config


# -----------------------------------------------------------------------------
# Device, precision, learning rate, FLOPs


def check_device(device):
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch.cuda.is_available() is False; try --device=auto or cpu")
    if device == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device='mps' but torch.backends.mps.is_available() is False; try --device=auto or cpu")


def resolve_device(device):
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(dtype, device_type):
    if dtype != "auto":
        return dtype
    if device_type == "cuda":  # bfloat16 keeps float32's exponent range, so it needs no loss scaling
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float32"  # CPU autocast is slower than float32 for models this small


def resolve_runtime(cfg, model_config, device=None):
    """Replace every `auto` and None in cfg by what this run uses, so the checkpoint records it. device, when
    given, overrides cfg.device (torchrun's cuda:LOCAL_RANK)."""
    device = device or resolve_device(cfg.device)
    device_type = device.split(":")[0]
    return replace(
        cfg,
        device=device,
        dtype=resolve_dtype(cfg.dtype, device_type),
        compile=(device_type == "cuda") if cfg.compile is None else cfg.compile,
        out_dir=format_out_dir(cfg.out_dir, cfg.dataset, model_config.pos),
    )


def get_lr(it, cfg):
    """Learning rate for step `it` (0-based): linear warmup over warmup_iters steps up to learning_rate, then a
    half cosine down to min_lr at lr_decay_iters, then min_lr. It does not depend on max_iters. A run shorter
    than warmup_iters (a smoke test) just stays in the warmup."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)  # +1: the first step is not lr 0
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def precision(cfg):
    """(autocast context, GradScaler) for cfg.dtype on cfg.device; float32 runs without autocast."""
    device_type = cfg.device.split(":")[0]
    if device_type == "cuda":  # TF32 matmuls: ~free speed on Ampere and later, ample precision for training
        torch.set_float32_matmul_precision("high")
    autocast = nullcontext() if cfg.dtype == "float32" else torch.autocast(device_type, getattr(torch, cfg.dtype))
    # float16's 5-bit exponent underflows small gradients: scale the loss up, unscale before the step
    return autocast, torch.amp.GradScaler(device_type, enabled=cfg.dtype == "float16")


def flops_per_token(model):
    """Training FLOPs per token, as nanoGPT's estimate_mfu after PaLM (Chowdhery et al. 2022), appendix B:
    6N for the matmuls with the N weights (2 FLOPs per weight forward, 4 backward), plus 12 * L * H * Q * T for
    attention's two matmuls, q k^T and p v, over T keys in each of L layers and H heads of size Q (the causal
    mask's skipped half is not discounted, as in PaLM). N leaves out the learned position table, a lookup and no
    matmul, but keeps the token embedding, which is also the output head."""
    n = model.num_params() - sum(p.numel() for p in model.transformer.wpe.parameters())
    c = model.config
    return 6 * n + 12 * c.n_layer * c.n_head * c.head_dim * c.block_size


def peak_flops_of(gpu_name):
    """The dense bf16 peak FLOP/s of the GPU called gpu_name (torch.cuda.get_device_name), None if not in PEAK_FLOPS."""
    return next((flops for pattern, flops in PEAK_FLOPS if re.search(pattern, gpu_name)), None)


def peak_flops(device):
    """The device's peak FLOP/s for MFU, or None (CPU, MPS, a GPU not in PEAK_FLOPS): then the log shows no MFU."""
    return peak_flops_of(torch.cuda.get_device_name(device)) if str(device).startswith("cuda") else None


# -----------------------------------------------------------------------------
# Processes: one, or one per GPU under torchrun


class RunError(Exception):
    """A run that cannot start or go on (a refused resume, a diverged loss, a missing dataset): main prints it as
    one line and exits with status 1. Every rank meets it at the same point, so all of them end together."""


@dataclass(frozen=True)
class Processes:
    """This process's place among those torchrun started; the defaults describe `python train.py`, one process."""

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
        """(mean loss over all processes, whether any process was asked to stop): one all-reduce and one host sync
        per step, so that every rank stops at the same step and sees the same loss."""
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


def launched_by_torchrun():
    return all(name in os.environ for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def start_processes(cfg):
    """Join torchrun's process group (nccl on CUDA, gloo on CPU), or return the single-process Processes()."""
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
    else:  # cpu: parse_args refused the rest
        dist.init_process_group("gloo", timeout=timeout)
    return Processes(rank, local_rank, world_size, device, launched=True)


def end_processes(procs, clean):
    """End every rank together: wait for all (clean end only: after an unexpected error the others may be stuck
    in a collective, and torchrun stops them), free what still refers to the process group, then destroy it.
    Without this a gloo worker can abort at exit, when a gloo thread frees finished work that holds Python tensors
    during interpreter finalization (seen 1 run in 10-40 under load with torch 2.13)."""
    if not procs.launched:
        return
    if clean:
        dist.barrier()
    gc.collect()  # what reference cycles still hold (the model, DDP's reducer) goes now, not in finalization
    dist.destroy_process_group()


def micro_steps_per_rank(grad_accum, procs):
    if grad_accum % procs.world_size:
        raise RunError(
            f"grad_accum={grad_accum} is not divisible by the {procs.world_size} processes torchrun started; "
            f"each runs grad_accum / world_size micro-batches: use a multiple of {procs.world_size}"
        )
    return grad_accum // procs.world_size


# -----------------------------------------------------------------------------
# Checkpoints


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated, corrupt, or holds more than tensors and plain data."""


def temporary_path(path):
    # hidden and unique (two writers never share one); remove_unfinished_writes finds those a kill -9 left behind
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def sync_directory(folder):
    """fsync a folder, so that a rename in it survives a power cut (POSIX; elsewhere os.replace is all we have)."""
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_atomically(path, write):
    """Put a new file at path all at once: write(tmp) fills a temporary file in the same folder, which then
    os.replace()s path (atomic on POSIX and Windows within one filesystem) and the folder is fsynced. A crash,
    a kill -9 or a full disk midway leaves the previous file whole and at worst a temporary one behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)
    return path


def save_checkpoint(obj, path):
    """torch.save(obj) to path atomically (replace_atomically), flushed and fsynced before the rename."""

    def write(tmp):
        with open(tmp, "xb") as f:  # not tempfile.mkstemp, whose files are private (0600) whatever the umask
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())

    return replace_atomically(path, write)


def link_checkpoint(source, path):
    """Make path a second name of the checkpoint at source, atomically: a hard link (no second copy of a
    GPT-2-sized file) under a temporary name, then the rename. The next save_checkpoint(source) writes a new file
    and leaves this one alone. Copies where the filesystem has no hard links."""

    def write(tmp):
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())

    return replace_atomically(path, write)


def remove_unfinished_writes(out_dir):
    """Delete the temporary files of checkpoint writes that a crash or kill -9 interrupted; returns how many."""
    leftovers = [p for name in ("ckpt.pt", "best.pt") for p in Path(out_dir).glob(f".{name}.*.tmp")]
    for path in leftovers:
        path.unlink(missing_ok=True)
    return len(leftovers)


def load_checkpoint(path, map_location="cpu"):
    """The checkpoint dict at path, read with weights_only=True: unpickling arbitrary objects can run arbitrary
    code, so a file that needs it is refused. Every failure is a CheckpointError naming the path and the cause."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if refused:  # weights_only met a class or function: loading it would import and run code
            raise CheckpointError(
                f"{path}: refused to load: it pickles {refused.group(1)}, and a posgpt checkpoint holds only tensors "
                "and plain data (torch.load(weights_only=True)); use weights_only=False only on a file you trust"
            ) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # e.g. "Unsupported operand 110"
        cause = detail.group(1) if detail else _first_line(e)
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({cause})") from None
    except Exception as e:  # torch.load raises RuntimeError, EOFError, KeyError ... for a damaged file
        cause = f"{type(e).__name__}: {_first_line(e)}"
        raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({cause})") from None
    missing = [key for key in ("model", "model_config") if not (isinstance(ckpt, dict) and key in ckpt)]
    if missing:
        raise CheckpointError(f"{path}: not a posgpt checkpoint (no {' or '.join(missing)} entry)")
    return ckpt


def _first_line(error):
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no details"


def rng_state(device):
    """The state of every random generator training may draw from, as plain data and tensors (weights_only):
    Python's random.getstate() is (version, tuple of 625 ints, gauss) and numpy's holds an ndarray."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)  # {"bit_generator", "state": {"key", "pos"}, "has_gauss", "gauss"}
    return {
        "python": [version, list(mt_state), gauss],
        "numpy": {
            "bit_generator": numpy_state["bit_generator"],
            "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
            "pos": int(numpy_state["state"]["pos"]),
            "has_gauss": int(numpy_state["has_gauss"]),
            "gauss": float(numpy_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if str(device).startswith("cuda") else None,
    }


def set_rng_state(state, device):
    """Undo rng_state: every generator continues exactly where it was saved. The CUDA state is restored only
    on CUDA (a run saved on one device type and resumed on another restarts that generator's stream)."""
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    numpy_state = state["numpy"]
    np.random.set_state({
        "bit_generator": numpy_state["bit_generator"],
        "state": {"key": numpy_state["key"].cpu().numpy().astype(np.uint32), "pos": numpy_state["pos"]},
        "has_gauss": numpy_state["has_gauss"],
        "gauss": numpy_state["gauss"],
    })
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] is not None and str(device).startswith("cuda"):
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


# Resuming needs these beyond what sampling needs (model, model_config, meta)
RESUME_KEYS = ("train_config", "iter_num", "best_val_loss", "best_iter", "optimizer", "scaler", "sampler", "rng",
               "wandb_run_id")
# GPTConfig fields a resumed run may change: they shape no weight
MODEL_KNOBS = ("dropout",)
# TrainConfig fields that say nothing about the run being continued
NOT_COMPARED = ("resume",)


def vocabulary(meta):
    """What a model's token ids mean: the tokenizer, the vocabulary size and, for char, the characters."""
    return meta.get("tokenizer"), meta.get("vocab_size"), meta.get("chars")


def describe_vocabulary(meta):
    tokenizer, vocab_size, _ = vocabulary(meta)
    return f"a {tokenizer} vocabulary of {vocab_size} tokens"


def check_resumable(path, ckpt, cfg, model_config, meta):
    """Refuse (RunError, one line) to continue a checkpoint with another vocabulary, position scheme or model
    shape: its weights would not fit, or would mean something else. Returns the training knobs and model knobs
    that changed, as "name old -> new" strings, for the log."""
    missing = [key for key in RESUME_KEYS if key not in ckpt]
    if missing:
        raise RunError(f"{path} has no {', '.join(missing)}: it can be sampled from but not resumed "
                       "(written by an older train.py?); start a new run with another --out_dir")
    if vocabulary(ckpt["meta"]) != vocabulary(meta):
        chars = " (same size, other characters)" if vocabulary(ckpt["meta"])[:2] == vocabulary(meta)[:2] else ""
        raise RunError(f"refusing to resume {path}: it was trained on {describe_vocabulary(ckpt['meta'])} and "
                       f"--dataset={cfg.dataset} has {describe_vocabulary(meta)}{chars}; resume on a dataset with "
                       "the checkpoint's vocabulary, or start a new run with another --out_dir")
    saved, wanted = ckpt["model_config"], asdict(model_config)
    differ = [name for name in wanted if name not in MODEL_KNOBS and saved.get(name) != wanted[name]]
    if differ:
        changes = ", ".join(f"--{name}={wanted[name]} but the checkpoint has {saved.get(name)}" for name in differ)
        raise RunError(f"refusing to resume {path}: {changes}; pass the checkpoint's model settings "
                       "(only training settings such as max_iters or learning_rate may change), or start a new run "
                       "with another --out_dir")
    knobs = [(name, saved.get(name), wanted[name]) for name in MODEL_KNOBS]
    knobs += [(name, value, getattr(cfg, name)) for name, value in ckpt["train_config"].items()
              if name not in NOT_COMPARED and hasattr(cfg, name)]
    return [f"{name} {old} -> {new}" for name, old, new in knobs if old != new]


def load_weights(path, module, state_dict):
    """module.load_state_dict, its multi-line mismatch report turned into a one-line CheckpointError."""
    try:
        module.load_state_dict(state_dict)
    except (RuntimeError, ValueError, KeyError) as e:
        raise CheckpointError(f"{path}: its {type(module).__name__} state does not fit ({_first_line(e)})") from None


# -----------------------------------------------------------------------------
# Training


@dataclass
class Progress:
    """What the loop keeps across steps and across a resume."""

    iter_num: int = 0  # optimizer steps taken
    best_val_loss: float = math.inf
    best_iter: int | None = None
    wandb_run_id: str | None = None
    last_loss: float | None = None  # the last finite training loss, for the message if the loss diverges
    saved_iter: int | None = None  # the step of the checkpoint on disk (ckpt.pt)


@dataclass
class Run:
    """Everything one training run builds; its functions take it whole rather than a dozen arguments."""

    cfg: TrainConfig
    model_config: GPTConfig
    meta: dict
    procs: Processes
    model: GPT  # the plain module: checkpoints save its state_dict (no `_orig_mod.` or `module.` prefix)
    train_model: torch.nn.Module  # what a step calls: compiled and/or wrapped in DDP
    eval_model: torch.nn.Module  # compiled, never DDP: rank 0 evaluates alone
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    autocast: typing.Any
    samplers: list  # this rank's micro-batch streams
    eval_sampler: BatchSampler
    progress: Progress = field(default_factory=Progress)

    @property
    def ckpt_path(self):
        return Path(self.cfg.out_dir) / "ckpt.pt"

    @property
    def best_path(self):
        return Path(self.cfg.out_dir) / "best.pt"

    @property
    def tokens_per_step(self):
        return self.cfg.batch_size * self.model_config.block_size * self.cfg.grad_accum


@torch.no_grad()
def estimate_loss(model, sampler, eval_iters, autocast):
    """Mean loss over eval_iters batches of each split, in eval mode (dropout off). -> {"train": .., "val": ..}"""
    model.eval()
    try:
        losses = {}
        for split in ("train", "val"):
            total = 0.0
            for _ in range(eval_iters):
                x, y = sampler.get_batch(split)
                with autocast:
                    _, loss = model(x, y)
                total += loss.item()
            losses[split] = total / eval_iters
        return losses
    finally:
        model.train()


def train_step(run, lr):
    """One AdamW step over this rank's micro-batches at learning rate lr; returns their mean loss (a tensor).
    Under DDP the gradients are all-reduced once, in the last micro-step's backward (no_sync before it)."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for i, sampler in enumerate(run.samplers):
        x, y = sampler.get_batch("train")  # drawn here: its copy to the GPU overlaps the previous backward
        last = i == len(run.samplers) - 1
        with nullcontext() if last or not run.procs.launched else run.train_model.no_sync():
            with run.autocast:
                _, loss = run.train_model(x, y)
            loss = loss / len(run.samplers)  # the step's loss is the mean over its micro-batches
            run.scaler.scale(loss).backward()  # the scaler is a no-op unless dtype is float16
        total = total + loss.detach()
    if run.cfg.grad_clip > 0:
        run.scaler.unscale_(run.optimizer)  # clip the true gradient, not the scaled one
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.grad_clip)
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    return total


def checkpoint_state(run, rng):
    """The checkpoint dict described at the top of this file."""
    p = run.progress
    return {
        "model": run.model.state_dict(),
        "model_config": asdict(run.model_config),
        "train_config": asdict(run.cfg),
        "iter_num": p.iter_num,
        "best_val_loss": p.best_val_loss,
        "best_iter": p.best_iter,
        "meta": run.meta,
        "optimizer": run.optimizer.state_dict(),
        "scaler": run.scaler.state_dict(),
        "sampler": {"train": run.samplers[0].state_dict(), "eval": run.eval_sampler.state_dict()},
        "rng": rng,
        "wandb_run_id": p.wandb_run_id,
    }


def write_checkpoints(run, improved):
    """ckpt.pt, and best.pt when the validation loss improved. Every rank calls it (their RNG states are gathered);
    rank 0 writes."""
    rng = run.procs.gather(rng_state(run.cfg.device))
    run.progress.saved_iter = run.progress.iter_num
    if not run.procs.master:
        return
    save_checkpoint(checkpoint_state(run, rng), run.ckpt_path)
    if improved:
        link_checkpoint(run.ckpt_path, run.best_path)


def evaluate(run, wandb_run):
    """Estimate the losses (rank 0; the others get them), stop if they are not finite, else write checkpoints."""
    p, cfg = run.progress, run.cfg
    run.procs.log(f"step {p.iter_num}: evaluating on {cfg.eval_iters} batches of train and of val ...")
    losses = [math.nan, math.nan]
    if run.procs.master:
        estimate = estimate_loss(run.eval_model, run.eval_sampler, cfg.eval_iters, run.autocast)
        losses = [estimate["train"], estimate["val"]]
    train_loss, val_loss = run.procs.share(losses, run.cfg.device)
    if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
        raise RunError(f"the estimated loss is not finite at step {p.iter_num} (train {train_loss}, val {val_loss}): "
                       f"training stopped; {kept_checkpoint(run)}")
    improved = val_loss < p.best_val_loss
    if improved:
        p.best_val_loss, p.best_iter = val_loss, p.iter_num
    write_checkpoints(run, improved)
    saved = f"saved {run.ckpt_path}" + (f" and {run.best_path.name} (best)" if improved else
                                        f" (best {p.best_val_loss:.4f} at step {p.best_iter})")
    run.procs.log(f"step {p.iter_num}: train loss {train_loss:.4f}, val loss {val_loss:.4f} | {saved}")
    if wandb_run:
        wandb_run.log({"eval/train_loss": train_loss, "eval/val_loss": val_loss}, step=p.iter_num)
        wandb_run.summary.update({"checkpoint": str(run.ckpt_path), "best_checkpoint": str(run.best_path),
                                  "best_val_loss": p.best_val_loss})
    return {"iter": p.iter_num, "train": train_loss, "val": val_loss}


def kept_checkpoint(run):
    if run.progress.saved_iter is None:
        return "no checkpoint was written"
    return f"{run.ckpt_path} (step {run.progress.saved_iter}) was kept"


def check_finite(run, loss, step):
    """Stop training on a NaN or infinite loss, before the next evaluation overwrites ckpt.pt with broken weights."""
    if math.isfinite(loss):
        return
    last = run.progress.last_loss
    last_good = f"last good loss {last:.4f} at step {step - 1}" if last is not None else "no finite loss before it"
    raise RunError(f"loss is {loss} at step {step}: training stopped ({last_good}); {kept_checkpoint(run)}; "
                   "a lower --learning_rate may help, with --resume to continue from it")


class StopSignals:
    """While active, the first Ctrl-C (SIGINT) or SIGTERM asks the loop to finish its step, write a checkpoint
    and exit; a second Ctrl-C quits at once (KeyboardInterrupt). Handlers are restored on exit. Signal handlers
    can only be set in the main thread: elsewhere the signals keep their usual meaning."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received = None  # the name of the first signal received
        self.previous = {}

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = self.received or signal.Signals(signum).name  # just a flag: printing here could re-enter print

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def evals_left(step, cfg):
    """How many evaluations remain after `step` steps: multiples of eval_interval, plus the final one."""
    regular = cfg.max_iters // cfg.eval_interval - step // cfg.eval_interval
    final = 1 if cfg.max_iters % cfg.eval_interval and step < cfg.max_iters else 0
    return regular + final


def format_seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def prepare_data(dataset, procs):
    """The dataset's folder and meta, preparing the embedded datasets on first use (rank 0 only, the others wait).
    Every rank then looks for the dataset itself, so that all of them meet the same error, if any, together."""
    if procs.master:
        with suppress(FileNotFoundError, EncodingUnavailable):
            ensure_prepared(dataset)
    procs.barrier()
    try:
        data_dir = ensure_prepared(dataset)
        return data_dir, load_meta(data_dir)
    except (FileNotFoundError, EncodingUnavailable) as e:  # a dataset to download or prepare by hand: it says how
        raise RunError(str(e)) from None


def step_line(it, cfg, loss, step_seconds, tokens_per_step, eta_seconds, mfu):
    mfu_text = f" | mfu {mfu:.1%}" if mfu is not None else ""
    return (
        f"step {it + 1}/{cfg.max_iters} | loss {loss:.4f} | lr {get_lr(it, cfg):.2e} | "
        f"{step_seconds * 1000:.1f} ms/iter | {tokens_per_step / step_seconds:,.0f} tok/s{mfu_text} | "
        f"{format_seconds(eta_seconds)} left"
    )


def no_buffer_sync():
    """DDP's flag that stops it broadcasting buffers before every forward: ours (RoPE's cos/sin, ALiBi's slopes)
    are computed from the config, the same on every rank. torch 2.13 renamed broadcast_buffers."""
    if "forward_sync_buffers" in inspect.signature(DDP).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def build_run(cfg, model_config, meta, data_dir, procs):
    """The model, its compiled / DDP wrappers, the optimizer and the batch streams of this rank, freshly initialised."""
    micro_steps = micro_steps_per_rank(cfg.grad_accum, procs)
    device_type = cfg.device.split(":")[0]
    autocast, scaler = precision(cfg)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = GPT(model_config).to(cfg.device)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, device_type)
    compiled = torch.compile(model) if cfg.compile else model
    train_model = compiled
    if procs.launched:  # DDP around the compiled module, as nanoGPT
        device_ids = [procs.local_rank] if device_type == "cuda" else None
        train_model = DDP(compiled, device_ids=device_ids, **no_buffer_sync())
    slots = range(procs.rank * micro_steps, (procs.rank + 1) * micro_steps)  # this rank's share of the step
    samplers = [BatchSampler(data_dir, model_config.block_size, cfg.batch_size, cfg.device, cfg.seed, rank=slot)
                for slot in slots]
    eval_sampler = BatchSampler(data_dir, model_config.block_size, cfg.batch_size, cfg.device, cfg.seed, EVAL_STREAM)
    if procs.rank:
        torch.manual_seed(cfg.seed + procs.rank)  # dropout masks differ across ranks
    return Run(cfg, model_config, meta, procs, model, train_model, compiled, optimizer, scaler, autocast,
               samplers, eval_sampler)


def open_resume_checkpoint(cfg, model_config, meta, procs):
    """Load out_dir/ckpt.pt (on every rank) and check that it can be continued with these settings."""
    path = Path(cfg.out_dir) / "ckpt.pt"
    if not path.is_file():
        raise RunError(f"--resume: {path} does not exist; start without --resume to train from scratch")
    ckpt = load_checkpoint(path, map_location=cfg.device)
    changes = check_resumable(path, ckpt, cfg, model_config, meta)
    if ckpt["train_config"].get("seed") != cfg.seed:
        changes = [c + " (ignored: the saved random and data streams continue)" if c.startswith("seed ") else c
                   for c in changes]
    if len(ckpt["rng"]) != procs.world_size:
        changes.append(f"processes {len(ckpt['rng'])} -> {procs.world_size}")
    best = ckpt["best_val_loss"]
    procs.log(f"resuming {path} at step {ckpt['iter_num']} (best val loss {best:.4f} at step {ckpt['best_iter']})"
              f"{'; changed: ' + ', '.join(changes) if changes else ''}")
    return path, ckpt


def restore(run, path, ckpt):
    """Put the run where the checkpoint left it: weights, optimizer moments, loss scale, data streams, step, best
    loss, and (last, as building the model drew from them) the random generators of this rank."""
    load_weights(path, run.model, ckpt["model"])
    settings = [{k: v for k, v in group.items() if k != "params"} for group in run.optimizer.param_groups]
    load_weights(path, run.optimizer, ckpt["optimizer"])
    for group, fresh in zip(run.optimizer.param_groups, settings):
        group.update(fresh)  # keep the moments, take this run's betas and weight decay (and fused on this device)
    if ckpt["scaler"] and run.scaler.is_enabled():
        run.scaler.load_state_dict(ckpt["scaler"])
    for sampler in run.samplers:  # every micro-batch stream has drawn one batch per step: the same count
        sampler.load_state_dict(ckpt["sampler"]["train"])
    run.eval_sampler.load_state_dict(ckpt["sampler"]["eval"])
    p = run.progress
    p.iter_num, p.best_val_loss, p.best_iter = ckpt["iter_num"], ckpt["best_val_loss"], ckpt["best_iter"]
    p.saved_iter, p.wandb_run_id = ckpt["iter_num"], ckpt["wandb_run_id"]
    if run.procs.rank < len(ckpt["rng"]):
        set_rng_state(ckpt["rng"][run.procs.rank], run.cfg.device)
    else:  # a rank the saved run did not have: a fresh stream of its own
        torch.manual_seed(run.cfg.seed + run.procs.rank + p.iter_num)


def start_wandb(run, n_params):
    """A Weights & Biases run on rank 0 (None elsewhere or without --wandb); a resumed run continues its id."""
    cfg, p = run.cfg, run.progress
    if not (cfg.wandb and run.procs.master):
        return None
    import wandb  # only when asked for: optional, and slow to import

    config = asdict(cfg) | asdict(run.model_config) | {"world_size": run.procs.world_size, "parameters": n_params}
    wandb_run = wandb.init(project=cfg.wandb_project, name=cfg.wandb_run_name or Path(cfg.out_dir).name,
                           id=p.wandb_run_id, resume="allow" if p.wandb_run_id else None, config=config)
    p.wandb_run_id = wandb_run.id
    return wandb_run


def train_loop(run, signals, wandb_run, resume_command):
    """Evaluate (and checkpoint) every eval_interval steps and at the end, step, log. -> (evals, losses, stopped)"""
    cfg, p, procs = run.cfg, run.progress, run.procs
    tokens_per_step = run.tokens_per_step
    flops_per_step = flops_per_token(run.model) * tokens_per_step
    peak = peak_flops(cfg.device)
    start_iter = p.iter_num
    evals, losses, stop = [], {}, False
    train_seconds, eval_seconds = 0.0, 0.0  # time spent in steps, and in the last evaluation: for the ETA
    window_start, window_steps = time.perf_counter(), 0
    while True:
        it = p.iter_num  # steps done
        due = it % cfg.eval_interval == 0 or it == cfg.max_iters
        if due and not (cfg.resume and it == start_iter):  # a resumed run's first step was evaluated before saving
            eval_start = time.perf_counter()
            train_seconds += eval_start - window_start
            evals.append(evaluate(run, wandb_run))
            eval_seconds = time.perf_counter() - eval_start
            window_start, window_steps = time.perf_counter(), 0  # keep evaluation out of ms/iter
        if it >= cfg.max_iters:
            return evals, losses, None
        if stop:
            if p.saved_iter != it:
                write_checkpoints(run, improved=False)
            why = signals.received or "a signal to another rank"
            procs.log(f"stopped by {why} after step {it}: saved {run.ckpt_path}; to continue, run {resume_command}")
            return evals, losses, why
        loss, stop = procs.agree(train_step(run, get_lr(it, cfg)), signals.received is not None, cfg.device)
        p.iter_num = it + 1
        check_finite(run, loss, it + 1)
        p.last_loss = losses[it + 1] = loss
        window_steps += 1
        if (it + 1) % cfg.log_interval == 0:
            now = time.perf_counter()  # agree() waited for the device, so the timing is real
            step_seconds, train_seconds = (now - window_start) / window_steps, train_seconds + now - window_start
            window_start, window_steps = now, 0
            steps_here = it + 1 - start_iter
            eta = (cfg.max_iters - it - 1) * train_seconds / steps_here + evals_left(it + 1, cfg) * eval_seconds
            mfu = flops_per_step / step_seconds / (peak * procs.world_size) if peak else None
            procs.log(step_line(it, cfg, loss, step_seconds, tokens_per_step, eta, mfu))
            if wandb_run:
                metrics = {"train/loss": loss, "train/lr": get_lr(it, cfg), "train/ms_per_iter": step_seconds * 1e3,
                           "train/tokens_per_sec": tokens_per_step / step_seconds,
                           "train/tflops": flops_per_step / step_seconds / 1e12}
                wandb_run.log(metrics | ({"train/mfu": mfu} if mfu is not None else {}), step=it + 1)


def header_line(run):
    cfg, procs = run.cfg, run.procs
    split = f" | {procs.world_size} processes x {cfg.grad_accum // procs.world_size} micro-batches" \
        if procs.launched else (f" | {cfg.grad_accum} micro-batches" if cfg.grad_accum > 1 else "")
    compiled = " compiled" if cfg.compile else ""
    return (
        f"{cfg.dataset} ({run.meta['vocab_size']} tokens) | pos={run.model_config.pos} | "
        f"{run.model.num_params() / 1e6:.2f}M parameters | {cfg.device} {cfg.dtype}{compiled} | "
        f"{run.tokens_per_step:,} tokens/step{split} | {cfg.max_iters} steps"
    )


def train(cfg, model_config, procs=Processes(), resume_command="the same command with --resume"):
    """Train from scratch, or continue out_dir/ckpt.pt with cfg.resume. Returns {"best_val_loss", "best_iter",
    "iter_num", "checkpoint", "best_checkpoint", "evals", "losses" ({step: loss} of the steps run here), "stopped"
    (the signal that stopped the run, or None), "wandb_run_id", "seconds"}."""
    start = time.perf_counter()
    data_dir, meta = prepare_data(cfg.dataset, procs)
    model_config = replace(model_config, vocab_size=meta["vocab_size"])
    cfg = resolve_runtime(cfg, model_config, procs.device)
    if cfg.wandb and importlib.util.find_spec("wandb") is None:
        raise RunError("--wandb needs the wandb package: pip install wandb")
    resumed = open_resume_checkpoint(cfg, model_config, meta, procs) if cfg.resume else None
    run = build_run(cfg, model_config, meta, data_dir, procs)
    if resumed:
        restore(run, *resumed)
        del resumed  # the checkpoint's tensors: as much memory as the model and optimizer
    elif procs.master and run.ckpt_path.is_file():
        procs.log(f"note: {cfg.out_dir} holds a checkpoint; this run starts from scratch and replaces it at its "
                  "first evaluation (--resume continues it instead)")
    if procs.master and (removed := remove_unfinished_writes(cfg.out_dir)):
        procs.log(f"removed {removed} unfinished checkpoint write(s) from {cfg.out_dir}")
    procs.log(header_line(run))
    wandb_run = start_wandb(run, run.model.num_params())
    finished = False
    try:
        with StopSignals() as signals:
            evals, losses, stopped = train_loop(run, signals, wandb_run, resume_command)
        finished = True
    finally:
        if wandb_run:
            wandb_run.finish(exit_code=0 if finished else 1)
    p, seconds = run.progress, time.perf_counter() - start
    if not stopped:
        best = f"best val loss {p.best_val_loss:.4f} at step {p.best_iter}, in {run.best_path}" \
            if p.best_iter is not None else "no evaluation"
        procs.log(f"done in {format_seconds(seconds)}: {best}")
    return {"best_val_loss": p.best_val_loss, "best_iter": p.best_iter, "iter_num": p.iter_num,
            "checkpoint": str(run.ckpt_path), "best_checkpoint": str(run.best_path), "evals": evals,
            "losses": losses, "stopped": stopped, "wandb_run_id": p.wandb_run_id, "seconds": seconds}


def resume_command_for(argv, cfg, procs):
    """The command that continues this run: the same flags plus --resume."""
    launcher = f"torchrun --standalone --nproc_per_node={procs.world_size} train.py" if procs.launched \
        else "python train.py"
    return " ".join([launcher, shlex.join([*argv, *([] if cfg.resume else ["--resume"])])])


def main(argv=None):
    """Parse flags (argv, or sys.argv[1:] when None), join torchrun's processes if launched by it, train, return
    train()'s summary. A RunError or CheckpointError is one line on stderr and exit status 1."""
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg, model_config = parse_args(argv)
    procs = start_processes(cfg)
    clean = False
    try:
        summary = train(cfg, model_config, procs, resume_command_for(argv, cfg, procs))
        clean = True
        return summary
    except (RunError, CheckpointError) as e:
        clean = True  # every rank meets these at the same point: they can still end together
        if procs.master:
            print(f"train.py: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        end_processes(procs, clean)


if __name__ == "__main__":
    main()
