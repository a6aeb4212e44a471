"""
A/B ratios for model.py, measured in one process (the two sides alternated, medians), so that the machine's
drift reaches both sides alike: what a change to model.py bought, and where a decode step's time goes.
The model is nanoGPT's CPU recipe (4 layers, 4 heads, 128 dims, context 64, vocabulary 65, bias off), random
weights.

    python -m perf.ab --against=5af28a4                    # decoding: model.py at that git revision vs this tree
    python -m perf.ab --against=e752f8b --measure=train    # training steps, the same comparison
    python -m perf.ab --module_free                        # decoding: generate_cached vs no nn.Module at all

--against=REV: model.py as committed at REV (loaded from `git show`, beside this tree's, with REV's generation.py
where it has one) against this tree's, per --pos; the last column is this tree's speed over the other side's.
--measure=decode: tokens/s of greedy generate_cached from one token, the two sides checked to give the same
tokens before anything is timed.
--measure=train: ms per optimizer step (forward, backward, gradient clipping at 1.0, AdamW) on a batch of
12 x 64 random tokens, --steps per round, every scheme of both sides interleaved; with learned among the
schemes, each one's step time over learned's too.

--module_free: this tree's generate_cached against the same transformer written as a plain loop of torch
functions over the model's own weights (F.linear, F.layer_norm, SDPA, index_copy_ into a preallocated cache)
that calls no module and keeps no per-step bookkeeping (each scheme's position arithmetic written out: the
sinusoidal table, RoPE's rotation, ALiBi's bias), per --pos but learned. Its logits at every step are checked
against the model's forward first (on a copy with sharper attention, where positions move them); then it
measures how much of a decode step is Python and nn.Module overhead.
"""

import copy
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

import model as current
from generation import generate_cached
from plumbing.cli import UsageError, one_line_errors, parse_flags, parse_list
from plumbing.report import markdown_table

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m perf.ab"

MEASURES = ("decode", "train")
TRAIN_BATCH = (12, 64)  # the CPU recipe's batch_size x block_size


@dataclass
class ABConfig:
    against: str | None = None  # a git revision: its model.py against this tree's
    module_free: bool = False  # this tree's generate_cached against a loop that calls no nn.Module
    measure: str = "decode"  # what --against compares: decode (tokens/s) or train (ms per optimizer step)
    pos: str = "rope,sinusoidal,alibi,none"  # schemes, comma-separated
    new_tokens: int = 1024  # tokens generated per decoding run: 16 x block_size
    steps: int = 10  # optimizer steps per training round
    rounds: int = 5  # rounds of each side, alternated
    threads: int = 0  # torch threads; 0 leaves torch's default

    def __post_init__(self):
        if (self.against is None) == (not self.module_free):
            raise UsageError("give exactly one of --against=REV and --module_free")
        if self.module_free and self.measure != "decode":
            raise UsageError("--module_free measures decoding only (--measure=decode)")
        # self.schemes checks the names: a one-line error now, not after a revision is loaded
        if "learned" in self.schemes and self.module_free:
            raise UsageError("--module_free decodes past no position table: give --pos among sinusoidal, rope, "
                             "alibi, none")
        if self.new_tokens < 2 or min(self.steps, self.rounds) < 1 or self.threads < 0:
            raise UsageError("--new_tokens must be >= 2, --steps and --rounds >= 1, --threads >= 0")

    @property
    def schemes(self):
        return parse_list("pos", self.pos, current.POS_SCHEMES)


def recipe_model(module, pos):
    torch.manual_seed(0)
    config = module.GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, vocab_size=65, bias=False,
                              dropout=0.0, pos=pos)
    return module.GPT(config)


class Side(NamedTuple):
    """One side of a comparison: a model module and the generate_cached(model, idx, max_new_tokens, ...) for it."""
    module: types.ModuleType
    generate: Callable


THIS_TREE = Side(current, generate_cached)


def git_show(revision, path):
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], capture_output=True, text=True)


def module_from_source(name, source, origin):
    """A fresh module `name` running `source`, registered in sys.modules (dataclasses look their module up there)."""
    module = sys.modules[name] = types.ModuleType(name)
    exec(compile(source, origin, "exec"), module.__dict__)
    return module


@contextmanager
def module_as(name, module):
    """sys.modules[name] is `module` inside the block, what it was before after it."""
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield
    finally:
        if saved is None:
            del sys.modules[name]
        else:
            sys.modules[name] = saved


def side_at(revision):
    """model.py as committed at `revision` (this repository's own history), and its cached generation: REV's
    generation.py where it has one, else the method GPT.generate_cached that came before it."""
    model_source = git_show(revision, "model.py")
    if model_source.returncode != 0:
        raise UsageError(f"--against={revision}: git show found no model.py there ({model_source.stderr.strip()})")
    module = module_from_source("model_at_revision", model_source.stdout, f"{revision}:model.py")
    generation_source = git_show(revision, "generation.py")
    if generation_source.returncode != 0:
        return Side(module, lambda model, *args, **kwargs: model.generate_cached(*args, **kwargs))
    # its `from model import ...` runs now, at the top of the source, and must get REV's model.py, not this tree's
    with module_as("model", module):
        generation = module_from_source("generation_at_revision", generation_source.stdout,
                                        f"{revision}:generation.py")
    return Side(module, generation.generate_cached)


@torch.inference_mode()
def module_free_generate(model, n_new, logits=None):
    """Greedy decoding from token 0 with the model's weights and position tables and no module calls (bias off).
    The position schemes' arithmetic is written out with model.py's own functions: the sinusoidal table added to
    the scaled token embedding, RoPE's rotation of q and k, ALiBi's bias over the keys so far. logits: a list to
    which each step's logits (B, vocab) are appended."""
    cfg, pos = model.config, model.transformer.wpe
    B, C, n_head = 1, cfg.n_embd, cfg.n_head
    pos.reserve(n_new)
    layers = [(b.ln_1.weight, b.attn.c_attn.weight, b.attn.c_proj.weight, b.ln_2.weight, b.mlp.c_fc.weight,
               b.mlp.c_proj.weight) for b in model.transformer.h]
    wte, ln_f = model.transformer.wte.weight, model.transformer.ln_f.weight
    keys = [torch.zeros(B, n_head, n_new, C // n_head) for _ in layers]
    values = [torch.zeros_like(k) for k in keys]
    token, slot, out = torch.zeros(B, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), []
    for t in range(n_new):
        x = F.embedding(token, wte)
        if cfg.pos == "sinusoidal":
            x = x * pos.token_scale + pos.table[slot]
        rope = (pos.cos[slot], pos.sin[slot]) if cfg.pos == "rope" else None
        bias = current.alibi_bias_at(pos.slopes, slot, torch.arange(t + 1))[None] if cfg.pos == "alibi" else None
        for (ln_1, attn, proj, ln_2, fc, fc_proj), k_cache, v_cache in zip(layers, keys, values):
            qkv = F.linear(F.layer_norm(x, (C,), ln_1), attn).view(B, 3, n_head, 1, C // n_head)
            q, k, v = qkv.unbind(1) if rope is None else (*current.apply_rope(qkv[:, :2], *rope).unbind(1), qkv[:, 2])
            k_cache.index_copy_(2, slot, k)
            v_cache.index_copy_(2, slot, v)
            y = F.scaled_dot_product_attention(q, k_cache[:, :, : t + 1], v_cache[:, :, : t + 1], attn_mask=bias)
            x = x + F.linear(y.view(B, 1, C), proj)
            x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), ln_2), fc), approximate="tanh"), fc_proj)
        step_logits = F.linear(F.layer_norm(x, (C,), ln_f), wte)[:, -1]
        if logits is not None:
            logits.append(step_logits)
        token = step_logits.argmax(-1, keepdim=True)
        out.append(token)
        slot += 1
    return torch.cat(out, dim=1)


def module_free_matches_or_exit(pos, model, n_new):
    """The module-free loop's logits at every step must be the model's own forward over the same tokens, to 1e-4 of
    their scale. Checked on a copy whose matrices are 10x larger: at GPT-2's initialisation attention is so flat
    that the logits do not move (by 1e-6) when RoPE or ALiBi is left out, so the model as timed could not tell."""
    sharp = copy.deepcopy(model)
    with torch.no_grad():
        for weight in sharp.parameters():
            if weight.dim() == 2:
                weight.mul_(10.0)
    logits = []
    tokens = module_free_generate(sharp, n_new, logits)
    with torch.inference_mode():
        expected = sharp(torch.cat([torch.zeros(1, 1, dtype=torch.long), tokens[:, :-1]], dim=1))[0]
    error = (torch.stack(logits, dim=1) - expected).abs().max() / expected.abs().max()
    if not error < 1e-4:
        raise SystemExit(f"{PROG}: {pos}: the module-free loop's logits are not the model's; nothing timed")


def cached_sampler(side, model, n_new):
    """A function generating n_new greedy tokens from token 0 with the side's KV cache (-> the new tokens)."""
    prompt = torch.zeros(1, 1, dtype=torch.long)
    return lambda: side.generate(model.eval(), prompt, n_new, temperature=0)[:, 1:]


def trainer(model, steps):
    """A function running `steps` optimizer steps of the CPU recipe on one batch of random tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 65, (TRAIN_BATCH[0], TRAIN_BATCH[1] + 1), generator=torch.Generator().manual_seed(0))
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
    """{name: median seconds of one call}, each function called once per round, in turn."""
    seconds = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def same_tokens_or_exit(pos, samplers):
    first, second = (sample() for sample in samplers)
    if not torch.equal(first, second):
        raise SystemExit(f"{PROG}: {pos}: the two sides generate different tokens; nothing timed")


def compare_decoding(cfg, old_side):
    """[(pos, side A tok/s, side B tok/s)], side B always this tree's generate_cached."""
    rows = []
    for pos in cfg.schemes:
        model = recipe_model(current, pos)
        if cfg.module_free:
            module_free_matches_or_exit(pos, model, cfg.new_tokens)
            side_a = lambda m=model: module_free_generate(m, cfg.new_tokens)
        else:
            side_a = cached_sampler(old_side, recipe_model(old_side.module, pos), cfg.new_tokens)
        samplers = {"a": side_a, "b": cached_sampler(THIS_TREE, model, cfg.new_tokens)}
        same_tokens_or_exit(pos, samplers.values())
        seconds = alternate(samplers, cfg.rounds)
        rows.append((pos, cfg.new_tokens / seconds["a"], cfg.new_tokens / seconds["b"]))
    return rows


def compare_training(cfg, old_side):
    """[(pos, REV ms/step, this tree's ms/step)], every scheme of both sides interleaved round by round."""
    schemes = cfg.schemes
    runs = {(side, pos): trainer(recipe_model(module, pos), cfg.steps)
            for side, module in (("a", old_side.module), ("b", current)) for pos in schemes}
    for run in runs.values():
        run()  # warm-up: the first steps allocate the optimizer state
    seconds = alternate(runs, cfg.rounds)
    return [(pos, *(1e3 * seconds[side, pos] / cfg.steps for side in "ab")) for pos in schemes]


def main(argv=None):
    values = parse_flags(argv, PROG, __doc__, [("comparison", ABConfig, None)], choices={"measure": MEASURES})
    with one_line_errors(PROG):
        cfg = ABConfig(**values)
        old_side = side_at(cfg.against) if cfg.against else None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    side_a = "module-free loop" if cfg.module_free else f"model.py at {cfg.against}"
    work = f"{cfg.new_tokens} new tokens" if cfg.measure == "decode" else f"{cfg.steps} steps of 12 x 64 tokens"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {work} per run, "
          f"median of {cfg.rounds} alternated runs")
    if cfg.measure == "decode":
        rows = compare_decoding(cfg, old_side)
        columns = ["pos", f"{side_a} tok/s", "this tree tok/s", "this tree's speed-up"]
        cells = [[pos, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}x"] for pos, a, b in rows]
    else:
        rows = compare_training(cfg, old_side)
        learned = {side: row[side] for row in rows if row[0] == "learned" for side in (1, 2)}
        vs_learned = lambda row, side: f" ({row[side] / learned[side]:.2f}x learned)" if learned else ""
        columns = ["pos", f"{side_a} ms/step", "this tree ms/step", "this tree's speed-up"]
        cells = [[row[0], f"{row[1]:.1f}{vs_learned(row, 1)}", f"{row[2]:.1f}{vs_learned(row, 2)}",
                  f"{row[1] / row[2]:.2f}x"] for row in rows]
    print("\n" + markdown_table(columns, cells))
    return rows


if __name__ == "__main__":
    main()
