"""LongLoRA's two savings measured (Chen et al. 2024; docs/extrapolation.md, "LongLoRA"): RoPE fine-tuned from
T to 4 T in five settings, what each costs and what each keeps, in one command.

    python -m experiments.longlora --seeds 3     # 45 min on 2 cores shared with other jobs
    python -m experiments.longlora --quick       # every step once, tiny: a smoke run

It runs train.py and eval_length.py as a user would, each command printed first: the base, rope on
data/passkey (T = 64) into {out_root}/passkey_rope; per seed SETTINGS' fine-tunes of it to 4 T; passkey
retrieval and loss of all at 1, 2, 4, 8 T. Then each setting's step, timed here on random tokens (one thread),
its attention FLOPs, peak memory from the shapes and trained parameters. Under --results: longlora.csv (every
seed's cells) and longlora_table.md (cost, then mean and spread over seeds, orderings every seed keeps)."""

import csv
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from data.passkey.task import default_name
from finetune import lora, s2
from finetune.s2 import shifted_sparse_attention
from measure.instruments import pyplot, save_figure
from model import GPT, GPTConfig
from plumbing.cli import parse_flags
from plumbing.errors import one_line_errors
from plumbing.report import markdown_table
from plumbing.runs import ROOT, ensure_trained, run_python
from positions import require

PROG = "experiments/longlora.py"
T, EXTENSION, FIRST_SEED = 64, 4, 1337
LENGTHS = (1, 2, 4, 8)  # evaluation lengths, multiples of T
COST_LENGTHS = (EXTENSION * T, 4 * EXTENSION * T)  # the fine-tunes' length, and 4 times it for the trend
# (name, train.py flags): the five settings of the issue, LongLoRA's Table 2 columns and more
SETTINGS = (
    ("full", ()),
    ("s2", ("--s2_attn",)),
    ("s2_lora", ("--s2_attn", "--lora_rank=8")),
    ("s2_lora_embed_norm", ("--s2_attn", "--lora_rank=8", "--lora_train=embed,norm")),
    ("lora", ("--lora_rank=8",)),
)
NAMES = tuple(name for name, _ in SETTINGS)
MODEL = dict(n_layer=4, n_head=4, n_embd=128, bias=False, vocab_size=38)  # configs/passkey.toml's
QUICK_BASE = "--n_layer=2 --n_head=2 --n_embd=32 --eval_iters=2 --batch_size=4 --eval_interval=10".split()
QUICK_FINE_TUNE = ["--eval_iters=1", "--log_interval=2"]
COST = ("setting", "tokens", "trained params", "attention GFLOPs/step", "peak MiB (est.)", "ms/step")


@dataclass
class StudyConfig:
    seeds: int = 1  # fine-tuning seeds per setting: 1337, 1338, ...; the base is trained once (seed 1337)
    base_iters: int = 900  # the base's steps, its learning rate decayed over them (retrieval is learned late)
    max_iters: int = 150  # fine-tuning steps at 4 T
    learning_rate: float = 1e-3  # fine-tuning peak learning rate, the same for every setting (as LongLoRA)
    batch_size: int = 4  # fine-tuning sequences per step, each 4 T tokens long
    trials: int = 20  # passkey: samples per length and depth
    max_windows: int = 16  # loss: evaluation windows per length
    bench_steps: int = 5  # timed steps per setting (after one untimed)
    out_root: str | None = None  # None: out/longlora (out/longlora_quick with --quick)
    results: str | None = None  # None: docs (out_root with --quick)
    quick: bool = False  # smoke run: a small model, a few steps, a few samples
    figure_only: bool = False  # only draw docs/figures/s2_attn.png, S²-Attn's pattern

    def __post_init__(self):
        for name in "seeds base_iters max_iters batch_size trials max_windows bench_steps".split():
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.learning_rate > 0, f"learning_rate must be > 0, got {self.learning_rate}")
        if self.quick:
            self.base_iters, self.max_iters, self.trials, self.max_windows, self.bench_steps = 10, 4, 2, 2, 1
        self.out_root = self.out_root or ("out/longlora_quick" if self.quick else "out/longlora")
        self.results = self.results or (self.out_root if self.quick else "docs")


def step_cost(cfg, length, name, flags):
    """{COST column: value} of one setting: a fresh model of block_size `length`, timed over bench_steps AdamW
    steps on random tokens after one untimed."""
    torch.manual_seed(0)
    quick = dict(n_layer=2, n_head=2, n_embd=32) if cfg.quick else {}
    config = GPTConfig(**(MODEL | quick), block_size=length, pos="rope")
    model = GPT(config)
    given = dict(flag.removeprefix("--").partition("=")[::2] for flag in flags)  # {name: value}
    group = s2.group_size(None, length, config.n_head) if "s2_attn" in given else None
    s2.use_s2_attn(model, group)
    if "lora_rank" in given:  # with train.py's alpha and dropout
        lora.add_adapters(model, int(given["lora_rank"]), 16.0, 0.05, given.get("lora_train"))
    optimizer = model.configure_optimizers(0.1, cfg.learning_rate, (0.9, 0.99), "cpu")
    x = torch.randint(0, config.vocab_size, (cfg.batch_size, config.block_size))
    times = []
    for _ in range(cfg.bench_steps + 1):
        start = time.perf_counter()
        model(x, x)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    trained, total = lora.trained_params(model)
    B, C, keys = cfg.batch_size, config.n_embd, group or config.block_size
    # The peak of a float32 step, from the shapes: weights; gradients and AdamW's two moments of the trained
    # parameters; per layer what backward keeps, about 16 activations of B x T x C (LayerNorm inputs, q k v,
    # attention output, the MLP's 4 C twice, ...) and the attention probabilities (B x nh x T x keys); the
    # logits and their gradient. A LoRA adapter's small activations are left out.
    per_layer = 16 * B * length * C + B * config.n_head * length * keys
    peak = 4 * (total + 3 * trained + config.n_layer * per_layer + 2 * B * length * config.vocab_size)
    flops = 12 * config.n_layer * C * keys * B * length / 1e9  # hardware.flops_per_token's attention term
    return dict(zip(COST, (name, length, trained, flops, peak / 2**20, 1000 * statistics.median(times[1:]))))


def visibility(n_head, length, group):
    """(nh, length, length) bools: which key each query of each head reads under S²-Attn, from the code
    itself: zero queries (uniform weights over the visible keys) and one-hot values."""
    q = torch.zeros(1, n_head, length, length, dtype=torch.float64)
    v = torch.eye(length, dtype=torch.float64).expand(1, n_head, length, length)
    return shifted_sparse_attention(q, q, v, group)[0] > 0


def draw_pattern(path, length=16, group=4):
    """docs/figures/s2_attn.png: who sees whom in an unshifted head, a shifted head, and both together."""
    seen = visibility(2, length, group).float()
    both = 0.25 * torch.ones(length, length).tril() + 0.75 * seen.amax(0)
    panels = [
        (f"heads 0 .. nh/2-1: groups of {group}", seen[0]),
        (f"heads nh/2 .. nh-1: shifted by {group // 2}", seen[1]),
        ("one layer, both halves (causal: light)", both),
    ]
    fig, axes = pyplot().subplots(1, 3, figsize=(12, 4.6))
    for ax, (title, image) in zip(axes, panels):
        ax.imshow(image, cmap="Blues", vmin=0, vmax=1)
        ax.set(title=title, xlabel="key position", ylabel="query position")
        for edge in range(group, length, group):
            ax.axhline(edge - 0.5, color="grey", lw=0.5), ax.axvline(edge - 0.5, color="grey", lw=0.5)
    fig.suptitle(f"S²-Attn, T = {length}, G = {group}: the last shifted group is two pieces, no wrap")
    fig.tight_layout()
    return save_figure(fig, path)


def quality_table(per_seed, task):
    """Mean ± sd over seeds per setting and length (points for passkey), then with several seeds per length
    the fine-tunes ranked by the mean, best first: '>' ('<' for loss) where every seed agrees, '~' not."""
    lengths, passkey = [m * T for m in LENGTHS], task == "passkey"

    def spread(values):
        mean, sd = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
        if passkey:
            return f"{mean:.0%}" + (f" ± {100 * sd:.0f}" if sd is not None else "")
        return f"{mean:.3f}" + (f" ± {sd:.3f}" if sd is not None else "")

    found = lambda name, n: [c[(name, n)] for c in per_seed if (name, n) in c] or [float("nan")]
    rows = [[name, *(spread(found(name, n)) for n in lengths)] for name in ["base", *NAMES]]
    text = [markdown_table(["setting", *(f"{n} ({n // T} T)" for n in lengths)], rows), ""]
    for n in lengths if len(per_seed) > 1 else []:
        values = {name: [c[(name, n)] for c in per_seed] for name in NAMES}
        mean = {name: statistics.fmean(v) for name, v in values.items()}
        ranked = sorted(mean, key=mean.get, reverse=passkey)
        order = ranked[0]
        for a, b in zip(ranked, ranked[1:]):
            holds = all((x > y) if passkey else (x < y) for x, y in zip(values[a], values[b]))
            order += f" {('>' if passkey else '<') if holds else '~'} {b}"
        text.append(f"- {n} tokens: {order}")
    return "\n".join(text)


def main(argv=None):
    with one_line_errors(PROG):
        values = parse_flags(argv, PROG, __doc__, [("study", StudyConfig, None)])
        return run_study(StudyConfig(**values), argv)


def run_study(cfg, argv):
    start = time.perf_counter()
    results = ROOT / cfg.results
    print(f"wrote {draw_pattern(results / 'figures' / 's2_attn.png')}")
    if cfg.figure_only:
        return None
    for length in (T, EXTENSION * T):
        if not (ROOT / "data" / default_name(length) / "meta.json").is_file():
            run_python(["-m", "data.passkey.prepare", f"--block_size={length}"])
    base, n = f"{cfg.out_root}/passkey_rope", cfg.base_iters  # the base: its rate decayed over its steps
    flags = ["--config=configs/passkey.toml", "--pos=rope", f"--max_iters={n}", f"--lr_decay_iters={n}"]
    flags += [f"--out_dir={base}", f"--seed={FIRST_SEED}", "--device=cpu", *(QUICK_BASE if cfg.quick else [])]
    ensure_trained([flags])
    seeds = [FIRST_SEED + i for i in range(cfg.seeds)]
    long, steps, tenth = EXTENSION * T, cfg.max_iters, max(1, cfg.max_iters // 10)
    schedule = [f"--init_from={base}", f"--block_size={long}", f"--dataset={default_name(long)}"]
    schedule += [f"--max_iters={steps}", f"--warmup_iters={tenth}", f"--eval_interval={steps}"]
    schedule += ["--eval_iters=10", f"--log_interval={tenth}", f"--batch_size={cfg.batch_size}"]
    schedule += [f"--learning_rate={cfg.learning_rate}", f"--min_lr={cfg.learning_rate / 10:g}"]
    runs, quick = {}, QUICK_FINE_TUNE if cfg.quick else []
    for seed in seeds:  # the fine-tunes, one seed's in one call
        runs[seed] = [f"{cfg.out_root}/passkey_rope_ctx{long}_{name}_seed{seed}" for name in NAMES]
        commands = [
            [*schedule, *flags, f"--seed={seed}", "--device=cpu", f"--out_dir={out}", *quick]
            for (_, flags), out in zip(SETTINGS, runs[seed])
        ]
        ensure_trained(commands)
    per_task, lengths = {}, ",".join(f"{m * T}t" for m in LENGTHS)
    rows = ["task,seed,setting,length,value\n"]  # longlora.csv
    # eval_length.py on the runs (RoPE as trained, no extension at inference)
    for task in ("passkey", "loss"):
        per_task[task] = []
        amount = f"--trials={cfg.trials}" if task == "passkey" else f"--max_windows={cfg.max_windows}"
        data = [] if task == "passkey" else [f"--dataset={default_name(EXTENSION * T)}"]  # one split for all
        for seed in seeds:
            csv_path = ROOT / cfg.out_root / f"longlora_{task}_seed{seed}.csv"
            command = ["eval_length.py", base, *runs[seed], f"--task={task}", "--lengths", lengths, amount]
            command += ["--rope_scalings", *data, "--device=cpu", "--progress=false", "--csv", csv_path]
            print(f"\n$ python {' '.join(map(str, command))}")
            run_python(command)
            names = dict(zip([Path(d).name for d in (base, *runs[seed])], ["base", *NAMES]))
            found = {}  # {(setting, length): value}: passkey accuracy pooled over depths, or the mean loss
            with open(csv_path, newline="", encoding="utf-8") as f:
                for r in csv.DictReader(f):
                    key = (names[Path(r["checkpoint"]).name], int(r["length"]))
                    if task == "passkey" and int(r["trials"]):
                        correct, trials = found.get(key, (0, 0))
                        found[key] = (correct + int(r["correct"]), trials + int(r["trials"]))
                    elif task == "loss" and r["loss"]:
                        found[key] = float(r["loss"])
            per_task[task].append({k: (v[0] / v[1] if task == "passkey" else v) for k, v in found.items()})
            rows += [f"{task},{seed},{name},{n},{v:.6g}\n" for (name, n), v in per_task[task][-1].items()]
    torch.set_num_threads(1)
    cost = [step_cost(cfg, n, *setting) for n in COST_LENGTHS for setting in SETTINGS]
    fmt = lambda v: f"{v:,}" if isinstance(v, int) else (f"{v:.3g}" if isinstance(v, float) else v)
    (results / "longlora.csv").write_text("".join(rows), encoding="utf-8")
    listed = ", ".join(map(str, seeds))
    command = " ".join(["python -m experiments.longlora", *(argv or sys.argv[1:])])
    footer = f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `{command}`: torch {torch.__version__}, "
    footer += f"Python {platform.python_version()}, {platform.machine()}; "
    footer += f"wall time {(time.perf_counter() - start) / 60:.1f} min"
    footer += " (--quick: the numbers mean nothing)." if cfg.quick else "."
    parts = [
        f"Cost of one fine-tuning step of batch {cfg.batch_size} at the fine-tunes' {COST_LENGTHS[0]} "
        f"tokens and at {COST_LENGTHS[1]} (ms/step timed in one thread on random tokens):",
        markdown_table(list(cost[0]), [[fmt(v) for v in c.values()] for c in cost]),
        f"Passkey retrieval (exact match, pooled over depths; mean ± sd in points over seeds {listed}):",
        quality_table(per_task["passkey"], "passkey"),
        f"Validation loss on data/passkey_ctx{EXTENSION * T}'s val split, windows of each length "
        f"(mean ± sd over seeds {listed}):",
        quality_table(per_task["loss"], "loss"),
        footer,
    ]
    text = "\n\n".join(parts)
    (results / "longlora_table.md").write_text(text + "\n", encoding="utf-8")
    print(f"\n{text}\nwrote {cfg.results}/longlora.csv and longlora_table.md")
    return cost, per_task


if __name__ == "__main__":
    main()
