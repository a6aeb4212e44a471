"""How fast each position scheme trains and generates on this machine, in one process: fair ratios.

    python -m lab.perf.bench --quick                           # a quick figure: 10 steps, 2 x T new tokens
    python -m lab.perf.bench                                   # nanoGPT's CPU recipe model, every scheme
    python -m lab.perf.bench --pos=rope --gen_multiples 1 4 --json=bench.json
    python -m lab.perf.bench --pos=learned,rope,alibi --gen_multiples   # training only, three schemes
    python -m lab.perf.bench --config configs/gpt2_124m.toml --device=cuda --grad_accum=2 --compile_decode

Training: ms per optimizer step on random tokens, tokens/s, FLOPs per token (6N plus attention), % of the peak
(CUDA: the card's bf16 peak; CPU: a float32 torch.mm timed here), compile time. Generation: tokens/s of the
KV-cached sampler (eager), the uncached reference, the CUDA-graph step (CUDA only) and compiled decoding,
greedy, each checked to give the reference's tokens, and the operators one decode step launches (lab.perf.ops:
on a GPU they, not the arithmetic, set eager decoding's speed). --dtype is training's autocast dtype and
generation's: the model generates cast to it (weights, position tables, so the KV caches too; auto: bfloat16
on CUDA, float32 elsewhere, as train.py); the ops/step count is float32's. Figures: the median of the repeats
with their min and max, a loud note when their spread or the load makes them unreliable. Memory: CUDA's peak
allocated, else max RSS. --config: a training preset's flag keys. A file already at --json is replaced when
this command wrote it (a JSON report with its keys), any other only with --replace.
"""

import sys

if not __package__:  # `python lab/perf/bench.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.perf.bench`")


from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import argparse
import hashlib
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import time
import tomllib
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import torch

from data.common import available_datasets, dataset_dir, load_meta
from generation import decode_mode, generate_cached
from lab.outputs import check_outputs, json_file, write_output
from lab.perf.ops import decode_step_ops
from lab.tables import fmt, markdown_table
from model import GPT, GPTConfig, scheme_settings
from plumbing import hardware
from plumbing.cli import device_flag, machine_device, parse_flags, parse_list, threads_flag
from plumbing.errors import UserError, one_line_errors
from plumbing.fields import check_fields, setting
from positions import POS_SCHEMES

PROG = "python -m lab.perf.bench"
MODEL_KEYS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "dropout", "bias")
REPEAT_BUDGET_S = 10.0  # a generation figure stops repeating once its runs took this long
QUICK = dict(train_steps=10, warmup_steps=2, gen_multiples=[2], repeats=3, matmul_size=1024)
SAMPLERS = ("cached", "reference", "cuda_graph", "compiled")
REPORT_KEYS = ("command", "machine", "config")  # every report --json holds them from its first save: its mark
UNRELIABLE_SPREAD = 1.5  # max / min of a figure's repeats above this: the figure is noise-bound


@dataclass
class BenchConfig:
    pos: str = "all"  # schemes to measure, in the order to run them (learned,rope,alibi), or all
    quick: bool = setting(
        False, "a short run (replaces the flags of QUICK): 10 training steps, 2 x T new tokens"
    )
    block_size: int = 64  # training context T; generation lengths are multiples of it
    vocab_size: int | None = None  # None: --dataset's vocabulary (shakespeare_char's 65 without one)
    dataset: str | None = None  # whose vocabulary to use: its meta.json, else GPT-2's 50257
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    n_embd: int = 128  # model width
    dropout: float = 0.0  # dropout in training steps
    bias: bool = False  # biases in Linear and LayerNorm
    batch_size: int = setting(12, at_least=1)  # sequences per micro-batch
    grad_accum: int = setting(1, at_least=1)  # micro-batches per optimizer step
    train_steps: int = setting(30, at_least=0)  # timed optimizer steps per scheme; 0 skips training
    warmup_steps: int = setting(3, at_least=0)  # untimed first steps, reported as compile time; 0: none
    rounds: int | None = setting(
        None, "steps alternate between schemes in this many rounds; None: 3 on CPU, else 1"
    )
    gen_multiples: list[int] = setting([1, 4, 16], at_least=1)  # new tokens / block_size
    repeats: int = setting(3, at_least=1)  # timed runs per generation figure, the median reported
    reference_max_tokens: int = setting(
        1024, "skip the O(n^2) uncached reference past this many new tokens; 0: never", at_least=0
    )
    compile_decode: bool | None = None  # also time compiled decoding; None: as --compile
    device: str = device_flag()  # auto | cpu | cuda | cuda:N | mps
    dtype: str = setting(
        "auto",
        "the autocast dtype in training, the model's in generation; auto: bfloat16 on CUDA, else float32",
        choices=hardware.DTYPES,
    )
    compile: bool | None = None  # torch.compile the training step; None: on CUDA only
    threads: str = threads_flag()
    matmul_size: int = setting(2048, at_least=1)  # side of the float32 torch.mm timed for the CPU's peak
    seed: int = 1337  # seeds the weights and the random batches
    json: str | None = None  # write every figure, the machine and the command line to this file
    replace: bool = False  # --json may replace a file this command did not write

    def __post_init__(self):
        if self.quick:
            vars(self).update(QUICK)
        data = self.dataset or "shakespeare_char"  # a bad name is refused even with --vocab_size
        if data not in (names := available_datasets()):
            raise ValueError(f"dataset={data!r} is not a dataset here; choose one of {', '.join(names)}")
        unprepared = 65 if data == "shakespeare_char" else 50257  # its characters, or GPT-2's tokenizer
        meta = dataset_dir(data) / "meta.json"  # train.py's vocabulary; a damaged one is an error
        vocab = load_meta(meta.parent)["vocab_size"] if meta.exists() else unprepared
        self.vocab_size = vocab if self.vocab_size is None else self.vocab_size
        check_fields(self)
        if self.rounds is not None and not 1 <= self.rounds <= max(1, self.train_steps):
            message = f"rounds must be between 1 and train_steps={self.train_steps}, got {self.rounds}"
            raise ValueError(message)
        self.schemes = parse_list("pos", self.pos, POS_SCHEMES, everything="all")
        model_fields = {key: getattr(self, key) for key in MODEL_KEYS}  # GPTConfig checks them too
        self.model_configs = {pos: GPTConfig(**model_fields, pos=pos) for pos in self.schemes}


def config_files(argv):
    """The --config files argv names, in order (parse_flags has read and checked them)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", action="append", default=[])
    return parser.parse_known_args(argv)[0].config


def scheme_settings_of(configs, schemes):
    """{pos: {setting: value}} of the position schemes' settings the --config files hold (foreign keys to
    BenchConfig, which parse_flags leaves out): each applied to the model of its scheme, so the figures time
    the preset's model; a setting of a scheme not timed (--pos) is a usage UserError, not dropped."""
    known, found = scheme_settings(), {}
    for path in configs:
        for key, value in tomllib.loads(Path(path).read_text(encoding="utf-8-sig")).items():
            if key in known and known[key][0] not in schemes:
                message = (
                    f"--config {path}: {key} is a setting of pos={known[key][0]}, which --pos does not time"
                )
                raise UserError(f"{message}: add {known[key][0]} to --pos, or remove {key}", 2)
            if key in known:
                found.setdefault(known[key][0], {})[key] = value
    return found


def parse_args(argv=None):
    """Flags (and --config: a training preset; keys that are no flag ignored, but a scheme's setting applied)
    -> BenchConfig, `auto` and None resolved"""
    sections, given = [("benchmark", BenchConfig, None)], set()
    argv = sys.argv[1:] if argv is None else list(argv)
    cfg = BenchConfig(**parse_flags(argv, PROG, __doc__, sections, foreign_keys=True, given=given))
    if "replace" in given and cfg.json is None:  # ignored, it would look like a setting that took effect
        raise UserError("--replace applies to --json only: leave it out, or give --json", 2)
    if cfg.quick and (
        replaced := [key for key in QUICK if key in given]
    ):  # --quick sets them: they'd be lost
        keys = ", ".join(f"--{key}" for key in replaced)
        raise UserError(f"--quick sets {keys} (to {', '.join(str(QUICK[k]) for k in replaced)}): give {keys} "
                        "or --quick, not both", 2)  # fmt: skip
    device = machine_device(cfg.device)
    kind = device.split(":")[0]
    compile_ = kind == "cuda" if cfg.compile is None else cfg.compile
    decode = compile_ if cfg.compile_decode is None else cfg.compile_decode
    rounds = cfg.rounds or (3 if kind == "cpu" and cfg.train_steps >= 3 else 1)  # CUDA: one model at a time
    dtype = hardware.resolve_dtype(cfg.dtype, kind)
    cfg = replace(cfg, device=device, dtype=dtype, compile=compile_, compile_decode=decode, rounds=rounds)
    for pos, settings in scheme_settings_of(config_files(argv), cfg.schemes).items():  # GPTConfig checks them
        cfg.model_configs[pos] = GPTConfig(**asdict(cfg.model_configs[pos]) | {"pos_settings": settings})
    return cfg


def timed(fn, device):
    """(seconds fn() took, its result), the device's queued work waited for on both sides."""
    hardware.synchronize(device)
    start = time.perf_counter()
    out = fn()
    hardware.synchronize(device)
    return time.perf_counter() - start, out


def peak_memory_mb(device, reset=False):
    """CUDA: peak allocated since the last reset. Elsewhere: max RSS so far (Linux: KiB, macOS: bytes)."""
    if device.startswith("cuda"):
        cuda = torch.cuda
        return cuda.reset_peak_memory_stats(device) if reset else cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return None if reset else rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def machine_and_source(device):
    """The machine (platform, torch, 1-minute load average) and the code measured (commit, changes, hash)."""
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else None
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    machine = {
        **dict(platform=platform.platform(), processor=platform.processor() or platform.machine()),
        **dict(cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(), load_average=load, gpu=gpu),
        **dict(torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version()),
    }
    root = Path(__file__).resolve().parents[2]
    git = partial(subprocess.run, cwd=root, capture_output=True, text=True)
    try:
        commit, changed = git(["git", "rev-parse", "HEAD"]), git(["git", "status", "--porcelain", "-uno"])
        commit, changed = commit.stdout.strip() or None, changed.stdout
    except OSError:  # no git
        commit, changed = None, ""
    sha1 = hashlib.sha1((root / "model.py").read_bytes()).hexdigest()
    source = {"git_commit": commit, "uncommitted_changes": [line[3:] for line in changed.splitlines()]}
    return {"machine": machine, "source": source | {"model_py_sha1": sha1}}


class Trainer:
    """A scheme's model, AdamW, fixed random batches and untimed warm-up steps (the first compiles)."""

    def __init__(self, cfg, pos):
        torch.manual_seed(cfg.seed)
        self.cfg, self.model = cfg, GPT(cfg.model_configs[pos]).to(cfg.device)
        self.optimizer = self.model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), cfg.device.split(":")[0])
        self.run = torch.compile(self.model) if cfg.compile else self.model
        self.autocast, self.scaler = hardware.precision(cfg)
        shape = (cfg.grad_accum, 2, cfg.batch_size, cfg.block_size)  # an (x, y) pair per micro-batch
        self.batches = torch.randint(cfg.vocab_size, shape, device=cfg.device)
        warmup = [timed(self.step, cfg.device)[0] for _ in range(cfg.warmup_steps)]
        self.first, self.step_seconds = warmup[0] if warmup else None, []

    def step(self):
        for x, y in self.batches:
            with self.autocast:
                _, loss = self.run(x, y)
            self.scaler.scale(loss / len(self.batches)).backward()
        self.scaler.unscale_(self.optimizer)  # clip the true gradient, as train.py does
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def results(self, peak, memory_mb):
        cfg, model, first = self.cfg, self.model, self.first
        seconds = sorted(self.step_seconds)
        ms, low, high = 1e3 * statistics.median(seconds), 1e3 * seconds[0], 1e3 * seconds[-1]
        tokens = cfg.batch_size * cfg.block_size * cfg.grad_accum
        flops, note = model.flops_per_token(cfg.batch_size)  # the scheme's bias: once per micro-batch
        compile_s = max(0.0, first - ms / 1e3) if cfg.compile and first is not None else None
        return {
            **dict(ms_per_step=ms, step_ms_min=low, step_ms_max=high, timed_steps=len(self.step_seconds)),
            **dict(tokens_per_step=tokens, first_step_s=first, compile_s=compile_s, flops_per_token=flops),
            **dict(params=model.num_params(), peak_memory_mb=memory_mb, flops_note=note),
            **hardware.speed(ms / 1e3, tokens, flops * tokens, peak),
        }


def bench_training(cfg, peak, results, log, save):
    """Fill results with {pos: training figures}, saving as each scheme finishes. The timed steps run in
    cfg.rounds rounds over every scheme (a new order each round): a change in machine load reaches all."""
    trainers, schemes = {}, cfg.schemes
    steps, extra = divmod(cfg.train_steps, cfg.rounds)
    for r in range(cfg.rounds):
        for pos in schemes[r % len(schemes) :] + schemes[: r % len(schemes)]:
            if pos not in trainers:
                if cfg.compile and not trainers:  # so that TORCH_LOGS=recompiles shows only real recompiles
                    torch.compiler.reset()
                peak_memory_mb(cfg.device, reset=True)
                trainers[pos] = Trainer(cfg, pos)
            for _ in range(steps + (r < extra)):  # >= 1: rounds <= train_steps
                seconds, loss = timed(trainers[pos].step, cfg.device)
                trainers[pos].step_seconds.append(seconds)
            if not torch.isfinite(loss):
                raise RuntimeError(f"pos={pos}: the training loss is {loss.item()}")
            if r == cfg.rounds - 1:
                results[pos] = t = trainers.pop(pos).results(peak, peak_memory_mb(cfg.device))
                log(f"trained {pos}: {ms_range(t)} ms/step")
                save()
    for pos in schemes:  # in the order asked
        results[pos] = results.pop(pos)


def bench_generation(cfg, pos, log):
    """[figures per length] for one scheme: tokens/s, the median, and "<sampler>_tok_s_range": [min, max].
    The cached tokens are checked against the longest reference's so far, the graphed and compiled against the
    cached."""
    torch.manual_seed(cfg.seed)  # built in float32 as in training, then cast: the same weights, rounded
    model = GPT(cfg.model_configs[pos]).to(cfg.device, getattr(torch, cfg.dtype)).eval()
    prompt = torch.zeros(1, 1, dtype=torch.long, device=cfg.device)
    samplers = {
        "cached": partial(generate_cached, model, prompt, temperature=0, cuda_graph=False),
        "reference": partial(model.generate, prompt, temperature=0),
        "cuda_graph": partial(generate_cached, model, prompt, temperature=0, cuda_graph=True),
        "compiled": partial(generate_cached, model, prompt, temperature=0, compile=True),
    }
    samplers["cached"](8), samplers["reference"](8)  # warm-up
    rows, longest, limit = [], None, cfg.reference_max_tokens
    ops_per_step = len(decode_step_ops(cfg.model_configs[pos]))  # on the CPU: the same operators anywhere
    for multiple in cfg.gen_multiples:
        n = multiple * cfg.block_size
        skipped = f"skipped: {n} new tokens > --reference_max_tokens={limit}" if limit and n > limit else None
        row = {"new_tokens": n, "multiple": multiple, "dtype": cfg.dtype, "reference": skipped}  # why skipped
        row |= {f"{name}_tok_s{part}": None for name in SAMPLERS for part in ("", "_range")}
        graphed = decode_mode(model, cfg.device) == "cuda_graph"  # on CUDA, where the scheme's step is static
        outs, wanted = {}, {"cached": True, "reference": not skipped, "cuda_graph": graphed}
        wanted["compiled"] = cfg.compile_decode
        for name in (name for name in SAMPLERS if wanted[name]):
            sample = partial(samplers[name], n)
            if name == "compiled":  # a new cache size and graph per length: reset, or hit the recompile limit
                torch.compiler.reset()
                first, _ = timed(sample, cfg.device)  # compiles: untimed
            seconds = []  # up to cfg.repeats runs, fewer once they took REPEAT_BUDGET_S
            while len(seconds) < cfg.repeats and sum(seconds) < REPEAT_BUDGET_S:
                s, outs[name] = timed(sample, cfg.device)
                seconds.append(s)
            rates = sorted(n / s for s in seconds)
            row[f"{name}_tok_s"], row[f"{name}_tok_s_range"] = statistics.median(rates), [rates[0], rates[-1]]
        row["speedup"] = row["reference_tok_s"] and row["cached_tok_s"] / row["reference_tok_s"]
        if "reference" in outs and (longest is None or outs["reference"].size(1) > longest.size(1)):
            longest = outs["reference"]
        row["compile_s"] = row["cached_matches_reference"] = None
        for name in ("cuda_graph", "compiled"):
            row[f"{name}_matches"] = torch.equal(outs[name], outs["cached"]) if name in outs else None
        if "compiled" in outs:
            row["compile_s"] = max(0.0, first - n / row["compiled_tok_s"])
        if longest is not None:  # up to the shorter of the two
            k = min(outs["cached"].size(1), longest.size(1))
            row["cached_matches_reference"] = torch.equal(outs["cached"][:, :k], longest[:, :k])
        row["ops_per_step"] = ops_per_step
        rows.append(row)
        log(f"generated {pos} x{multiple}: {row['cached_tok_s']:.0f} tok/s cached")
    return rows


def with_range(median, bounds, spec, missing="-"):
    """'42.5 (40.1-47.0)': a median and the (min, max) of its repeats; `missing` for None."""
    return missing if median is None else f"{median:{spec}} ({bounds[0]:{spec}}-{bounds[1]:{spec}})"


def ms_range(t):
    return with_range(t["ms_per_step"], (t["step_ms_min"], t["step_ms_max"]), ".1f")


def warnings(report, cfg):
    """Why the figures may not be trusted: a spread over the repeats above UNRELIABLE_SPREAD, or other
    processes' load on the cores (the 1-minute load average at the start, against the cores it needs)."""
    m, limit = report["machine"], UNRELIABLE_SPREAD
    figures = [(pos, "ms/step", t["step_ms_min"], t["step_ms_max"]) for pos, t in report["training"].items()]
    for pos, g in report["generation"].items():
        for row in g["rows"]:
            for name in (name for name in SAMPLERS if row.get(f"{name}_tok_s_range")):
                figures.append((pos, f"{name} tok/s at {row['new_tokens']}", *row[f"{name}_tok_s_range"]))
    wide = [f"{pos} {what} {high / low:.1f}x" for pos, what, low, high in figures if high > limit * low]
    notes = [f"the repeats spread by more than {limit}x (max/min): {', '.join(wide)}"] if wide else []
    load, cores, threads = m["load_average"], m["cpu_count"], m["torch_threads"]
    if cfg.device == "cpu" and load is not None and load + threads > cores + 0.5:
        notes.append(f"the machine was busy: load average {load:.1f} on {cores} cores, threads={threads} "
                     "here; other processes slow these figures and make them noisy")  # fmt: skip
    return notes


def print_report(report, cfg):
    """The run's line, its training table and its generation table (each where measured), the warnings."""
    gpu, compiled = report["machine"]["gpu"], "" if cfg.compile_decode else " (off)"
    print(
        f"{report['command']}\n{report['date']}, torch {torch.__version__}, {cfg.device}"
        f"{f' ({gpu})' if gpu else ''}, {torch.get_num_threads()} threads, {cfg.dtype}, compile={cfg.compile}"
        f"; peak {fmt(report['peak_flops'], '.3g', '-')} FLOP/s ({report['peak_source']}); "
        f"memory: {report['memory']}; compiled decoding: {report['compiled_decoding']}{compiled}\n"
    )
    learned, train, generate = report["training"].get("learned", {}).get("ms_per_step"), [], []
    for pos, t in report["training"].items():
        ratio, share = learned and t["ms_per_step"] / learned, t.get("mfu")
        cells = [pos, f"{t['params']:,}", ms_range(t), fmt(ratio, ".2f", "-"), f"{t['tokens_per_sec']:,.0f}"]
        cells += [fmt(t["compile_s"], ".1f", "-"), f"{t['flops_per_token']:,}", f"{t['tflops']:.3g}"]
        train.append(cells + [fmt(share and 100 * share, ".1f", "-"), f"{t['peak_memory_mb']:,.0f}"])
    head = "pos|params|ms/step (min-max)|x learned|tokens/s|compile s|FLOPs/token|TFLOP/s|% of peak|peak MB"
    if train:
        print(markdown_table(head.split("|"), train) + "\n")
    for note in filter(None, (t.get("flops_note") for t in report["training"].values())):
        print(f"Note: {note}: FLOPs/token, TFLOP/s and % of peak leave it out\n")
    off = "-" if cfg.compile_decode else "off"  # the compiled column, when compiled decoding is off
    missing = {f"{s}_tok_s": m for s, m in zip(SAMPLERS, ("-", "skipped", "-", off))}
    for pos, g in report["generation"].items():
        for r in g["rows"]:
            rates = [with_range(r[k], r[k + "_range"], ",.0f", m) for k, m in missing.items()]
            checks = ("cached_matches_reference", "cuda_graph_matches", "compiled_matches")
            matches = [r[check] for check in checks if r.get(check) is not None]
            same = "n/a" if not matches else "yes" if all(matches) else "NO"
            speedup = fmt(r["speedup"], ".1f", "-") + ("x" if r["speedup"] else "")
            cells = [pos, r["dtype"], str(r["new_tokens"]), *rates[:2], speedup, *rates[2:], same]
            generate.append(cells + [str(r.get("ops_per_step", "-")), f"{g['peak_memory_mb']:,.0f}"])
    head = "pos|dtype|new tokens|cached tok/s|reference tok/s|speed-up|CUDA graph tok/s|compiled tok/s"
    head += "|same tokens|ops/step|peak MB"
    if generate:
        print(markdown_table(head.split("|"), generate))
    for note in report["warnings"]:
        print(f"\n!!! UNRELIABLE: {note}")


GENERATING = "lower --gen_multiples, or --reference_max_tokens for the reference sampler"  # what sizes it


def run(cfg, argv):
    """Every figure cfg asks for, printed and saved to --json as it comes. -> the report dict"""
    earlier = {
        "json": json_file(*REPORT_KEYS)
    }  # a report of an earlier run is replaced, the user's file kept
    inputs = [*config_files(argv), dataset_dir(cfg.dataset or "shakespeare_char")]  # no output replaces them
    check_outputs({"json": cfg.json}, inputs, earlier=earlier, replace=cfg.replace)  # before the benchmark
    log = partial(print, file=sys.stderr, flush=True)
    log(hardware.use_threads(cfg.threads, cfg.device))
    command, date = shlex.join(["python", "-m", "lab.perf.bench", *argv]), datetime.now(UTC).isoformat()
    report = {"command": command, "date": date, **machine_and_source(cfg.device), "config": asdict(cfg)}
    if cfg.device == "cpu":  # the CPU's practical peak: a float32 size^2 torch.mm, 2 size^3 FLOPs
        size = cfg.matmul_size
        with hardware.out_of_memory("lower --matmul_size"):  # two float32 size^2 operands and their product
            product = partial(torch.mm, torch.randn(size, size), torch.randn(size, size))
            product()  # warm-up
        seconds = statistics.median(timed(product, "cpu")[0] for _ in range(5))
        peak = 2 * size**3 / seconds, f"float32 {size}^2 torch.mm, measured in this run"
    elif cfg.device.startswith("cuda"):
        peak = hardware.peak_flops(cfg.device), "the card's bf16 peak (plumbing.hardware.PEAK_FLOPS)"
    else:
        peak = None, "unknown on this device"
    report |= dict(zip(("peak_flops", "peak_source"), peak))
    report["memory"] = "CUDA max_memory_allocated per scheme and phase"
    if not cfg.device.startswith("cuda"):
        report["memory"] = "process max RSS so far (a high-water mark, not per scheme)"
    report |= {"compiled_decoding": "generate_cached(model, idx, n, temperature=0, compile=True)"}
    report |= {"training": {}, "generation": {}, "warnings": []}

    def save():  # rewritten after each scheme, atomically: a run killed while writing keeps what it had
        report["warnings"] = warnings(report, cfg)
        if cfg.json:
            write_output("json", cfg.json, lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n"))

    if cfg.train_steps:  # with --rounds > 1 every scheme's trainer is held at once
        fit = "lower --batch_size, --block_size, --grad_accum, --n_layer or --n_embd, or time fewer --pos"
        with hardware.out_of_memory(fit + (" (--rounds > 1 holds them all)" if cfg.rounds > 1 else "")):
            bench_training(cfg, report["peak_flops"], report["training"], log, save)
    for pos in cfg.schemes if cfg.gen_multiples else ():
        peak_memory_mb(cfg.device, reset=True)
        with hardware.out_of_memory(GENERATING):
            rows = bench_generation(cfg, pos, log)
        report["generation"][pos] = {"rows": rows, "peak_memory_mb": peak_memory_mb(cfg.device)}
        save()  # a run cut short by a timeout keeps what it measured
    save()
    print_report(report, cfg)
    return report


def main(argv=None):
    """Run the benchmark; -> the report dict (also written to --json)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with one_line_errors(PROG):
        return run(parse_args(argv), argv)


if __name__ == "__main__":
    main()
