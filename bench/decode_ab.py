"""
Where cached decoding's time goes, as two A/B ratios measured in one process (runs alternated, medians), so
that the machine's drift reaches both sides alike. Random weights; greedy, so the two sides must give the
same tokens, which is checked before anything is timed.

    python bench/decode_ab.py --against=5af28a4           # model.py at that git revision vs the working tree
    python bench/decode_ab.py --module_free                # generate_cached vs a loop that calls no nn.Module

--against=REV: model.py as committed at REV (loaded from `git show`, beside this tree's) against this tree's
generate_cached, per --pos: what a change to model.py bought.

--module_free: this tree's generate_cached against the same transformer written as a plain loop of torch
functions over the model's own weights (F.linear, F.layer_norm, SDPA, index_copy_ into a preallocated cache)
that calls no module and keeps no per-step bookkeeping. It supports pos=none only (no position signal to
apply), and exists to measure how much of a decode step is Python and nn.Module overhead rather than arithmetic.
The model is nanoGPT's CPU recipe (4 layers, 4 heads, 128 dims, vocabulary 65, bias off).
"""

import statistics
import subprocess
import sys
import time
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/decode_ab.py`: the modules live one folder up
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import model as current  # noqa: E402
from cli import UsageError, one_line_errors, parse_flags  # noqa: E402


@dataclass
class DecodeABConfig:
    against: str | None = None  # a git revision: its model.py against this tree's
    module_free: bool = False  # this tree's generate_cached against a loop that calls no nn.Module (pos=none)
    pos: str = "rope,sinusoidal,alibi,none"  # schemes, comma-separated (--against only)
    new_tokens: int = 1024  # tokens generated per run: 16 x block_size
    rounds: int = 5  # runs of each side, alternated
    threads: int = 0  # torch threads; 0 leaves torch's default

    def __post_init__(self):
        if (self.against is None) == (not self.module_free):
            raise UsageError("give exactly one of --against=REV and --module_free")
        unknown = set(self.pos.split(",")) - set(current.POS_SCHEMES)
        if unknown:
            raise UsageError(f"--pos: unknown {', '.join(sorted(unknown))}; choose from {', '.join(current.POS_SCHEMES)}")
        if self.new_tokens < 2 or self.rounds < 1 or self.threads < 0:
            raise UsageError("--new_tokens must be >= 2, --rounds >= 1 and --threads >= 0")


def recipe_model(module, pos):
    torch.manual_seed(0)
    config = module.GPTConfig(block_size=64, n_layer=4, n_head=4, n_embd=128, vocab_size=65, bias=False,
                              dropout=0.0, pos=pos)
    return module.GPT(config).eval()


def model_at(revision):
    """The model module as committed at `revision` (this repository's own history)."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:model.py"], capture_output=True, text=True)
    if source.returncode != 0:
        raise UsageError(f"--against={revision}: git show found no model.py there ({source.stderr.strip()})")
    module = sys.modules.setdefault("model_at_revision", types.ModuleType("model_at_revision"))
    exec(compile(source.stdout, f"{revision}:model.py", "exec"), module.__dict__)
    return module


@torch.inference_mode()
def module_free_generate(model, n_new):
    """Greedy decoding from token 0 with the model's weights and no module calls (pos=none, bias off)."""
    cfg = model.config
    B, C, n_head = 1, cfg.n_embd, cfg.n_head
    layers = [(b.ln_1.weight, b.attn.c_attn.weight, b.attn.c_proj.weight, b.ln_2.weight, b.mlp.c_fc.weight,
               b.mlp.c_proj.weight) for b in model.transformer.h]
    wte, ln_f = model.transformer.wte.weight, model.transformer.ln_f.weight
    keys = [torch.zeros(B, n_head, n_new, C // n_head) for _ in layers]
    values = [torch.zeros_like(k) for k in keys]
    token, slot, out = torch.zeros(B, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), []
    for t in range(n_new):
        x = F.embedding(token, wte)
        for (ln_1, attn, proj, ln_2, fc, fc_proj), k_cache, v_cache in zip(layers, keys, values):
            q, k, v = F.linear(F.layer_norm(x, (C,), ln_1), attn).view(B, 3, n_head, 1, C // n_head).unbind(1)
            k_cache.index_copy_(2, slot, k)
            v_cache.index_copy_(2, slot, v)
            y = F.scaled_dot_product_attention(q, k_cache[:, :, : t + 1], v_cache[:, :, : t + 1])
            x = x + F.linear(y.view(B, 1, C), proj)
            x = x + F.linear(F.gelu(F.linear(F.layer_norm(x, (C,), ln_2), fc), approximate="tanh"), fc_proj)
        token = F.linear(F.layer_norm(x, (C,), ln_f), wte)[:, -1].argmax(-1, keepdim=True)
        out.append(token)
        slot += 1
    return torch.cat(out, dim=1)


def alternate(samplers, n_new, rounds):
    """{name: tokens/s}, the median over `rounds` runs of each sampler, taken in turn."""
    seconds = {name: [] for name in samplers}
    for _ in range(rounds):
        for name, sample in samplers.items():
            start = time.perf_counter()
            sample(n_new)
            seconds[name].append(time.perf_counter() - start)
    return {name: n_new / statistics.median(s) for name, s in seconds.items()}


def cached(model):
    prompt = torch.zeros(1, 1, dtype=torch.long)
    return lambda n: model.generate_cached(prompt, n, temperature=0)[:, 1:]


def main(argv=None):
    values = parse_flags(argv, "bench/decode_ab.py", __doc__, [("comparison", DecodeABConfig, None)])
    with one_line_errors("bench/decode_ab.py"):
        cfg = DecodeABConfig(**values)
        old_module = model_at(cfg.against) if cfg.against else None
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cfg.new_tokens} new tokens, "
          f"median of {cfg.rounds} alternated runs")
    rows = []
    for pos in ["none"] if cfg.module_free else cfg.pos.split(","):
        model = recipe_model(current, pos)
        if cfg.module_free:
            names = ("generate_cached", "module-free loop")
            samplers = dict(zip(names, (cached(model), lambda n: module_free_generate(model, n))))
        else:
            names = (f"model.py at {cfg.against}", "this tree")
            samplers = dict(zip(names, (cached(recipe_model(old_module, pos)), cached(model))))
        first, second = (sample(cfg.new_tokens) for sample in samplers.values())
        if not torch.equal(first, second):
            raise SystemExit(f"bench/decode_ab.py: {pos}: the two sides generate different tokens; no timing")
        speed = alternate(samplers, cfg.new_tokens, cfg.rounds)
        rows.append((pos, *(speed[n] for n in names)))
    print(f"\n| pos | {names[0]} tok/s | {names[1]} tok/s | ratio |\n|---|---|---|---|")
    for pos, a, b in rows:
        print(f"| {pos} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")
    return rows


if __name__ == "__main__":
    main()
