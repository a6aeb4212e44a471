"""A/B ratios for the model on nanoGPT's CPU recipe (4 layers, 4 heads, 128 dims, context 64, vocabulary 65,
bias off, random weights): model.py at git revision REV (with REV's positions.py and generation.py, loaded
beside this tree's) against this tree's, alternated in one process, medians; both must decode alike first.
Training beside learned: each scheme's step over learned's, paired round by round (geometric mean, 95% t
interval over the rounds' log ratios).

    python -m lab.perf.ab --against=REV                  # tokens/s of greedy decoding from one token
    python -m lab.perf.ab --against=REV --measure=train  # ms per optimizer step on 12 x 64 random tokens
"""

import sys

if not __package__:  # `python lab/perf/ab.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.perf.ab`")


import math
import statistics
import subprocess
import time
import types
from collections import namedtuple
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

import model as current
import positions
from generation import generate_cached
from lab.measure.paired import paired_difference
from lab.tables import markdown_table
from plumbing import hardware
from plumbing.cli import parse_flags, parse_list, threads_flag
from plumbing.errors import UserError, one_line_errors
from plumbing.fields import check_fields

ROOT = Path(__file__).resolve().parents[2]
PROG = "python -m lab.perf.ab"
MEASURES = ("decode", "train")
RECIPE = dict(block_size=64, n_layer=4, n_head=4, n_embd=128, vocab_size=65, bias=False, dropout=0.0)
Side = namedtuple("Side", "module generate")  # a model module, its generate_cached(model, idx, n, ...)


@dataclass
class ABConfig:
    against: str | None = None  # the git revision whose model.py runs against this tree's
    measure: str = "decode"  # decode (tokens/s) or train (ms per optimizer step)
    pos: str = "rope,sinusoidal,alibi,none"  # schemes, comma-separated
    new_tokens: int = 1024  # tokens generated per decoding run: 16 x block_size
    steps: int = 10  # optimizer steps per training round
    rounds: int = 5  # rounds of each side, alternated
    threads: str = threads_flag()

    def __post_init__(self):
        if self.against is None:
            raise UserError("give --against=REV, the git revision to compare this tree with", 2)
        if self.new_tokens < 2 or min(self.steps, self.rounds) < 1:
            raise UserError("--new_tokens must be >= 2, --steps and --rounds >= 1", 2)
        self.schemes = parse_list("pos", self.pos, positions.POS_SCHEMES)
        check_fields(self)  # --threads' rule


def recipe_model(module, pos):
    torch.manual_seed(0)
    return module.GPT(module.GPTConfig(**RECIPE, pos=pos))


def side_at(revision):
    """REV's model.py and generate_cached (its generation.py's, else the method GPT.generate_cached): REV's
    files run as modules {stem}_at_revision in sys.modules (for dataclasses), importing each other."""
    loaded = {}  # stem: REV's module
    for stem in ("positions", "model", "generation"):
        git = ["git", "-C", str(ROOT), "show", f"{revision}:{stem}.py"]
        shown = subprocess.run(git, capture_output=True, text=True)
        if shown.returncode != 0 and stem == "model":
            why = f"git show found no model.py there ({shown.stderr.strip()})"
            raise UserError(f"--against={revision}: {why}", 2)
        if shown.returncode != 0:
            continue
        module = sys.modules[f"{stem}_at_revision"] = types.ModuleType(f"{stem}_at_revision")
        saved = {key: sys.modules[key] for key in loaded}  # positions and model: this tree's, imported above
        sys.modules.update(loaded)
        try:
            exec(compile(shown.stdout, f"{revision}:{stem}.py", "exec"), module.__dict__)
        finally:
            sys.modules.update(saved)
        loaded[stem] = module
    if "generation" not in loaded:
        return Side(loaded["model"], lambda model, *args, **kwargs: model.generate_cached(*args, **kwargs))
    return Side(loaded["model"], loaded["generation"].generate_cached)


def trainer(model, steps):
    """A function running `steps` optimizer steps of the CPU recipe on one fixed batch of 12 x 64 tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 65, (12, 65), generator=torch.Generator().manual_seed(0))
    x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # older model.py versions view the targets

    def run():
        for _ in range(steps):
            _, loss = model.train()(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def alternate(runs, rounds):
    """{name: [seconds of each round's call]}, each function called once per round, in turn."""
    seconds = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def compare_decoding(cfg, sides):
    """[(pos, REV's tok/s, this tree's tok/s)], both sides' greedy tokens from token 0 checked alike."""
    prompt, rows, n = torch.zeros(1, 1, dtype=torch.long), [], cfg.new_tokens
    for pos in cfg.schemes:
        samplers = {
            key: partial(side.generate, recipe_model(side.module, pos).eval(), prompt, n, temperature=0)
            for key, side in sides.items()
        }
        if not torch.equal(samplers["a"](), samplers["b"]()):
            raise SystemExit(f"{PROG}: {pos}: the two sides generate different tokens; nothing timed")
        seconds = alternate(samplers, cfg.rounds)
        rows.append((pos, *(n / statistics.median(seconds[key]) for key in "ab")))
    return rows


def compare_training(cfg, sides):
    """[(pos, REV's ms/step, this tree's ms/step)], medians, every scheme of both sides interleaved round by
    round; and {(side, pos): each round's ms/step}."""
    models = {
        (key, pos): recipe_model(side.module, pos) for key, side in sides.items() for pos in cfg.schemes
    }
    runs = {key: trainer(model, cfg.steps) for key, model in models.items()}
    for run in runs.values():
        run()  # warm-up: the first steps allocate the optimizer state
    ms = {key: [1e3 * s / cfg.steps for s in seconds] for key, seconds in alternate(runs, cfg.rounds).items()}
    return [(pos, *(statistics.median(ms[key, pos]) for key in "ab")) for pos in cfg.schemes], ms


def against(ms, reference):
    """'1.043x learned [1.028, 1.062]': the rounds' ms/step over the reference's, paired round by round."""
    if len(ms) < 2:
        return f"{ms[0] / reference[0]:.3f}x learned"
    mean, low, high = paired_difference([math.log(x) for x in ms], [math.log(x) for x in reference])
    return f"{math.exp(mean):.3f}x learned [{math.exp(low):.3f}, {math.exp(high):.3f}]"


def main(argv=None):
    values = parse_flags(argv, PROG, __doc__, [("comparison", ABConfig, None)], choices={"measure": MEASURES})
    with one_line_errors(PROG):
        cfg = ABConfig(**values)
        sides = {"a": side_at(cfg.against), "b": Side(current, generate_cached)}
    print(hardware.use_threads(cfg.threads, "cpu"))
    decode = cfg.measure == "decode"
    work = f"{cfg.new_tokens} new tokens" if decode else f"{cfg.steps} steps of 12 x 64 tokens"
    runs = f"{work} per run, median of {cfg.rounds} alternated runs"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {runs}")
    unit = "tok/s" if decode else "ms/step"
    columns = ["pos", f"model.py at {cfg.against} {unit}", f"this tree {unit}", "this tree's speed-up"]
    if decode:
        with one_line_errors(PROG, errors=()), hardware.out_of_memory("lower --new_tokens"):
            rows = compare_decoding(cfg, sides)
        cells = [[pos, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}x"] for pos, a, b in rows]
    else:
        rows, ms = compare_training(cfg, sides)
        cells = [[pos, f"{a:.1f}", f"{b:.1f}", f"{a / b:.2f}x"] for pos, a, b in rows]
        if "learned" in cfg.schemes and len(rows) > 1:  # among several schemes: each against learned's too
            for cell, pos in zip(cells, cfg.schemes):
                cell[1:3] = [
                    f"{cell[i]} ({against(ms[key, pos], ms[key, 'learned'])})"
                    for i, key in ((1, "a"), (2, "b"))
                ]
    print("\n" + markdown_table(columns, cells))
    return rows


if __name__ == "__main__":
    with one_line_errors(PROG, errors=()):  # Ctrl-C while measuring: status 130, no traceback
        main()
