"""The docs' sentences that carry a measured number: each written here from the committed CSVs, with its 95%
interval beside it, into the generated blocks named finding_* of docs/ and the README. No run is trained.

    python -m lab.experiments.findings      # rewrite every finding_* block from docs/*.csv

A difference is paired (lab/measure/paired.py) where both sides share the data and the model seed by seed, and
Welch's unpaired interval where they do not (two searches of one model, runs from two bases); each sentence
says which. tests/test_docs_tables.py checks that every block is what this module makes of the CSVs."""

import sys

if not __package__:  # `python lab/experiments/findings.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.experiments.findings`")

import argparse
import math
import textwrap
from functools import cache

from lab.experiments import extrapolation_results as study
from lab.experiments import longlora_results as longlora
from lab.experiments import longrope_ablation_results as ablation
from lab.experiments.runs import Values, paired_sides, read_rows
from lab.measure.paired import paired_difference, verdict, welch_difference
from lab.tables import fill_generated
from plumbing.errors import UserError, one_line_errors
from plumbing.report import ROOT

PROG = "python -m lab.experiments.findings"
DOCS = ROOT / "docs"
LONG = longlora.LONG


def interval(a, b, points, welch=False):
    """'+39 [+16, +61] points' (points: rates in percentage points) or '-0.310 [-0.330, -0.290]': a "
    "- b, paired
    over the keys both hold (Values each), or Welch's over all values of each."""
    mean, low, high = (welch_difference if welch else paired_difference)(*paired_sides(a, b, welch))
    near = [abs(100 * v) for v in (low, high) if 0 < abs(100 * v) < 1]  # an end near 0 keeps its digit
    places = max(1, -math.floor(math.log10(min(near)))) if near else 0
    show = (lambda v: f"{100 * v:+.{places}f}") if points else (lambda v: f"{v:+.3f}")
    return f"{show(mean)} [{show(low)}, {show(high)}]{' points' if points else ''}"


def word(a, b, points, welch=False):
    """The word the interval of a - b supports, retrieval higher-better, loss lower-better."""
    _, low, high = (welch_difference if welch else paired_difference)(*paired_sides(a, b, welch))
    return verdict(low, high, points)


rate = lambda values: f"{100 * values.mean():.0f}%"  # the mean of rates (Values), as a percentage


@cache
def longlora_rows():
    return longlora.read_results(DOCS)


def lora(setting, task, steps=1000, phase="report"):
    """Values {seed: value} at 4 T of one LongLoRA setting (steps None: at any)."""
    values = longlora.seed_values(longlora_rows()[0], setting, task, LONG, steps, phase)
    at = f", {steps} steps" if steps else ""
    where = f"{DOCS / 'longlora.csv'}: setting {setting} ({phase} rows, {task} at {LONG} tokens{at})"
    return Values(values, where, longlora.PROG)


def only_row(rows, file, **match):
    """The first row of `file` holding every value of `match`; none is a one-line UserError."""
    found = next((r for r in rows if all(r[k] == str(v) for k, v in match.items())), None)
    if found is None:
        wanted = ", ".join(f"{k} {v}" for k, v in match.items())
        raise UserError(f"{DOCS / file}: no row of {wanted}; `{longlora.PROG}` rebuilds it", 2)
    return found


def learning_rate(setting):
    return only_row(longlora_rows()[0], "longlora.csv", phase="report", setting=setting)["learning_rate"]


def attention_gflops(method):
    """longlora_cost.csv's attention GFLOPs per step of a method at 4 T."""
    return float(only_row(longlora_rows()[1], "longlora_cost.csv", method=method, tokens=LONG)[COST_FLOPS])


COST_FLOPS = longlora.COST[3]
G2 = f"none_s2_g{2 * longlora.T}"


def s2_group_lesson():
    """docs/lesson.md: what groups of 2 T recover, against groups of T and against full attention."""
    g2, s2, full = (lora(s, "passkey") for s in (G2, "none_s2", "none_full"))
    return (
        f"Groups of 2 T instead of T, without scaling, retrieve {interval(g2, s2, True)} more than "
        f"groups of T at 4 T, and still {interval(g2, full, True)} fewer than full attention (groups of T: "
        f"{interval(s2, full, True)}; paired over the seeds): they recover {recovered(g2, s2, full):.0%} of "
        "the gap in the mean."
    )


def recovered(g2, s2, full):
    """The share of full attention's lead over groups of T that groups of 2 T close, in the seeds' means."""
    return (g2.mean() - s2.mean()) / (full.mean() - s2.mean())


def s2_group_study():
    """docs/extrapolation.md: the G = 2 T ablation, and what it varied besides the group."""
    g2, s2, full = (lora(s, "passkey") for s in (G2, "none_s2", "none_full"))
    loss = interval(lora(G2, "loss"), lora("none_s2", "loss"), False)
    flops = attention_gflops("s2_g128") / attention_gflops("s2")
    return (
        f"- **Groups of 2 T: {recovered(g2, s2, full):.0%} of the gap, with more than the group varied.** "
        f"With groups of 2 T (`{G2}` against `none_s2`): {interval(g2, s2, True)} and {loss} in loss; "
        f"against full attention still {interval(g2, full, True)}. That run varied more than the group: it "
        f"ran only without scaling (no PI), at its own best rate ({learning_rate(G2)} against `none_s2`'s "
        f"{learning_rate('none_s2')} and `pi_s2`'s {learning_rate('pi_s2')}), and G = L / 2 costs "
        f"{flops:.0f} x the attention FLOPs of G = L / 4 (the cost table). Neither the depth, the "
        f"width nor the data was varied. LongLoRA trains its 4 x extensions with G = L / 4 = T, as here, and "
        "reports S²-Attn "
        "close to full attention there; the scale of this study (0.8M parameters, T = 64) is the likelier "
        "cause of the gap, and no run here tests it."
    )


def lora_budget():
    """docs/extrapolation.md: LoRA's test loss at 1,000 steps (the report's base) and at 8,000 (the budget's
    base): Welch, as the two come from two trainings of the base."""
    short, long = lora("pi_s2_lora", "loss"), lora("pi_s2_lora", "loss", 8000, "budget")
    base = lora("base", "loss", steps=None)
    return (
        f"- **LoRA trained longer, across two bases: {word(long, short, False, welch=True)} in loss.** "
        f"LoRA's test loss at 4 T is {long.mean():.3f} after 8,000 steps (the budget "
        f"rows) against {short.mean():.3f} after 1,000 (the report's) and the base's "
        f"{base.mean():.3f}: 8,000 against 1,000 steps {interval(long, short, False)} by "
        "Welch's interval, unpaired, as the two come from two trainings of the base. That the "
        "adapters fit the "
        "grouped pattern of training and lose under the full attention they are evaluated with is a "
        "hypothesis: the training logs that would show it are not kept in a CSV."
    )


def pi_full_budget():
    """docs/extrapolation.md's limits: pi_full's retrieval and loss between its budgets, paired over seeds."""
    curve = {n: lora("pi_full", "passkey", n, "budget") for n in (1000, 2000, 4000, 8000, 16000)}
    loss = {n: lora("pi_full", "loss", n, "budget") for n in (4000, 8000, 16000)}
    s2 = {n: lora("pi_s2", "passkey", n, "budget") for n in (250, 500, 1000, 2000, 4000, 8000)}
    s2_loss = {n: lora("pi_s2", "loss", n, "budget") for n in (4000, 8000)}
    step = lambda values, a, b, points: (
        f"{interval(values[a], values[b], points)} from {b:,} to {a:,} ({word(values[a], values[b], points)})"
    )
    gains = ", ".join(step(curve, a, b, True) for a, b in ((4000, 2000), (8000, 4000), (16000, 8000)))
    losses = ", ".join(step(loss, a, b, False) for a, b in ((8000, 4000), (16000, 8000)))
    low, high = min(min(v.measured()) for v in s2.values()), max(max(v.measured()) for v in s2.values())
    return (
        f"The budget table's `pi_full` retrieves {rate(curve[1000])} at 1,000 steps and "
        f"{rate(curve[16000])} at 16,000 steps; between its budgets past 2,000, paired over the "
        f"seeds: retrieval {gains}; the loss {losses}. `pi_s2` retrieves {100 * low:.0f} to "
        f"{100 * high:.0f}% in every seed at every budget to 8,000 steps, its loss "
        f"{step(s2_loss, 8000, 4000, False)}."
    )


@cache
def longrope_study(task):
    cfg = study.StudyConfig(task=task, schemes=["rope"], longrope=True)
    per_seed, trained = study.read_study(cfg)
    return cfg, per_seed, min(trained.values())


def study_values(cfg, per_seed, block_size, side):
    """Values {seed: value} of a side of the study cfg names (read_study's per_seed and T)."""
    where = (
        f"{ROOT / cfg.results / study.results_name(cfg)}.csv: {side.run} {side.method} at {side.multiple} T"
    )
    values = study.side_values(per_seed, side, block_size, cfg.task == "loss")
    return Values(values, where, "python -m lab.experiments.extrapolation (its flags, without --tables)")


def side(task, run, method, multiple):
    return study_values(*longrope_study(task), study.Side(run, method, multiple))


def zero_shot(task, formula):
    """LongRoPE's searched factors and a formula's, zero-shot at 4 T: ({seed: value}, {seed: value})."""
    return side(task, "rope", "longrope", 4), side(task, "rope", formula, 4)


def longrope_retrieval():
    """docs/extrapolation.md: LongRoPE zero-shot against the formulas at 4 T, for retrieval."""
    (searched, yarn), (_, llama3) = zero_shot("passkey", "yarn"), zero_shot("passkey", "llama3")
    return (
        f"- **At the searched length, searched factors against the formulas: {word(searched, yarn, True)} "
        f"with YaRN, {word(searched, llama3, True)} with llama3.** At 4 T, LongRoPE zero-shot against YaRN: "
        f"{interval(searched, yarn, True)}; against llama3: {interval(searched, llama3, True)} (paired over "
        f"the {len(searched)} training seeds). A level interval shows no difference, and no equivalence "
        "either: it holds differences as large as its ends."
    )


def progressive(readme=False):
    """docs/extrapolation.md (and the README): LongRoPE's progressive extension to 8 T, against its matched
    control first (the same fine-tune's weights, RoPE's fast pairs kept) and then YaRN's x4 fine-tune run
    past its factor."""
    x8, tuned = side("loss", study.LR + "_x8", "longrope", 8), side("loss", study.LR, "longrope", 8)
    control, yarn = side("loss", *study.CONTROL, 8), side("loss", *study.YARN_FT, 8)
    matched, past = interval(x8, control, False), interval(x8, yarn, False)
    if readme:
        return (
            f"searched again at 8 T after a fine-tune, {matched} nats against the plain control (the same "
            f"fine-tune with RoPE unscaled) at 8 T, and {past} against YaRN's x4 fine-tune, which runs "
            "past its factor there"
        )
    return (
        f"- **Progressive extension against its matched control: {word(x8, control, False)}.** Factors "
        f"searched at 8 T on the fine-tuned model change its loss at 512 by "
        f"{interval(x8, tuned, False)}, and "
        f"end {matched} against the plain control, which keeps RoPE's fast pairs and is fine-tuned as the "
        f"others are. Against YaRN's fine-tune, {past}; but that fine-tune's factor is 4, so at 8 T it runs "
        f"past it, and the plain control alone is {interval(control, yarn, False)} against it there: most of "
        "that margin is YaRN's fine-tune past its factor, not the search."
    )


def ablation_rows():
    return read_rows(DOCS / "longrope_passkey_x4.csv", ablation.COLUMNS, ablation.PROG, *ablation.NUMBERS)


def variant(name, task):
    """Values {(checkpoint, search seed): value} of one variant at the ablation's longest length."""
    rows = ablation_rows()
    longest = max(int(r["length"]) for r in rows)
    where = f"{DOCS / 'longrope_passkey_x4.csv'}: variant {name} ({task} at {longest} tokens)"
    return Values(ablation.cells(rows, name, task, longest), where, ablation.PROG)


def fitness(readme=False):
    """docs/extrapolation.md (and the README): the passkey fitness against the loss fitness, Welch's
    interval over the search seeds of one model, with the loss fitness's limit on passkey data."""
    passkey, loss = variant("passkey", "passkey"), variant("loss", "passkey")
    loss_loss = interval(variant("passkey", "loss"), variant("loss", "loss"), False, welch=True)
    n = len(passkey)
    if readme:
        return (
            f"on one passkey model, over {n} search seeds each, a passkey fitness retrieves "
            f"{interval(passkey, loss, True, welch=True)} more than the paper's loss fitness (Welch's "
            "interval; the loss fitness there scores samples of 65 characters only)"
        )
    yarn = variant("yarn", "passkey")
    return (
        f"- **A passkey fitness against the loss fitness: {word(passkey, loss, True, True)} for retrieval, "
        f"{interval(passkey, loss, True, welch=True)} at 4 T** (Welch's interval over the {n} "
        f"search seeds of each, unpaired: their seed numbers share nothing), at a loss {loss_loss} "
        f"({word(variant('passkey', 'loss'), variant('loss', 'loss'), False, True)}). The loss fitness, the "
        f"paper's, lowers the loss and leaves retrieval level with YaRN's formula ("
        f"{interval(loss, yarn, True)}, paired over the searches of the one model). {n} search seeds on one "
        "model: a finding about this model's searches, not over training seeds. And on passkey data the loss "
        "fitness cannot reward retrieval: it reads data/passkey's train.bin, samples of 65 characters joined "
        "end to end, so no window of L = 256 depends on more than 65 tokens back, where the released search "
        "scores long held-out books."
    )


def n_hat():
    """docs/extrapolation.md: n-hat fixed at 0 and at 8 against searched, Welch's interval."""
    searched = {t: variant("loss", t) for t in ("passkey", "loss")}
    cells, words = {}, []
    for name in ("loss_nhat0", "loss_nhat8"):
        fixed = {t: variant(name, t) for t in ("passkey", "loss")}
        cells[name] = (
            f"retrieval {interval(fixed['passkey'], searched['passkey'], True, welch=True)}, loss "
            f"{interval(fixed['loss'], searched['loss'], False, welch=True)}"
        )
        verdicts = [word(fixed[t], searched[t], t == "passkey", welch=True) for t in ("passkey", "loss")]
        words.append(f"{'/'.join(dict.fromkeys(verdicts))} fixed at {name.removeprefix('loss_nhat')}")
    return (
        f"- **n-hat: {' and '.join(words)}.** Against searched (Welch's intervals over the search seeds), "
        f"fixed at 0: {cells['loss_nhat0']}; fixed at 8: {cells['loss_nhat8']}. The loss fitness's limit on "
        "passkey data (above) holds here too."
    )


@cache
def base_study(task):
    cfg = study.StudyConfig(task=task)
    per_seed, trained = study.read_study(cfg)
    return cfg, per_seed, min(trained.values())


def rope_loss_against_retrieval():
    """docs/lesson.md: plain RoPE's loss past T against its retrieval, per training seed."""
    hits = lambda m: study_values(*base_study("passkey"), study.Side("rope", "plain", m))
    losses = {m: study_values(*base_study("loss"), study.Side("rope", "plain", m)) for m in (1, 2)}
    first = study.FIRST_SEED
    rise = losses[2][first] / losses[1][first] - 1
    at = {m: hits(m) for m in (1, 2, 4)}
    others = lambda m: " and ".join(f"{100 * v:.2g}%" for s, v in sorted(at[m].items()) if s != first)
    return (
        f"- Plain RoPE's loss rises only {rise:.0%} from T to 2 T (seed {first}), yet its retrieval "
        f"falls from "
        f"{at[1][first]:.0%} to {at[2][first]:.0%} ({others(2)} in the two other training seeds), and to "
        f"{at[4][first]:.0%} ({others(4)}) at 4 T."
    )


def readme_lengths():
    """The README's sentence on LongLoRA and LongRoPE."""
    s2, full = lora("pi_s2", "passkey"), lora("pi_full", "passkey")
    yarn = lora("yarn_full", "passkey")
    flops = attention_gflops("full") / attention_gflops("s2")
    (searched, formula), (hits, hits_yarn) = zero_shot("loss", "yarn"), zero_shot("passkey", "yarn")
    return (
        f"S²-Attn divides attention's FLOPs by {flops:.0f}, but with PI no S²-Attn fine-tune retrieves a key "
        f"({interval(s2, full, True)} against full attention at 4 T), and YaRN in place of PI adds "
        f"{interval(yarn, full, True)}. LongRoPE's factors, searched for the model on its train "
        "split (`python -m lab.experiments.longrope`), change the loss against YaRN zero-shot at the length "
        "searched by "
        f"{interval(searched, formula, False)} nats and, {progressive(readme=True)}; for passkey retrieval "
        f"they are level with YaRN ({interval(hits, hits_yarn, True)}), and {fitness(readme=True)}. Each "
        f"interval is 95%, paired over {len(searched)} training seeds unless named Welch's "
        "(docs/extrapolation.md, LongRoPE and LongLoRA)."
    )


FINDINGS = {
    "finding_s2_group_lesson": s2_group_lesson,
    "finding_s2_group_study": s2_group_study,
    "finding_lora_budget": lora_budget,
    "finding_pi_full_budget": pi_full_budget,
    "finding_longrope_retrieval": longrope_retrieval,
    "finding_progressive": progressive,
    "finding_fitness": fitness,
    "finding_n_hat": n_hat,
    "finding_rope_loss_against_retrieval": rope_loss_against_retrieval,
    "finding_readme_lengths": readme_lengths,
}


def wrap(text):
    """The page's width: a bullet's lines indented under it; numbers such as -0.192 never split."""
    indent = "  " if text.startswith("- ") else ""
    return textwrap.fill(text, 110, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def findings():
    """{block name: its text} of every finding_* block, from docs/*.csv."""
    return {name: wrap(make()) for name, make in FINDINGS.items()}


def main(argv=None):
    argparse.ArgumentParser(prog=PROG, description=__doc__).parse_args(argv)  # no flags: --help
    with one_line_errors(PROG):
        fill_generated(DOCS, findings())


if __name__ == "__main__":
    main()
