"""
A/B ratios for the model (model.py, positions.py, generation.py) on nanoGPT's CPU recipe (4 layers, 4 heads,
128 dims, context 64, vocabulary 65, bias off, random weights): both sides alternated in one process, medians.

    python -m perf.ab --against=5af28a4                  # decoding: model.py at a git revision vs this tree
    python -m perf.ab --against=e752f8b --measure=train  # training steps, the same comparison
    python -m perf.ab --module_free                      # decoding: generate_cached vs no nn.Module at all
    python -m perf.ab --against=nanogpt --measure=train --pos=learned   # nanoGPT's structure vs this tree

--against=REV loads REV's model.py (with its positions.py and generation.py) from git beside this tree's.
Decoding: tokens/s of greedy decoding from one token, both sides checked to give the same tokens. Training:
ms per optimizer step on 12 x 64 random tokens, every scheme of both sides interleaved. --module_free: the
transformer as a plain loop of torch functions over the model's weights, checked against its logits: how
much of a decode step is Python and nn.Module overhead. --against=nanogpt: nanoGPT's structure (split q, k,
v; exact GELU) with this tree's weights; with --nanogpt_gelu=tanh it must match this tree's network to 1e-5.
"""

import copy
import statistics
import subprocess
import sys
import time
import types
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import model as current
import positions
from generation import generate_cached
from plumbing import hardware
from plumbing.cli import one_line_errors, parse_flags, parse_list
from plumbing.errors import UserError
from plumbing.memory import check_generation_memory
from plumbing.report import markdown_table

ROOT = Path(__file__).resolve().parents[1]
PROG = "python -m perf.ab"
RECIPE = dict(block_size=64, n_layer=4, n_head=4, n_embd=128, vocab_size=65, bias=False, dropout=0.0)
NANOGPT = "nanogpt"  # --against's reserved word
NANOGPT_GELUS = ("exact", "tanh")  # nanoGPT's erf GELU, or GPT-2's (this tree's) tanh one


@dataclass
class ABConfig:
    against: str | None = None  # a git revision, or nanogpt: nanoGPT's structure, training only
    module_free: bool = False  # this tree's generate_cached against a loop that calls no nn.Module
    measure: str = "decode"  # what --against compares: decode (tokens/s) or train (ms per optimizer step)
    pos: str = "rope,sinusoidal,alibi,none"  # schemes, comma-separated
    new_tokens: int = 1024  # tokens generated per decoding run: 16 x block_size
    steps: int = 10  # optimizer steps per training round
    rounds: int = 5  # rounds of each side, alternated
    threads: str = "auto"  # CPU threads; auto: the cores other processes leave free (OMP_NUM_THREADS if set)
    nanogpt_gelu: str = "exact"  # --against=nanogpt's GELU: exact (nanoGPT's) or tanh (GPT-2's, this tree's)

    def __post_init__(self):
        if (self.against is None) == (not self.module_free):
            raise UserError("give exactly one of --against=REV and --module_free", 2)
        if self.module_free and self.measure != "decode":
            raise UserError("--module_free measures decoding only (--measure=decode)", 2)
        if "learned" in self.schemes and self.module_free:  # self.schemes checks the names too
            why = "--module_free writes out no learned table: give --pos among sinusoidal, rope, alibi, none"
            raise UserError(why, 2)
        if self.against == NANOGPT and self.measure != "train":
            raise UserError("--against=nanogpt: training only (--measure=train); nanoGPT has no KV cache", 2)
        if self.against == NANOGPT and self.schemes != ("learned",):
            raise UserError("--against=nanogpt: nanoGPT has learned positions only; give --pos=learned", 2)
        if self.nanogpt_gelu != "exact" and self.against != NANOGPT:
            raise UserError("--nanogpt_gelu is for --against=nanogpt's reference; give --against=nanogpt", 2)
        if self.new_tokens < 2 or min(self.steps, self.rounds) < 1:
            raise UserError("--new_tokens must be >= 2, --steps and --rounds >= 1", 2)
        hardware.check_threads(self.threads)

    @property
    def schemes(self):
        return parse_list("pos", self.pos, positions.POS_SCHEMES)


def recipe_model(module, pos):
    torch.manual_seed(0)
    return module.GPT(module.GPTConfig(**RECIPE, pos=pos))


Side = namedtuple("Side", "module generate")  # a model module, its generate_cached(model, idx, n, ...)
THIS_TREE = Side(current, generate_cached)


def module_at(revision, path, imports=None, required=False):
    """REV's `path` run as a new module {stem}_at_revision, registered in sys.modules (dataclasses look their
    module up there), its `import X` getting imports[X] where given; None where REV has no such file."""
    git = ["git", "-C", str(ROOT), "show", f"{revision}:{path}"]
    shown = subprocess.run(git, capture_output=True, text=True)
    if shown.returncode != 0 and required:
        raise UserError(f"--against={revision}: git show found no {path} there ({shown.stderr.strip()})", 2)
    if shown.returncode != 0:
        return None
    name = f"{Path(path).stem}_at_revision"
    module = sys.modules[name] = types.ModuleType(name)
    imports = imports or {}
    saved = {key: sys.modules[key] for key in imports}  # model and positions: imported above
    sys.modules.update(imports)
    try:
        exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
    finally:
        sys.modules.update(saved)
    return module


def side_at(revision):
    """REV's model.py (importing REV's positions.py where it has one) and generate_cached: from REV's
    generation.py (importing REV's model.py, not this tree's), else the method GPT.generate_cached."""
    rev_positions = module_at(revision, "positions.py") or positions
    module = module_at(revision, "model.py", {"positions": rev_positions}, required=True)
    generation = module_at(revision, "generation.py", {"model": module})
    if generation is None:
        return Side(module, lambda model, *args, **kwargs: model.generate_cached(*args, **kwargs))
    return Side(module, generation.generate_cached)


@torch.inference_mode()
def module_free_generate(model, n_new, logits=None):
    """Greedy decoding from token 0 with the model's weights and position tables and no module calls (bias
    off): the sinusoidal table added to the scaled token embedding, RoPE's rotation of q and k, ALiBi's bias
    over the keys so far. logits: a list to which each step's logits (B, vocab) are appended."""
    cfg, pos = model.config, model.transformer.wpe
    B, C, n_head = 1, cfg.n_embd, cfg.n_head
    pos.reserve(n_new)
    names = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")
    layers = [[block.get_submodule(name).weight for name in names] for block in model.transformer.h]
    wte, ln_f = model.transformer.wte.weight, model.transformer.ln_f.weight
    keys = [torch.zeros(B, n_head, n_new, C // n_head) for _ in layers]
    values = [torch.zeros_like(k) for k in keys]
    token, slot, out = torch.zeros(B, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long), []
    for n in range(1, n_new + 1):  # n: the keys so far
        x = F.embedding(token, wte)
        if cfg.pos == "sinusoidal":
            x = x * pos.token_scale + pos.table[slot]
        rope = (pos.cos[slot], pos.sin[slot]) if cfg.pos == "rope" else None
        bias = (
            positions.alibi_bias_at(pos.slopes, slot, torch.arange(n))[None] if cfg.pos == "alibi" else None
        )
        for (ln_1, attn, proj, ln_2, fc, fc_proj), k_cache, v_cache in zip(layers, keys, values):
            qkv = F.linear(F.layer_norm(x, (C,), ln_1), attn).view(B, 3, n_head, 1, C // n_head)
            if rope is None:
                q, k, v = qkv.unbind(1)
            else:
                q, k, v = (*positions.apply_rope(qkv[:, :2], *rope).unbind(1), qkv[:, 2])
            k_cache.index_copy_(2, slot, k)
            v_cache.index_copy_(2, slot, v)
            y = F.scaled_dot_product_attention(q, k_cache[:, :, :n], v_cache[:, :, :n], attn_mask=bias)
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
    """The module-free loop's logits at every step must be the model's forward's, to 1e-4 of their scale.
    Checked on a copy with 10x larger matrices: at GPT-2's initialisation attention is so flat that leaving
    RoPE or ALiBi out moves the logits by 1e-6 only."""
    sharp, logits = copy.deepcopy(model), []
    with torch.no_grad():
        for weight in (weight for weight in sharp.parameters() if weight.dim() == 2):
            weight.mul_(10.0)
    tokens = module_free_generate(sharp, n_new, logits)
    with torch.inference_mode():
        expected = sharp(torch.cat([torch.zeros(1, 1, dtype=torch.long), tokens[:, :-1]], dim=1))[0]
    if not (torch.stack(logits, dim=1) - expected).abs().max() / expected.abs().max() < 1e-4:
        raise SystemExit(f"{PROG}: {pos}: the module-free loop's logits are not the model's; nothing timed")


# -----------------------------------------------------------------------------
# --against=nanogpt: a model with nanoGPT's structure (bias off, as the recipe), GPT-2's parameter names


class SplitAttention(nn.Module):
    """c_attn's output split into q, k and v, each viewed into heads (B, nh, T, hs), causal SDPA, c_proj."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (
            t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class ReferenceBlock(nn.Module):
    """Pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x)), the MLP c_fc, GELU, c_proj, dropout."""

    def __init__(self, config, gelu):
        super().__init__()
        C = config.n_embd
        self.ln_1, self.attn = nn.LayerNorm(C, bias=False), SplitAttention(config)
        self.ln_2 = nn.LayerNorm(C, bias=False)
        c_fc, c_proj = nn.Linear(C, 4 * C, bias=False), nn.Linear(4 * C, C, bias=False)
        gelu = nn.GELU(approximate="none" if gelu == "exact" else "tanh")
        mlp = dict(c_fc=c_fc, gelu=gelu, c_proj=c_proj, dropout=nn.Dropout(config.dropout))
        self.mlp = nn.Sequential(OrderedDict(mlp))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPTStructured(nn.Module):
    """Token plus learned position embedding, the blocks, a final LayerNorm, the lm_head tied to wte; gelu:
    one of NANOGPT_GELUS. The weights: those of `model`, this tree's GPT(pos=learned, bias=False), copied."""

    def __init__(self, model, gelu="exact"):
        super().__init__()
        config, C = model.config, model.config.n_embd
        wte, wpe = nn.Embedding(config.vocab_size, C), nn.Embedding(config.block_size, C)
        h = nn.ModuleList([ReferenceBlock(config, gelu) for _ in range(config.n_layer)])
        ln_f = nn.LayerNorm(C, bias=False)
        self.transformer = nn.ModuleDict(
            dict(wte=wte, wpe=wpe, drop=nn.Dropout(config.dropout), h=h, ln_f=ln_f)
        )
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.load_state_dict(model.state_dict())

    def forward(self, idx, targets=None):
        """idx: (B, T) -> logits (B, T, vocab_size), and with targets the mean cross-entropy."""
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


nanogpt_structured = NanoGPTStructured  # (this tree's model, gelu) -> the reference


@torch.no_grad()
def nanogpt_matches_or_exit(model, x, y):
    """The tanh-GELU reference must give this tree's logits and loss on (x, y) to 1e-5; it says so, and
    -> (max |logit change|, |loss change|) that the exact GELU makes."""
    logits, loss = model.train()(x, y)
    outs = {gelu: nanogpt_structured(model, gelu).train()(x, y) for gelu in NANOGPT_GELUS}
    change = {g: ((o[0] - logits).abs().max().item(), (o[1] - loss).abs().item()) for g, o in outs.items()}
    if not all(c <= 1e-5 for c in change["tanh"]):  # NaN fails too
        raise SystemExit(
            f"{PROG}: the nanoGPT-structured model with the tanh GELU does not give this tree's logits "
            f"and loss (off by {change['tanh'][0]:.2e} and {change['tanh'][1]:.2e}); nothing timed"
        )
    print(
        "checked: with the tanh GELU the nanoGPT-structured model gives this tree's logits and loss to 1e-5; "
        f"the exact GELU moves them by up to {change['exact'][0]:.1e} and {change['exact'][1]:.1e}"
    )
    return change["exact"]


def training_batch():
    """The CPU recipe's batch (12 x 64) of random tokens, the same one every call -> inputs, targets."""
    batch = torch.randint(0, 65, (12, 65), generator=torch.Generator().manual_seed(0))
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # older model.py versions view the targets


def trainer(model, steps):
    """A function running `steps` optimizer steps of the CPU recipe on one batch of random tokens."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = training_batch()

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


def compare_decoding(cfg, old_side):
    """[(pos, side A tok/s, this tree's tok/s)], both sides' greedy tokens from token 0 checked alike."""
    prompt, rows, n = torch.zeros(1, 1, dtype=torch.long), [], cfg.new_tokens
    cached = lambda side, model: lambda: side.generate(model.eval(), prompt, n, temperature=0)[:, 1:]
    for pos in cfg.schemes:
        model = recipe_model(current, pos)
        if cfg.module_free:
            module_free_matches_or_exit(pos, model, n)
            side_a = lambda m=model: module_free_generate(m, n)
        else:
            side_a = cached(old_side, recipe_model(old_side.module, pos))
        samplers = {"a": side_a, "b": cached(THIS_TREE, model)}
        if not torch.equal(side_a(), samplers["b"]()):
            raise SystemExit(f"{PROG}: {pos}: the two sides generate different tokens; nothing timed")
        seconds = alternate(samplers, cfg.rounds)
        rows.append((pos, n / seconds["a"], n / seconds["b"]))
    return rows


def compare_training(cfg, old_side):
    """[(pos, side A ms/step, this tree's ms/step)], every scheme of both sides interleaved round by round."""
    models = {("b", pos): recipe_model(current, pos) for pos in cfg.schemes}
    if cfg.against == NANOGPT:  # checked to be this tree's network with the tanh GELU first
        nanogpt_matches_or_exit(models["b", "learned"], *training_batch())
        models = {("a", "learned"): nanogpt_structured(models["b", "learned"], cfg.nanogpt_gelu)} | models
    else:
        models = {("a", pos): recipe_model(old_side.module, pos) for pos in cfg.schemes} | models
    runs = {key: trainer(model, cfg.steps) for key, model in models.items()}
    for run in runs.values():
        run()  # warm-up: the first steps allocate the optimizer state
    seconds = alternate(runs, cfg.rounds)
    return [(pos, *(1e3 * seconds[side, pos] / cfg.steps for side in "ab")) for pos in cfg.schemes]


def main(argv=None):
    choices = {"measure": ("decode", "train"), "nanogpt_gelu": NANOGPT_GELUS}
    values = parse_flags(argv, PROG, __doc__, [("comparison", ABConfig, None)], choices=choices)
    with one_line_errors(PROG):
        cfg = ABConfig(**values)
        if cfg.measure == "decode":  # a KV cache for new_tokens
            config = current.GPTConfig(**RECIPE, pos="rope")
            check_generation_memory(config, 1, 1, cfg.new_tokens, "cpu", "lower --new_tokens", weights=True)
        old_side = side_at(cfg.against) if cfg.against not in (None, NANOGPT) else None
    print(hardware.use_threads(cfg.threads, "cpu"))
    side_a = "module-free loop" if cfg.module_free else f"model.py at {cfg.against}"
    if cfg.against == NANOGPT:
        side_a = f"nanoGPT-structured model ({cfg.nanogpt_gelu} GELU)"
    decode = cfg.measure == "decode"
    work = f"{cfg.new_tokens} new tokens" if decode else f"{cfg.steps} steps of 12 x 64 tokens"
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {work} per run, "
        f"median of {cfg.rounds} alternated runs"
    )
    rows = (compare_decoding if decode else compare_training)(cfg, old_side)
    if decode:
        columns = ["pos", f"{side_a} tok/s", "this tree tok/s", "this tree's speed-up"]
        cells = [[pos, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}x"] for pos, a, b in rows]
    else:
        learned = next((row for row in rows if row[0] == "learned" and len(rows) > 1), None)
        ms = lambda row, i: f"{row[i]:.1f}" + (f" ({row[i] / learned[i]:.2f}x learned)" if learned else "")
        columns = ["pos", f"{side_a} ms/step", "this tree ms/step", "this tree's speed-up"]
        cells = [[row[0], ms(row, 1), ms(row, 2), f"{row[1] / row[2]:.2f}x"] for row in rows]
    print("\n" + markdown_table(columns, cells))
    return rows


if __name__ == "__main__":
    with one_line_errors(PROG, errors=()):  # Ctrl-C while measuring: status 130, no traceback
        main()
