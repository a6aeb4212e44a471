"""LongLoRA as its authors ran it (Chen et al. 2024; docs/extrapolation.md, "LongLoRA"): RoPE fine-tuned from
T to 4 T with position interpolation, S²-Attn and LoRA, what each costs and keeps, in one command.

    python -m lab.experiments.longlora --jobs 2      # the whole study: about 2.5 hours on 2 cores
    python -m lab.experiments.longlora --tables      # only the tables and the docs' blocks, from CSVs
    python -m lab.experiments.longlora --quick       # every step once, tiny: a smoke run
    python -m lab.experiments.longlora --jobs 2 --budgets pi_full:250,500,1000,2000,4000,8000,16000 \
        pi_s2:250,500,1000,2000,4000,8000 pi_s2_lora:8000 pi_s2_lora_embed_norm:8000   # docs' budget rows

The authors' recipe (dvlab-research/LongLoRA's fine-tune.py, eval.py, passkey_retrivial.py): PI at the
extension factor, AdamW without weight decay, a constant rate after 20 warmup steps, LoRA of rank 8, and their
Table 2's settings each with S²-Attn (G = L / 4) beside full attention; YaRN and no scaling as ablations. Each
setting takes its best of --rates (the loss at 4 T, seed 1337) and is trained with --seeds seeds; reported on
data no choice saw, with paired verdicts over seeds (lab/measure/paired.py). Under --results: longlora.csv
(every measured cell, its `base` column naming the base run each fine-tune started from), longlora_cost.csv
(each step's cost) and longlora_table.md.

--budgets SETTING:STEPS,... trains only those fine-tunes (each at the rate longlora.csv's sweep chose for it,
over --seeds) from the base {out_root}/{budget_base}, trained first with the study's own command if missing,
and replaces longlora.csv's budget rows of those settings: the budget table's rows, every setting present."""

import sys

if not __package__:  # `python lab/experiments/longlora.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.experiments.longlora`")

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from data.passkey.task import default_name
from lab.experiments.longlora_results import (
    COST,
    CSV_COLUMNS,
    CSV_NUMBERS,
    EXTENSION,
    FIRST_SEED,
    LONG,
    PROG,
    T,
    read_results,
    seed_values,
)
from lab.experiments.runs import (
    ROOT,
    check_jobs,
    ensure_trained,
    eval_length,
    mean_sd,
    paired_verdict,
    read_rows,
    run_python,
    study_inputs,
)
from lab.finetune import lora, s2
from lab.finetune.s2 import shifted_sparse_attention
from lab.measure.instruments import pyplot, save_figure
from lab.outputs import check_folder, check_outputs, write_output, write_rows
from lab.tables import fill_generated, markdown_table, measured
from model import GPT, GPTConfig
from plumbing import fields
from plumbing.cli import parse_flags
from plumbing.errors import one_line_errors
from positions import require

LENGTHS = (1, 2, 4, 8)  # evaluation lengths, multiples of T
COST_LENGTHS = (LONG, 4 * LONG)  # the fine-tunes' length, and 4 times it for the trend
TEST_DATA = f"{default_name(LONG)}_test"  # the reported loss's data: its own generator seed
SCALINGS = {  # the RoPE scaling of a fine-tune, in training and (recorded in the checkpoint) evaluation
    "pi": ("--rope_scaling=linear", f"--rope_factor={EXTENSION}"),  # the authors'
    "yarn": ("--rope_scaling=yarn", f"--rope_factor={EXTENSION}"),
    "none": (),  # plain RoPE extrapolated: the ablation
}
LORA = ("--lora_rank=8", "--lora_dropout=0")  # alpha 16, as the authors' (peft's LoraConfig)
METHODS = {  # LongLoRA's Table 2, each with S²-Attn, and full attention as the reference
    "full": (),
    "s2": ("--s2_attn",),
    "s2_lora": ("--s2_attn", *LORA),
    "s2_lora_embed_norm": ("--s2_attn", *LORA, "--lora_train=embed,norm"),
}
SETTINGS = {
    f"{scaling}_{method}": (*SCALINGS[scaling], *flags)
    for scaling in SCALINGS
    for method, flags in METHODS.items()
}
SETTINGS[f"none_s2_g{2 * T}"] = ("--s2_attn", f"--s2_group={2 * T}")  # every training distance up to 2 T
CURVE_SETTINGS = ("pi_full", "pi_s2")
# (a, b, what the paper says of a against b): the verdicts, each at 4 T by retrieval and by loss
COMPARISONS = (
    ("pi_s2", "pi_full", "S²-Attn in training comes close to full attention"),
    ("pi_s2_lora", "pi_s2", "LoRA alone falls short of full-parameter fine-tuning"),
    ("pi_s2_lora_embed_norm", "pi_s2_lora", "trainable embeddings and norms close LoRA's gap"),
    ("yarn_full", "pi_full", "YaRN against PI (Peng et al. 2023), full attention"),
    ("yarn_s2", "pi_s2", "YaRN against PI, S²-Attn"),
    ("pi_full", "none_full", "PI against no scaling, full attention"),
    ("pi_s2", "none_s2", "PI against no scaling, S²-Attn"),
    (f"none_s2_g{2 * T}", "none_s2", "S²-Attn with groups of 2 T against T, no scaling"),
    (f"none_s2_g{2 * T}", "none_full", "S²-Attn with groups of 2 T against full attention, no scaling"),
)
PAPER_COMPARISONS = COMPARISONS[:3]  # LongLoRA's own: S²-Attn, LoRA, embed/norm
MODEL = dict(n_layer=4, n_head=4, n_embd=128, bias=False, vocab_size=38)  # configs/passkey.toml's
QUICK_BASE = "--n_layer=2 --n_head=2 --n_embd=32 --eval_iters=2 --batch_size=4 --eval_interval=10".split()


@dataclass
class StudyConfig:
    seeds: int = fields.setting(3, at_least=1)  # fine-tuning seeds per setting: 1337, ...; one base (1337)
    base_iters: int = fields.setting(900, at_least=1)  # the base's steps, its rate decayed over them
    max_iters: int = fields.setting(1000, at_least=1)  # fine-tuning steps at 4 T
    rates: list[float] = field(default_factory=lambda: [1e-4, 5e-4, 3e-3])  # the sweep, constant after warmup
    curve: list[int] = field(default_factory=lambda: [250, 500, 2000, 4000])  # budgets for pi_full, pi_s2
    batch_size: int = fields.setting(4, at_least=1)  # fine-tuning sequences per step, each 4 T tokens long
    trials: int = fields.setting(20, at_least=1)  # passkey: samples per length and depth
    max_windows: int = fields.setting(
        16, at_least=1
    )  # loss: windows per length, to choose the rate and to report
    bench_steps: int = fields.setting(5, at_least=1)  # timed steps per method (after one untimed)
    jobs: int = fields.setting(1, at_least=1)  # runs side by side (at most the cores), each its share of them
    out_root: str | None = None  # None: out/longlora (out/longlora_quick with --quick)
    results: str | None = None  # None: docs (out_root with --quick)
    quick: bool = False  # smoke run: a small model, a few steps, a few samples
    tables: bool = False  # only write the tables from the CSVs under --results (and the docs' blocks)
    figure_only: bool = False  # only draw docs/figures/s2_attn.png, S²-Attn's pattern
    budgets: list[str] = field(default_factory=list)  # SETTING:STEPS,...: only these budget runs (see above)
    budget_base: str = "passkey_rope_budget"  # --budgets: the base's folder under out_root

    def __post_init__(self):
        fields.check_fields(self)
        require(self.rates and all(r > 0 for r in self.rates), f"rates must be > 0, got {self.rates}")
        check_jobs(self.jobs, "cpu")  # every run of the study trains on the CPU
        require(all(n >= 1 for n in self.curve), f"curve's budgets must be >= 1 step, got {self.curve}")
        budget_steps(self.budgets)  # checks them
        if self.quick:
            self.base_iters, self.max_iters, self.trials, self.max_windows, self.bench_steps = 10, 4, 2, 2, 1
            self.rates, self.seeds, self.curve = self.rates[:1], min(self.seeds, 2), [2]
        self.rates, self.curve = sorted(set(self.rates)), sorted(set(self.curve) - {self.max_iters})
        self.out_root = self.out_root or ("out/longlora_quick" if self.quick else "out/longlora")
        self.results = self.results or (self.out_root if self.quick else "docs")


def budget_steps(budgets):
    """['pi_full:250,500', 'pi_s2:8000'] -> {'pi_full': [250, 500], 'pi_s2': [8000]}, else a ValueError."""
    found = {}
    for entry in budgets:
        setting, _, steps = entry.partition(":")
        require(setting in SETTINGS, f"budgets: {setting!r} is no setting; give one of {', '.join(SETTINGS)}")
        try:
            found[setting] = sorted({int(n) for n in steps.split(",")})
        except ValueError:
            found[setting] = [0]
        require(
            all(n >= 1 for n in found[setting]), f"budgets: {entry!r} is not SETTING:STEPS,... of steps >= 1"
        )
    return found


def base_label(folder):
    """longlora.csv's base column: the base run's folder name and its training seed."""
    return f"{Path(folder).name} (seed {FIRST_SEED})"


def step_cost(cfg, length, name, flags):
    """{COST column: value} of one method: a fresh model of block_size `length`, timed over bench_steps AdamW
    steps on random tokens after one untimed."""
    torch.manual_seed(0)
    quick = dict(n_layer=2, n_head=2, n_embd=32) if cfg.quick else {}
    config = GPTConfig(**(MODEL | quick), block_size=length, pos="rope")
    model = GPT(config)
    given = dict(flag.removeprefix("--").partition("=")[::2] for flag in flags)  # {name: value}
    group = int(given["s2_group"]) if "s2_group" in given else None  # None: L / 4
    group = s2.group_size(group, length, config.n_head) if "s2_attn" in given else None
    s2.use_s2_attn(model, group)
    if "lora_rank" in given:  # with lab.finetune's alpha
        lora.add_adapters(
            model, int(given["lora_rank"]), 16.0, float(given["lora_dropout"]), given.get("lora_train")
        )
    optimizer = model.configure_optimizers(0.0, cfg.rates[0], (0.9, 0.99), "cpu")
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


def fine_tune_command(cfg, base, setting, rate, steps, seed):
    """`python -m lab.finetune`'s arguments for one fine-tune: the authors' optimizer (constant rate after 20
    warmup steps, no weight decay) at 4 T on data/passkey_ctx256, ten evaluations of the val loss on the
    way."""
    out = f"{cfg.out_root}/{setting}_lr{rate:g}_{steps}steps_seed{seed}"
    tenth = max(1, steps // 10)
    flags = [f"--init_from={base}", f"--block_size={LONG}", f"--dataset={default_name(LONG)}"]
    flags += [f"--max_iters={steps}", f"--warmup_iters={min(20, steps - 1)}", f"--learning_rate={rate:g}"]
    flags += [f"--min_lr={rate:g}", "--weight_decay=0", f"--batch_size={cfg.batch_size}", "--eval_iters=10"]
    flags += [f"--eval_interval={tenth}", f"--log_interval={tenth}", f"--seed={seed}", "--device=cpu"]
    return ["-m", "lab.finetune", *flags, *SETTINGS[setting], f"--out_dir={out}"], out


def evaluate(cfg, task, folders, path, data, multiples=LENGTHS):
    """lab/eval_length.py on each folder's last checkpoint (ckpt.pt), RoPE as each records it, at these
    multiples of T -> {(folder name, length): retrieval pooled over depths, or the mean loss}"""
    lengths = ",".join(f"{m * T}t" for m in multiples)
    flags = ["--rope_scalings", "--device=cpu", "--progress=false"]
    flags += [f"--dataset={data}"] if task == "loss" else []  # the passkey task makes its own samples
    key = lambda r: (Path(r["checkpoint"]).parent.name, int(r["length"]))
    return eval_length(cfg, task, [f"{f}/ckpt.pt" for f in folders], lengths, path, key, *flags)


def main(argv=None):
    with one_line_errors(PROG):
        cfg = StudyConfig(**parse_flags(argv, PROG, __doc__, [("study", StudyConfig, None)]))
        results = ROOT / cfg.results
        if cfg.tables:
            return write_tables(cfg, results, footer=None)
        for name in ("longlora.csv", "longlora_cost.csv", "longlora_table.md"):  # before any training
            check_outputs({"results": results / name}, study_inputs())
        check_folder("out_root", ROOT / cfg.out_root, study_inputs())
        return run_budgets(cfg, results, argv) if cfg.budgets else run_study(cfg, results, argv)


def run_study(cfg, results, argv):
    start = time.perf_counter()
    print(f"wrote {draw_pattern(results / 'figures' / 's2_attn.png')}")
    if cfg.figure_only:
        return None
    for length, name, seed in ((T, default_name(T), 0), (LONG, default_name(LONG), 0), (LONG, TEST_DATA, 1)):
        if not (ROOT / "data" / name / "meta.json").is_file():
            small = ["--train_samples=1", f"--name={name}"] if name == TEST_DATA else []
            run_python(["-m", "data.passkey.prepare", f"--block_size={length}", f"--seed={seed}", *small])
    base = train_base(cfg, f"{cfg.out_root}/passkey_rope")
    rows = []  # longlora.csv: CSV_COLUMNS

    # 1. the rate: every setting at every rate, seed 1337, by the loss at 4 T on the val split
    sweep = {
        (s, r): fine_tune_command(cfg, base, s, r, cfg.max_iters, FIRST_SEED)
        for s in SETTINGS
        for r in cfg.rates
    }
    ensure_trained([command for command, _ in sweep.values()], jobs=cfg.jobs)
    path = ROOT / cfg.out_root / "sweep_loss.csv"
    chosen = evaluate(cfg, "loss", [out for _, out in sweep.values()], path, default_name(LONG), (EXTENSION,))
    best = {}
    for (name, rate), (_, out) in sweep.items():
        loss = chosen.get((Path(out).name, LONG), float("inf"))
        rows.append(("sweep", "loss", FIRST_SEED, name, rate, cfg.max_iters, LONG, loss, base_label(base)))
        if name not in best or loss < best[name][1]:
            best[name] = (rate, loss)

    # 2. every setting at its rate, over the seeds; the curve of the PI settings over more budgets
    budgets = [(s, cfg.max_iters) for s in SETTINGS] + [(s, n) for s in CURVE_SETTINGS for n in cfg.curve]
    runs = {
        (s, seed, steps): fine_tune_command(cfg, base, s, best[s][0], steps, seed)
        for s, steps in budgets
        for seed in range(FIRST_SEED, FIRST_SEED + cfg.seeds)
    }
    ensure_trained([command for command, _ in runs.values()], jobs=cfg.jobs)

    # 3. what is reported: retrieval on fresh samples, the loss on the test data, at 1-8 T
    folders = [base] + [out for _, out in runs.values()]
    for task, data in (("passkey", default_name(LONG)), ("loss", TEST_DATA)):
        cells = evaluate(cfg, task, folders, ROOT / cfg.out_root / f"report_{task}.csv", data)
        for (name, length), value in cells.items():
            if name == Path(base).name:
                rows.append(
                    ("report", task, FIRST_SEED, "base", "", cfg.base_iters, length, value, base_label(base))
                )
        for (setting, seed, steps), (_, out) in runs.items():
            phases = ("report",) if steps == cfg.max_iters else ()  # the budget table: every budget
            phases += ("budget",) if setting in CURVE_SETTINGS else ()
            for phase, length in ((phase, m * T) for phase in phases for m in LENGTHS):
                value = cells.get((Path(out).name, length), float("nan"))
                rows.append(
                    (phase, task, seed, setting, best[setting][0], steps, length, value, base_label(base))
                )

    torch.set_num_threads(1)
    methods = METHODS | {f"s2_g{2 * T}": SETTINGS[f"none_s2_g{2 * T}"]}
    cost = [step_cost(cfg, n, name, flags) for n in COST_LENGTHS for name, flags in methods.items()]
    write_rows("results", results / "longlora.csv", CSV_COLUMNS, rows)
    write_rows("results", results / "longlora_cost.csv", COST, [list(c.values()) for c in cost])
    return write_tables(cfg, results, measured(PROG, argv, start, cfg.quick))


def train_base(cfg, base):
    """The base run `base` (a folder): configs/passkey.toml's rope model, its rate decayed over base_iters."""
    n = cfg.base_iters
    flags = ["--config=configs/passkey.toml", "--pos=rope", f"--max_iters={n}", f"--lr_decay_iters={n}"]
    flags += [f"--out_dir={base}", f"--seed={FIRST_SEED}", "--device=cpu", *(QUICK_BASE if cfg.quick else [])]
    ensure_trained([flags])
    return base


def run_budgets(cfg, results, argv):
    """--budgets: each setting's fine-tunes at its budgets from the base {out_root}/{budget_base}, at the rate
    results/longlora.csv's rows chose for it; their rows replace that file's budget rows of these settings."""
    start, old = time.perf_counter(), read_rows(results / "longlora.csv", CSV_COLUMNS, PROG, *CSV_NUMBERS)
    rates = {
        r["setting"]: float(r["learning_rate"]) for r in old if r["phase"] == "report" and r["learning_rate"]
    }
    budgets = budget_steps(cfg.budgets)
    require(
        not budgets.keys() - rates.keys(),
        f"{results / 'longlora.csv'} chose no rate for {budgets.keys() - rates.keys()}",
    )
    base = train_base(cfg, f"{cfg.out_root}/{cfg.budget_base}")
    runs = {
        (s, seed, n): fine_tune_command(cfg, base, s, rates[s], n, seed)
        for s, steps in budgets.items()
        for n in steps
        for seed in range(FIRST_SEED, FIRST_SEED + cfg.seeds)
    }
    ensure_trained([command for command, _ in runs.values()], jobs=cfg.jobs)
    rows = [
        [r.get(c, "") for c in CSV_COLUMNS]
        for r in old
        if not (r["phase"] == "budget" and r["setting"] in budgets)
    ]
    for task, data in (("passkey", default_name(LONG)), ("loss", TEST_DATA)):
        folders = [out for _, out in runs.values()]
        cells = evaluate(cfg, task, folders, ROOT / cfg.out_root / f"budget_{task}.csv", data)
        for (name, seed, steps), (_, out) in runs.items():
            for length in (m * T for m in LENGTHS):
                value = cells.get((Path(out).name, length), float("nan"))
                rows.append(("budget", task, seed, name, rates[name], steps, length, value, base_label(base)))
    write_rows("results", results / "longlora.csv", CSV_COLUMNS, rows)
    footer = measured(PROG, argv, start, cfg.quick).replace("Measured", "Budget rows measured", 1)
    return write_tables(cfg, results, footer, keep=True)


def tables(rows, cost):
    """{name: (caption, markdown table)} from longlora.csv's rows and longlora_cost.csv's: what the docs show,
    each under its name in longlora_table.md and in the docs' generated blocks."""
    report = [r for r in rows if r["phase"] == "report"]
    steps = int(next(r for r in rows if r["phase"] == "sweep")["steps"])  # the budget, the curve's apart
    listed = ", ".join(sorted({r["seed"] for r in report if r["setting"] != "base"}))
    return {
        "longlora_cost": (
            "Cost of one fine-tuning step (ms/step timed in one thread on random tokens):",
            cost_table(cost),
        ),
        "longlora_rate": (
            f"The rate: validation loss at {LONG} tokens (data/{default_name(LONG)}'s val split) after "
            f"{steps} steps, seed {FIRST_SEED}; in bold the rate each setting is reported at:",
            rate_table(rows),
        ),
        "longlora_curve": (
            f"The budget: retrieval / test loss at {LONG} tokens against fine-tuning steps (mean over seeds "
            f"{listed}, each setting at its rate; the rate is constant, so a shorter run is the start of a "
            "longer one); whether each setting still gains between its two longest budgets; and the "
            "paper's comparisons at the longest budget both sides trained:",
            curve_table(rows),
        ),
        "longlora_retrieval": (
            f"Passkey retrieval (exact match pooled over depths, fresh keys; mean ± sd over seeds {listed}):",
            quality_table(rows, "passkey", steps),
        ),
        "longlora_loss": (
            f"Test loss (data/{TEST_DATA}'s val split; mean ± sd over seeds {listed}):",
            quality_table(rows, "loss", steps),
        ),
        "longlora_verdicts": (
            f"Verdicts at {LONG} tokens: the paired difference a - b over seeds {listed}, its 95% t interval "
            "and the word it supports ('level' where it holds 0):",
            markdown_table(
                ["a", "b", "the claim", "retrieval a - b", "loss a - b"], verdict_rows(rows, steps)
            ),
        ),
    }


def render(found):
    """longlora_table.md's body: each table under its caption and its name."""
    return "\n\n".join(f"{caption} ({name})\n\n{table}" for name, (caption, table) in found.items())


def cost_table(cost):
    number = lambda c: [c["method"], f"{int(c['tokens']):,}", f"{int(c['trained params']):,}"]
    figures = lambda c: [f"{float(c[k]):.3g}" for k in COST[3:]]
    return markdown_table(list(COST), [number(c) + figures(c) for c in cost])


def rate_table(rows):
    sweep = [r for r in rows if r["phase"] == "sweep"]
    rates = sorted({float(r["learning_rate"]) for r in sweep})
    loss = {(r["setting"], float(r["learning_rate"])): float(r["value"]) for r in sweep}
    chosen = {
        r["setting"]: float(r["learning_rate"]) for r in rows if r["phase"] == "report" and r["learning_rate"]
    }
    bold = lambda s, r: "**" if chosen.get(s) == r else ""
    cell = lambda s, r: f"{bold(s, r)}{loss[s, r]:.3f}{bold(s, r)}" if (s, r) in loss else "n/a"
    settings = dict.fromkeys(r["setting"] for r in sweep)
    return markdown_table(
        ["setting", *(f"lr {r:g}" for r in rates)], [[s, *(cell(s, r) for r in rates)] for s in settings]
    )


def curve_table(rows):
    """Retrieval / loss at 4 T per budget of every setting with budget rows (CURVE_SETTINGS', and any other
    trained longer), mean over seeds; then each setting's longest budget against the one before, paired over
    seeds: has it stopped improving? And the paper's comparisons at the longest budget both sides trained."""
    budget = [r for r in rows if r["phase"] == "budget"]
    steps = {s: sorted({int(r["steps"]) for r in budget if r["setting"] == s}) for s in SETTINGS}
    steps = {s: n for s, n in steps.items() if n}

    def cell(setting, n):
        values = {task: seed_values(rows, setting, task, LONG, n, "budget") for task in ("passkey", "loss")}
        if not all(values.values()):
            return "n/a"  # not trained at this budget
        return " / ".join(mean_sd(list(v.values()), task, spread=False) for task, v in values.items())

    budgets = sorted(set().union(*steps.values()))
    curve = markdown_table(
        ["setting", *(f"{n} steps" for n in budgets)], [[s, *(cell(s, n) for n in budgets)] for s in steps]
    )
    longest = {s: n[-2:] for s, n in steps.items() if len(n) > 1}
    gains = [[s, str(a), str(b), *paired(rows, (s, a), (s, b), "budget")] for s, (b, a) in longest.items()]
    head = ["setting", "a (steps)", "b (steps)", "retrieval a - b", "loss a - b"]
    common = {(a, b): set(steps.get(a, ())) & set(steps.get(b, ())) for a, b, _ in PAPER_COMPARISONS}
    versus = [
        [a, b, str(max(n)), *paired(rows, (a, max(n)), (b, max(n)), "budget")]
        for (a, b), n in common.items()
        if n
    ]
    versus_head = ["a", "b", "steps", "retrieval a - b", "loss a - b"]
    return f"{curve}\n\n{markdown_table(head, gains)}\n\n{markdown_table(versus_head, versus)}"


def quality_table(rows, task, steps):
    """Mean ± sd over seeds per setting (at its rate) and length, the base first."""
    report = [r for r in rows if r["phase"] == "report" and r["task"] == task]
    lengths = sorted({int(r["length"]) for r in report})
    rate = {r["setting"]: r["learning_rate"] for r in report}
    values = lambda s, n: list(seed_values(rows, s, task, n, None if s == "base" else steps).values())
    table = [
        [s if s == "base" else f"{s} (lr {rate[s]})", *(mean_sd(values(s, n), task) for n in lengths)]
        for s in dict.fromkeys(r["setting"] for r in report)
    ]
    return markdown_table(["setting", *(f"{n} ({n // T} T)" for n in lengths)], table)


def paired(rows, a, b, phase):
    """(setting, steps) a against b at 4 T, paired over seeds: [retrieval (points), loss], each a - b [low,
    high] and its word."""
    values = lambda setting, steps, task: seed_values(rows, setting, task, LONG, steps, phase)
    return [paired_verdict(values(*a, t), values(*b, t), t, unit=" points") for t in ("passkey", "loss")]


def verdict_rows(rows, steps):
    """COMPARISONS' rows: for retrieval (points) and loss, a - b [low, high] and its word."""
    return [[a, b, claim, *paired(rows, (a, steps), (b, steps), "report")] for a, b, claim in COMPARISONS]


def footers(path):
    """The lines at the end of longlora_table.md that say how its CSV was measured: {first word: line}."""
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    kept = {}
    for paragraph in reversed(old.rstrip().split("\n\n")):
        if not paragraph.startswith(("Measured", "Budget rows")):
            break
        kept[paragraph.split(" ", 1)[0]] = paragraph.strip()
    return dict(reversed(kept.items()))


def read_tables(results):
    """tables() of longlora.csv and longlora_cost.csv under results, each checked to be the study's."""
    return tables(*read_results(results))


def write_tables(cfg, results, footer, keep=False):
    """longlora_table.md from the CSVs under results; footer None keeps the file's own (--tables); keep: the
    whole study's line kept beside footer (a budget run's)."""
    path = results / "longlora_table.md"
    require(path.is_file() or not path.exists(), f"{path} is not a file")
    found_lines = footers(path)
    if footer is None:
        footer = "\n\n".join(found_lines.values())
    elif keep:  # the budget run's line replaces the earlier one, the whole study's stays
        footer = "\n\n".join([*(line for word, line in found_lines.items() if word == "Measured"), footer])
    found = read_tables(results)
    text = render(found)
    write_output("results", path, lambda tmp: tmp.write_text(f"{text}\n\n{footer}\n", encoding="utf-8"))
    print(f"{text}\n\n{footer}\nwrote {path}")
    fill_generated(results, {name: table for name, (_, table) in found.items()})
    return found


if __name__ == "__main__":
    main()
