"""
Train a GPT on one dataset with one position scheme. Every experiment in this repository runs this script.

    python train.py                                          # ~2 minutes on 2 CPU cores: shakespeare_char, rope
    python train.py --pos=learned --max_iters=500
    python train.py --config configs/cpu_recipe.toml --pos=alibi
    python train.py --config configs/shakespeare_char.toml   # nanoGPT's GPU recipe

Settings, lowest priority first: the TrainConfig defaults below and nanoGPT's CPU-recipe model (MODEL_DEFAULTS),
then the TOML file given with --config, then flags. Every field of TrainConfig and GPTConfig is a flag, written
`--x=v` or `--x v`; `python train.py --help` lists them. vocab_size is the exception: it comes from the dataset.

Whenever the validation loss improves, the run writes {out_dir}/ckpt.pt (the best checkpoint), a plain dict:
    model          state_dict of the uncompiled GPT (no `_orig_mod.` prefix: nanoGPT issue #325)
    model_config   dataclasses.asdict(GPTConfig), so GPT(GPTConfig(**ckpt["model_config"])) rebuilds the model
    train_config   dataclasses.asdict(TrainConfig) as run (device, dtype, compile and out_dir resolved)
    iter_num       optimizer steps taken when it was saved
    best_val_loss  the validation loss at that step
    meta           the dataset's meta (tokenizer, vocabulary), so sampling needs nothing but this file
    optimizer      the AdamW state_dict
It holds only tensors and plain Python data, so load_checkpoint reads it with torch.load(weights_only=True).
"""

import argparse
import difflib
import math
import os
import pickle
import re
import sys
import time
import tomllib
import typing
import uuid
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from types import MappingProxyType

import torch

from data.common import BatchSampler, ensure_prepared, load_meta
from model import GPT, POS_SCHEMES, GPTConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICE_PATTERN = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N, mps"

# The model train.py builds unless told otherwise: nanoGPT's CPU recipe for shakespeare_char (its README,
# "I only have a macbook"), small enough to learn something in minutes on a laptop. model.py's GPTConfig
# defaults are GPT-2 small instead. bias=False is nanoGPT train.py's default: a little faster, no worse.
MODEL_DEFAULTS = MappingProxyType(dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False))


@dataclass
class TrainConfig:
    # data
    dataset: str = "shakespeare_char"  # a folder under data/; the embedded ones are prepared on first use
    batch_size: int = 12  # sequences per optimizer step, each block_size tokens long
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
    eval_interval: int = 250  # steps between train/val loss estimates (and a checkpoint if val improved)
    eval_iters: int = 50  # batches per split averaged in each estimate (configs/cpu_recipe.toml: 200, steadier)
    log_interval: int = 50  # steps between log lines
    # system
    out_dir: str = "out/{dataset}_{pos}"  # {dataset} and {pos} are filled in, so schemes don't overwrite each other
    device: str = "auto"  # auto: cuda, then mps, then cpu
    dtype: str = "auto"  # autocast dtype; auto: bfloat16 on CUDA (float16 + loss scaling if unsupported), else float32
    compile: bool | None = None  # torch.compile; None: on CUDA only (on CPU compiling costs more than it saves)
    seed: int = 1337  # seeds the initialisation and the batch sampler

    def __post_init__(self):
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        for name in ("batch_size", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        for name in ("max_iters", "warmup_iters", "lr_decay_iters", "weight_decay", "grad_clip", "min_lr"):
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
    "batch_size": "sequences per step",
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
    "out_dir": "checkpoint folder; {dataset} and {pos} are filled in",
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
    except (UsageError, ValueError) as e:
        parser.exit(2, f"{parser.prog}: error: {explain(str(e))}\n")
    return cfg, model_config


# -----------------------------------------------------------------------------
# Device, precision, learning rate


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


def resolve_runtime(cfg, model_config):
    """Replace every `auto` and None in cfg by what this run uses, so the checkpoint records it."""
    device = resolve_device(cfg.device)
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


# -----------------------------------------------------------------------------
# Checkpoints


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated, corrupt, or holds more than tensors and plain data."""


def save_checkpoint(obj, path):
    """torch.save(obj) to path atomically: a temporary file in the same folder, flushed and fsynced, then
    os.replace over path. A crash or a full disk mid-save leaves the previous checkpoint whole, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")  # unique: two writers never share one
    try:
        with open(tmp, "xb") as f:  # not tempfile.mkstemp, whose files are private (0600) whatever the umask
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)  # atomic on POSIX and Windows when both are on one filesystem
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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


def checkpoint_state(model, optimizer, model_config, cfg, meta, iter_num, best_val_loss):
    """The checkpoint dict described at the top of this file. `model` must be the uncompiled module."""
    return {
        "model": model.state_dict(),
        "model_config": asdict(model_config),
        "train_config": asdict(cfg),
        "iter_num": iter_num,
        "best_val_loss": best_val_loss,
        "meta": meta,
        "optimizer": optimizer.state_dict(),
    }


# -----------------------------------------------------------------------------
# Training


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


def train_step(model, optimizer, scaler, x, y, lr, autocast, grad_clip):
    """One AdamW step on the batch (x, y) at learning rate lr; returns the loss (a tensor: .item() would sync)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast:
        _, loss = model(x, y)
    scaler.scale(loss).backward()  # the scaler is a no-op unless dtype is float16
    if grad_clip > 0:
        scaler.unscale_(optimizer)  # clip the true gradient, not the scaled one
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def evals_left(step, cfg):
    """How many evaluations remain after `step` steps: multiples of eval_interval, plus the final one."""
    regular = cfg.max_iters // cfg.eval_interval - step // cfg.eval_interval
    final = 1 if cfg.max_iters % cfg.eval_interval and step < cfg.max_iters else 0
    return regular + final


def format_seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


def prepare_data(dataset):
    """The dataset's folder and meta, preparing the embedded datasets on first use."""
    try:
        data_dir = ensure_prepared(dataset)
    except FileNotFoundError as e:  # a dataset to download or prepare by hand: its message says how
        sys.exit(f"train.py: error: {e}")
    return data_dir, load_meta(data_dir)


def precision(cfg):
    """(autocast context, GradScaler) for cfg.dtype on cfg.device; float32 runs without autocast."""
    device_type = cfg.device.split(":")[0]
    if device_type == "cuda":  # TF32 matmuls: ~free speed on Ampere and later, ample precision for training
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    autocast = nullcontext() if cfg.dtype == "float32" else torch.autocast(device_type, getattr(torch, cfg.dtype))
    # float16's 5-bit exponent underflows small gradients: scale the loss up, unscale before the step
    return autocast, torch.amp.GradScaler(device_type, enabled=cfg.dtype == "float16")


def step_line(it, cfg, loss, step_seconds, tokens_per_step, eta_seconds):
    return (
        f"step {it + 1}/{cfg.max_iters} | loss {loss:.4f} | lr {get_lr(it, cfg):.2e} | "
        f"{step_seconds * 1000:.1f} ms/iter | {tokens_per_step / step_seconds:,.0f} tok/s | "
        f"{format_seconds(eta_seconds)} left"
    )


def train(cfg, model_config):
    """Train from scratch; evaluate every eval_interval steps and at the end, checkpointing when val improves.
    Returns {"best_val_loss", "iter_num", "checkpoint", "evals", "seconds"}."""
    start = time.perf_counter()
    data_dir, meta = prepare_data(cfg.dataset)
    model_config = replace(model_config, vocab_size=meta["vocab_size"])
    cfg = resolve_runtime(cfg, model_config)
    autocast, scaler = precision(cfg)
    torch.manual_seed(cfg.seed)
    model = GPT(model_config).to(cfg.device)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, cfg.device.split(":")[0])
    run_model = torch.compile(model) if cfg.compile else model  # checkpoints save `model`, never the compiled wrapper
    sampler = BatchSampler(data_dir, model_config.block_size, cfg.batch_size, device=cfg.device, seed=cfg.seed)
    ckpt_path = Path(cfg.out_dir) / "ckpt.pt"
    tokens_per_step = cfg.batch_size * model_config.block_size
    print(
        f"{cfg.dataset} ({meta['vocab_size']} tokens) | pos={model_config.pos} | "
        f"{model.num_params() / 1e6:.2f}M parameters | {cfg.device} {cfg.dtype}{' compiled' if cfg.compile else ''} | "
        f"{tokens_per_step:,} tokens/step | {cfg.max_iters} steps"
    )

    best_val_loss, best_step, evals = math.inf, None, []
    train_seconds, eval_seconds = 0.0, 0.0  # time spent in steps, and in the last evaluation: for the ETA
    window_start, window_steps = time.perf_counter(), 0
    for it in range(cfg.max_iters + 1):  # `it` steps are done at the top of the loop
        if it % cfg.eval_interval == 0 or it == cfg.max_iters:
            eval_start = time.perf_counter()
            train_seconds += eval_start - window_start
            losses = estimate_loss(run_model, sampler, cfg.eval_iters, autocast)
            evals.append({"iter": it, **losses})
            if losses["val"] < best_val_loss:
                best_val_loss, best_step = losses["val"], it
                state = checkpoint_state(model, optimizer, model_config, cfg, meta, it, best_val_loss)
                save_checkpoint(state, ckpt_path)
                note = f"saved {ckpt_path}"
            else:
                note = f"not saved (best {best_val_loss:.4f} at step {best_step})"
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} | {note}")
            eval_seconds = time.perf_counter() - eval_start
            window_start, window_steps = time.perf_counter(), 0  # keep evaluation out of ms/iter
        if it == cfg.max_iters:
            break
        x, y = sampler.get_batch("train")
        loss = train_step(run_model, optimizer, scaler, x, y, get_lr(it, cfg), autocast, cfg.grad_clip)
        window_steps += 1
        if (it + 1) % cfg.log_interval == 0:
            loss = loss.item()  # waits for the device, so the timing below is real
            now = time.perf_counter()
            step_seconds, train_seconds = (now - window_start) / window_steps, train_seconds + now - window_start
            window_start, window_steps = now, 0
            eta = (cfg.max_iters - it - 1) * train_seconds / (it + 1) + evals_left(it + 1, cfg) * eval_seconds
            print(step_line(it, cfg, loss, step_seconds, tokens_per_step, eta))
    seconds = time.perf_counter() - start
    print(f"done in {format_seconds(seconds)}: best val loss {best_val_loss:.4f} at step {best_step}, in {ckpt_path}")
    return {"best_val_loss": best_val_loss, "iter_num": cfg.max_iters, "checkpoint": str(ckpt_path), "evals": evals,
            "seconds": seconds}


def main(argv=None):
    """Parse flags (argv, or sys.argv[1:] when None), train, return train()'s summary."""
    cfg, model_config = parse_args(argv)
    return train(cfg, model_config)


if __name__ == "__main__":
    main()
