"""
Train a GPT on one dataset with one position scheme. Every experiment in this repository runs this script.

    python train.py                                        # ~2 minutes on 2 CPU cores: shakespeare_char, rope
    python train.py --pos=learned --max_iters=500
    python train.py --config configs/cpu_recipe.toml --pos=alibi
    python train.py --config configs/shakespeare_char.toml # nanoGPT's GPU recipe, one GPU
    torchrun --standalone --nproc_per_node=8 train.py --config configs/gpt2_124m.toml --pos=rope
    python train.py --resume                               # the same command plus --resume continues the run
    python train.py --overwrite                            # starts again in a folder that holds a run

Settings, lowest priority first: TrainConfig's defaults and MODEL_DEFAULTS, the TOML file given with --config,
then flags: every field of TrainConfig and GPTConfig but vocab_size (`python train.py --help` lists them).
Read top to bottom: the config, the run's state (model, optimizer, scaler, batch streams), one step,
evaluation, the loop (train) and main. A step calls model.py, the batch sampler and torch only; plumbing/
reads the flags, starts the run (out_dir, data) and writes and reads its checkpoints (plumbing/resume.py).
"""

from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import inspect
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data.common import BatchSampler, prepare_data
from model import GPT
from plumbing import report, resume
from plumbing.checkpoint import Progress
from plumbing.cli import device_flag, threads_flag
from plumbing.distributed import processes
from plumbing.errors import UserError, exit_status, one_line_errors
from plumbing.fields import check_fields, setting

# The model built unless told otherwise: nanoGPT's CPU recipe for shakespeare_char (its README: "I only have a
# macbook"), minutes on a laptop; GPTConfig's defaults are GPT-2 small. bias=False: nanoGPT's, a bit faster.
MODEL_DEFAULTS = MappingProxyType(
    dict(block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0, bias=False)
)

# Micro-batch j of every step comes from the sampler's stream j, whichever rank runs it: a step trains on
# the same tokens for any number of processes. Evaluation draws from a stream of its own: it changes nothing.
EVAL_STREAM = 2**31 - 1


@dataclass
class TrainConfig:
    # data
    dataset: str = setting(
        "shakespeare_char", "a folder under data/; the embedded ones are prepared on first use", path=True
    )
    batch_size: int = setting(12, at_least=1)  # sequences per micro-batch, each block_size tokens long
    grad_accum: int | None = setting(None, at_least=1)  # micro-batches a step, all processes; None: one each
    # AdamW; model.configure_optimizers decays 2-D weights only
    learning_rate: float = setting(1e-3, above=0)  # peak learning rate, reached at the end of warmup
    weight_decay: float = setting(0.1, at_least=0)  # decoupled weight decay (Loshchilov & Hutter 2019), 2-D
    beta1: float = setting(0.9, at_least=0, below=1)  # AdamW beta1: decay of the gradient's running mean
    beta2: float = setting(0.99, at_least=0, below=1)  # AdamW beta2; > GPT-2's 0.95: small steps are noisy
    grad_clip: float = setting(1.0, at_least=0)  # rescale the gradient past this global norm; 0 disables
    # learning rate schedule: linear warmup, cosine decay to min_lr at lr_decay_iters, then flat (see get_lr)
    max_iters: int = setting(2000, at_least=0)  # optimizer steps in the run (defaults: nanoGPT's CPU recipe)
    warmup_iters: int = setting(100, at_least=0)  # steps of linear warmup from ~0 to learning_rate
    lr_decay_iters: int | None = setting(None, at_least=0)  # where the cosine reaches min_lr; None: max_iters
    min_lr: float = setting(1e-4, at_least=0)  # floor of the schedule, ~learning_rate / 10 (Chinchilla)
    # evaluation and logging
    eval_interval: int = setting(250, at_least=1)  # steps between loss estimates, each with a checkpoint
    eval_iters: int = setting(50, at_least=1)  # batches per split in an estimate (cpu_recipe.toml: 200)
    log_interval: int = setting(50, at_least=1)  # steps between log lines
    wandb: bool = False  # log to Weights & Biases (pip install wandb; WANDB_MODE=offline logs to files only)
    wandb_project: str = "posgpt"  # the W&B project the run goes to
    wandb_run_name: str | None = None  # the W&B run's display name; None: out_dir's folder name
    # system
    out_dir: str = setting("out/{dataset}_{pos}", path=True)  # checkpoint folder; {dataset}, {pos} filled in
    resume: bool = False  # continue from out_dir/ckpt.pt: weights, optimizer, step, RNG and data streams
    overwrite: bool = False  # start again in an out_dir that holds a run, replacing it (without: refused)
    init_from: str | None = setting(
        None, "a new run from this out_dir's (or checkpoint's) weights and model flags", path=True
    )
    device: str = device_flag(
        help="auto: cuda, then mps, then cpu; under torchrun each process takes cuda:LOCAL_RANK"
    )
    dtype: str = setting(
        "auto",
        "autocast; auto: bfloat16 on CUDA, else float32",
        choices=("auto", "float32", "bfloat16", "float16"),
    )
    compile: bool | None = None  # torch.compile; None: on CUDA only (on a CPU it costs more than it saves)
    threads: str = threads_flag()
    seed: int = setting(1337, at_least=0)  # seeds the initialisation, the dropout masks and the batch streams

    # A training method (lab/finetune) is a subclass: its own fields are flags beside these, recorded in the
    # checkpoint's train_config as these are; it runs train.main(argv, its class) and may override:
    prog = "train.py"  # the command as typed: its error lines and resume command name it
    flags_elsewhere = "training methods' flags: python -m lab.NAME --help"  # ends an unknown flag's line
    state_entry = None  # the checkpoint entry of model state a plain GPT has not

    def fit(self, model_config):
        """This config, its settings checked against the model (a ValueError: one line, status 2)."""
        return self

    def prepare(self, model):
        """Change the built model before the optimizer takes its parameters (swap modules, replace a layer's
        attend) -> a log line or None. Its state_dict is what the checkpoint keeps and --resume loads."""
        return None

    def __post_init__(self):
        if self.lr_decay_iters is None:
            self.lr_decay_iters = self.max_iters
        check_fields(self)
        too_high = f"min_lr={self.min_lr} must not exceed learning_rate={self.learning_rate}"
        both = "--resume continues the run in out_dir and --overwrite replaces it: give one of them"
        rules = [
            (self.min_lr <= self.learning_rate, too_high),
            (self.wandb_project.strip(), "wandb_project must not be empty"),
            (not (self.resume and self.overwrite), both),
        ]
        if broken := next((message for ok, message in rules if not ok), None):
            raise ValueError(broken)


def parse_args(argv=None, Config=None):
    """Flags (and --config) -> (TrainConfig, or a training method's subclass Config; GPTConfig), vocab_size
    left to the dataset. With --init_from the model settings not given are that checkpoint's, out_dir beside
    it. A bad flag or value: one line, status 2 (plumbing.resume.parse_flags)."""
    Config = Config or TrainConfig
    return resume.parse_flags(
        argv, Config, MODEL_DEFAULTS, Config.__doc__ if Config is not TrainConfig else __doc__
    )


def get_lr(it, cfg):
    """Learning rate for step `it` (0-based): linear warmup over warmup_iters steps to learning_rate, then a
    half cosine down to min_lr at lr_decay_iters, then min_lr; independent of max_iters."""
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)  # +1: the first step is not lr 0
    if it >= cfg.lr_decay_iters:
        return cfg.min_lr
    progress = (it - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)  # 0 -> 1
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


# -----------------------------------------------------------------------------
# The run's state: the model, the optimizer, the loss scaler and the batch streams


@dataclass
class State:
    model: torch.nn.Module  # the plain GPT (a training method's changes in it): its state_dict is saved
    train_model: torch.nn.Module  # what a step calls: compiled and/or wrapped in DDP
    eval_model: torch.nn.Module  # compiled, never DDP: rank 0 evaluates alone
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # float16's loss scaling; a no-op otherwise
    autocast: object  # the autocast context of cfg.dtype, or nullcontext (float32)
    samplers: list  # this rank's micro-batch streams (data.common.BatchSampler)
    eval_sampler: BatchSampler
    launched: bool  # under torchrun (DDP): the micro-steps before the last skip the all-reduce


def build(cfg, model_config, meta, data_dir, procs):
    """A fresh run's State: the model (--init_from's weights, then what a training method changes),
    compiled and DDP-wrapped, the optimizer, this rank's batch streams."""
    device_type = cfg.device.split(":")[0]
    if device_type == "cuda":  # TF32 matmuls: ~free speed on Ampere and later, ample precision for training
        torch.set_float32_matmul_precision("high")
    dtype = getattr(torch, cfg.dtype)
    autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype)
    # float16's 5-bit exponent underflows small gradients: scale the loss up, unscale before the step
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == torch.float16)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank (DDP broadcasts rank 0's anyway)
    model = GPT(model_config).to(cfg.device)
    resume.init_from(cfg, model, meta, procs)  # context extension: a trained run's weights, a fresh optimizer
    if note := cfg.prepare(model):  # before the optimizer and the DDP wrapper take the trained parameters
        procs.log(note)
    betas = (cfg.beta1, cfg.beta2)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, betas, device_type)
    compiled = torch.compile(model) if cfg.compile else model
    train_model = compiled
    if procs.launched:  # DDP around the compiled module, as nanoGPT; buffers (RoPE's cos/sin) never differ
        ids = [procs.local_rank] if device_type == "cuda" else None
        flags = inspect.signature(DDP).parameters  # the flag's name in newer torch, else in older
        unsynced = "forward_sync_buffers" if "forward_sync_buffers" in flags else "broadcast_buffers"
        train_model = DDP(compiled, device_ids=ids, **{unsynced: False})
    micro_steps = cfg.grad_accum // procs.world_size
    slots = range(procs.rank * micro_steps, (procs.rank + 1) * micro_steps)  # this rank's share of the step
    shape = (model_config.block_size, cfg.batch_size)
    sampler = lambda stream: BatchSampler(data_dir, *shape, cfg.device, cfg.seed, rank=stream)
    *samplers, eval_sampler = [sampler(stream) for stream in [*slots, EVAL_STREAM]]
    if procs.rank:
        torch.manual_seed(cfg.seed + procs.rank)  # dropout masks differ across ranks
    return State(
        model, train_model, compiled, optimizer, scaler, autocast, samplers, eval_sampler, procs.launched
    )


# -----------------------------------------------------------------------------
# One training step, evaluation


def train_step(state, lr, grad_clip):
    """One AdamW step over this rank's micro-batches at learning rate lr; returns their mean loss (a tensor).
    Under DDP the gradients are all-reduced once, in the last micro-step's backward (no_sync before it)."""
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    total = 0.0
    for i, sampler in enumerate(state.samplers):
        x, y = sampler.get_batch("train")  # drawn here: its copy to the GPU overlaps the previous backward
        last = i == len(state.samplers) - 1
        with nullcontext() if last or not state.launched else state.train_model.no_sync():
            with state.autocast:
                _, loss = state.train_model(x, y)
            loss = loss / len(state.samplers)  # the step's loss is the mean over its micro-batches
            state.scaler.scale(loss).backward()  # the scaler is a no-op unless dtype is float16
        total = total + loss.detach()
    if grad_clip > 0:
        state.scaler.unscale_(state.optimizer)  # clip the true gradient, not the scaled one
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), grad_clip)
    state.scaler.step(state.optimizer)
    state.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def estimate_loss(model, sampler, eval_iters, autocast, stopping=lambda: False):
    """Mean loss over eval_iters batches of each split, in eval mode (dropout off). -> {"train", "val"}, or
    None once stopping() is true before a batch (a stop request: an evaluation can take minutes)."""
    model.eval()
    losses = {}
    for split in ("train", "val"):
        total = 0.0
        for _ in range(eval_iters):
            if stopping():
                model.train()
                return None
            x, y = sampler.get_batch(split)
            with autocast:
                total += model(x, y)[1].item()
        losses[split] = total / eval_iters
    model.train()
    return losses


# -----------------------------------------------------------------------------
# The loop


SLOWDOWN = 2.5  # log windows this many times slower per step than the fastest step get one note in the log


class StepClock:
    """Wall time of the steps between two log lines (evaluations left out), the time the run has left, and one
    note when steps run far slower than this run's fastest: the machine's rate with the cores to itself."""

    def __init__(self, cfg, start_iter, clock=time.perf_counter):
        self.cfg, self.start_iter, self.clock = cfg, start_iter, clock
        self.train_seconds, self.eval_seconds = 0.0, 0.0  # in steps so far, and in the last evaluation
        self.window_start = self.last_step = clock()  # the first window's start, the end of the last step
        self.window_steps, self.fastest, self.noted = 0, None, False

    def evaluated(self, start):  # an evaluation began at clock() = start and ended now: kept out of ms/iter
        self.train_seconds += start - self.window_start
        self.window_start = self.last_step = self.clock()
        self.eval_seconds, self.window_steps = self.window_start - start, 0

    def step(self):
        now = self.clock()
        self.fastest = min(self.fastest or now - self.last_step, now - self.last_step)
        self.window_steps, self.last_step = self.window_steps + 1, now

    def lap(self, steps_done):
        """(seconds per step since the last lap, seconds left). Call it after the device was waited for."""
        now, end, every = self.clock(), self.cfg.max_iters, self.cfg.eval_interval
        step_seconds = (now - self.window_start) / self.window_steps
        self.train_seconds += now - self.window_start
        self.window_start, self.window_steps = now, 0
        per_step = self.train_seconds / (steps_done - self.start_iter)
        # the evaluations left: at the multiples of eval_interval, and the final one
        evals = end // every - steps_done // every + (1 if end % every and steps_done < end else 0)
        return step_seconds, (end - steps_done) * per_step + evals * self.eval_seconds

    def slowdown(self, step_seconds):
        """The note, once per run, when a window's seconds per step exceed SLOWDOWN x the fastest step."""
        if self.noted or not self.fastest or step_seconds < SLOWDOWN * self.fastest:
            return None
        self.noted, threads, cores = True, torch.get_num_threads(), os.cpu_count()
        load = f"load average {os.getloadavg()[0]:.1f} on {cores} cores" if hasattr(os, "getloadavg") else ""
        fix = "; --threads=1 keeps this run's threads off the others' cores" if threads > 1 else ""
        return (
            f"note: steps take {step_seconds * 1e3:.0f} ms, {step_seconds / self.fastest:.1f}x this run's "
            f"fastest step ({self.fastest * 1e3:.0f} ms): likely other processes share the CPU ({load}, "
            f"threads={threads} here){fix}"
        )


def step_line(step, cfg, loss, lr, speed, seconds_left):
    """`step 50/2000 | loss 2.1 | lr 5.0e-04 | 35.6 ms/iter | 21,500 tok/s | mfu 40.0% | 1m30s left`"""
    mfu = f" | mfu {speed['mfu']:.1%}" if "mfu" in speed else ""
    return (
        f"step {step}/{cfg.max_iters} | loss {loss:.4f} | lr {lr:.2e} | {speed['ms_per_iter']:.1f} ms/iter | "
        f"{speed['tokens_per_sec']:,.0f} tok/s{mfu} | {report.format_seconds(seconds_left)} left"
    )


def kept_checkpoint(cfg, p):
    """What an error that stops training says of the checkpoint on disk."""
    ckpt = Path(cfg.out_dir) / "ckpt.pt"
    return "no checkpoint was written" if p.saved_iter is None else f"{ckpt} (step {p.saved_iter}) was kept"


def evaluate(cfg, run, state, p, procs, wandb_run, signals):
    """Estimate the losses (rank 0; the others get them), stop if not finite, else write checkpoints. -> the
    losses, or None if a stop request cut the estimate short. run: (cfg, model_config, meta) to save."""
    procs.log(f"step {p.iter_num}: evaluating on {cfg.eval_iters} batches of train and of val ...")
    estimate, cut = {"train": math.nan, "val": math.nan}, False
    if procs.master:
        requested = lambda: signals.received is not None
        before = state.eval_sampler.state_dict()
        measured = estimate_loss(
            state.eval_model, state.eval_sampler, cfg.eval_iters, state.autocast, requested
        )
        estimate, cut = measured or estimate, measured is None
        if cut:  # the checkpoint keeps the stream as it stood, so --resume draws this evaluation's batches
            state.eval_sampler.load_state_dict(before)
    train_loss, val_loss, cut = estimate["train"], estimate["val"], float(cut)
    if procs.launched:  # rank 0's figures on every rank
        shared = torch.tensor([train_loss, val_loss, cut], device=cfg.device)
        dist.broadcast(shared, src=0)
        train_loss, val_loss, cut = shared.tolist()
    if cut:  # the loop stops, saying so
        return None
    if not (math.isfinite(train_loss) and math.isfinite(val_loss)):
        what = f"the estimated loss is not finite at step {p.iter_num} (train {train_loss}, val {val_loss})"
        raise UserError(f"{what}: training stopped; {kept_checkpoint(cfg, p)}")
    improved, p.evaluated_iter = val_loss < p.best_val_loss, p.iter_num
    if improved:
        p.best_val_loss, p.best_iter = val_loss, p.iter_num
    with signals.deferred():  # a second Ctrl-C now stops the script once the file is whole
        resume.write_checkpoint(*run, state, p, procs, improved)
    ckpt, best = Path(cfg.out_dir) / "ckpt.pt", Path(cfg.out_dir) / "best.pt"
    kept = f"(best {p.best_val_loss:.4f} at step {p.best_iter})"
    saved = f"saved {ckpt} {f'and {best.name} (best)' if improved else kept}"
    procs.log(f"step {p.iter_num}: train loss {train_loss:.4f}, val loss {val_loss:.4f} | {saved}")
    if wandb_run:
        wandb_run.log({"eval/train_loss": train_loss, "eval/val_loss": val_loss}, step=p.iter_num)
        paths = {"checkpoint": str(ckpt), "best_checkpoint": str(best)}
        wandb_run.summary.update(paths | {"best_val_loss": p.best_val_loss})
    return {"iter": p.iter_num, "train": train_loss, "val": val_loss}


def train(cfg, model_config, procs, resume_command="the same command with --resume"):
    """Train from scratch, or on from out_dir/ckpt.pt with cfg.resume, holding out_dir's lock: evaluate and
    checkpoint every eval_interval steps and at the end, step, log, until max_iters or a signal (the step
    ends, a checkpoint is written). -> the summary below; losses: {step: loss} of the steps run here."""
    start = time.perf_counter()
    final_lr = get_lr(cfg.max_iters - 1, cfg)
    with resume.open_run(cfg, model_config, procs, final_lr, prepare_data) as started:
        cfg, model_config, meta, data_dir, signals, peak, opened = started
        run, p = (cfg, model_config, meta), Progress()
        state = build(cfg, model_config, meta, data_dir, procs)
        if cfg.resume:
            resume.restore(cfg, opened, state, p, procs)
        flops_per_token, flops_note = state.model.flops_per_token(cfg.batch_size)
        if flops_note:
            procs.log(flops_note)
        tokens_per_step = cfg.batch_size * model_config.block_size * cfg.grad_accum
        flops_per_step = flops_per_token * tokens_per_step
        clock = StepClock(cfg, p.iter_num)
        evals, losses, stop, stopped = [], {}, False, None
        with report.wandb_logging(*run, state.model, p, procs) as wandb_run:
            while True:
                it = p.iter_num  # steps done
                due = it % cfg.eval_interval == 0 or it == cfg.max_iters
                if due and p.evaluated_iter != it:  # a resumed step was evaluated unless a signal cut it
                    began = clock.clock()
                    evaluated = evaluate(cfg, run, state, p, procs, wandb_run, signals)
                    clock.evaluated(began)
                    stop = stop or evaluated is None  # a stop request cut the evaluation short
                    evals += [evaluated] if evaluated else []
                if it >= cfg.max_iters and not stop:
                    break
                if stop:
                    if p.saved_iter != it:
                        with signals.deferred():
                            resume.write_checkpoint(*run, state, p, procs, improved=False)
                    stopped = signals.received or "a signal to another rank"
                    saved = f"saved {Path(cfg.out_dir) / 'ckpt.pt'}; to continue, run {resume_command}"
                    procs.log(f"stopped by {stopped} after step {it}: {saved}")
                    break
                lr = get_lr(it, cfg)
                loss, stop = train_step(state, lr, cfg.grad_clip), signals.received is not None
                if procs.launched:  # the mean loss over the processes, and whether any was asked to stop
                    both = torch.stack([loss.float(), torch.tensor(float(stop), device=cfg.device)])
                    dist.all_reduce(both)  # SUM; a NaN on any rank makes the mean NaN on every rank
                    total, stops = both.tolist()
                    loss, stop = total / procs.world_size, stops > 0
                else:
                    loss = loss.item()  # waits for the device: the clock below reads real time
                p.iter_num = it + 1
                if not math.isfinite(loss):  # stopped before an evaluation writes broken weights over ckpt.pt
                    last = f"last good loss {losses[it]:.4f} at step {it}" if it in losses else None
                    retry = "a lower --learning_rate may help, with --resume to continue from it"
                    advice = f"{kept_checkpoint(cfg, p)}; {retry}"
                    last = last or "no finite loss before it"
                    raise UserError(f"loss is {loss} at step {it + 1}: training stopped ({last}); {advice}")
                losses[it + 1] = loss
                clock.step()
                if (it + 1) % cfg.log_interval == 0:
                    step_seconds, seconds_left = clock.lap(it + 1)
                    speed = dict(
                        ms_per_iter=step_seconds * 1e3, tokens_per_sec=tokens_per_step / step_seconds
                    )
                    speed["tflops"] = flops_per_step / step_seconds / 1e12
                    if peak:  # MFU: the model FLOPs achieved over every device's peak (PaLM, appendix B)
                        speed["mfu"] = flops_per_step / step_seconds / (peak * procs.world_size)
                    procs.log(step_line(it + 1, cfg, loss, lr, speed, seconds_left))
                    if note := clock.slowdown(step_seconds):
                        procs.log(note)
                    if wandb_run:
                        logged = {"loss": loss, "lr": lr} | speed
                        wandb_run.log({f"train/{k}": v for k, v in logged.items()}, step=it + 1)
    seconds = time.perf_counter() - start
    best = Path(cfg.out_dir) / "best.pt"
    if not stopped:
        said = f"best val loss {p.best_val_loss:.4f} at step {p.best_iter}, in {best}"
        said = said if p.best_iter is not None else "no evaluation"
        procs.log(f"done in {report.format_seconds(seconds)}: {said}")
    summary = {"best_val_loss": p.best_val_loss, "best_iter": p.best_iter, "iter_num": p.iter_num}
    summary |= {
        "checkpoint": str(Path(cfg.out_dir) / "ckpt.pt"),
        "best_checkpoint": str(best),
        "evals": evals,
    }
    summary |= {"losses": losses, "stopped": stopped, "wandb_run_id": p.wandb_run_id, "seconds": seconds}
    return summary


def main(argv=None, Config=None):
    """Parse flags, join torchrun's processes if launched by it, train: -> train()'s summary. A UserError
    is one line and its status; a second Ctrl-C stops at once, status 130 (the last checkpoint is whole).
    Config: a training method's TrainConfig subclass (lab/finetune), default TrainConfig: plain training."""
    argv, Config = sys.argv[1:] if argv is None else list(argv), Config or TrainConfig
    interrupted = f"{Config.prog}: interrupted: stopped at once (the last checkpoint written is whole)"
    with one_line_errors(Config.prog, stopped=interrupted):
        cfg, model_config = parse_args(argv, Config)
        with processes(cfg) as procs:
            procs = replace(procs, command=procs.resume_command(argv, True, Config.prog))  # as typed
            again = procs.resume_command(argv, cfg.resume, Config.prog)
            return train(cfg, model_config, procs, again)


if __name__ == "__main__":
    try:
        sys.exit(exit_status(main()["stopped"]))
    finally:  # the run is over: a Ctrl-C now (the interpreter shutting down) would only print a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
