"""A position scheme is one class. A toy scheme, written below as one PositionScheme subclass and registered
in POSITION_MODULES, trains, decodes with the KV cache, is evaluated and its FLOPs counted, no other file
touched; no code outside positions.py compares a scheme's name: the rest of the repository asks the class; and
PositionScheme's public names are the ones its docstring lists."""

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

import generation
from lab.measure.losses import position_losses
from model import GPT, GPTConfig
from positions import POS_SCHEMES, POSITION_MODULES, PositionScheme

ROOT = Path(__file__).resolve().parents[1]
EXEMPT = ("tests", "experiments", ".venv")  # the tests; the study's comparison tables name its runs


class SelfBias(PositionScheme):
    """The toy: head h adds a learned b_h to the score of each query on its own key (i = j), nothing
    elsewhere, and costs 3 FLOPs per key a token attends to (to show the count takes a scheme's own term)."""

    def __init__(self, config):
        super().__init__(config)
        self.bias = nn.Parameter(torch.linspace(-1.0, 1.0, config.n_head))

    def score_bias(self, query_pos, key_pos):
        own = (query_pos[:, None] == key_pos[None, :]).to(self.bias.dtype)  # (n_query, n_key)
        return (self.bias[:, None, None] * own)[None]  # (1, n_head, n_query, n_key)

    def flops_per_token(self, seq_len, batch_size):
        return 3 * seq_len


@pytest.fixture
def toy(monkeypatch):
    """GPTConfig.from_flat(pos="toy"): the toy registered for this test only."""
    monkeypatch.setitem(POSITION_MODULES, "toy", SelfBias)
    return GPTConfig.from_flat(pos="toy", block_size=8, n_layer=2, n_head=2, n_embd=16, vocab_size=11)


def test_a_registered_scheme_trains(toy):
    """A few AdamW steps through GPT: the loss falls and a gradient reaches the scheme's own parameter."""
    torch.manual_seed(0)
    model = GPT(toy)
    optimizer = model.configure_optimizers(0.0, 1e-2, (0.9, 0.95), "cpu")
    x = torch.randint(0, 11, (4, 8))
    losses = []
    for _ in range(5):
        loss = model(x, x)[1]
        optimizer.zero_grad()
        loss.backward()
        assert model.transformer.wpe.bias.grad.abs().sum() > 0
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_a_registered_scheme_decodes_with_the_kv_cache(toy, monkeypatch):
    """generate_cached's logits at every step, past block_size too, equal GPT.forward's uncached ones."""
    torch.manual_seed(0)
    model = GPT(toy).eval()
    seen = []
    monkeypatch.setattr(
        generation, "sample_next", lambda logits, *a: seen.append(logits) or logits.argmax(-1, True)
    )
    prompt = torch.randint(0, 11, (2, 3))
    out = generation.generate_cached(model, prompt, 2 * toy.block_size, temperature=0)
    with torch.no_grad():
        for t, logits in zip(range(3, 3 + 2 * toy.block_size), seen):
            torch.testing.assert_close(logits, model(out[:, :t])[0][:, -1], rtol=0, atol=1e-5, msg=f"t={t}")


def test_a_registered_scheme_is_evaluated_past_block_size(toy):
    """lab.measure.losses at twice block_size: a finite loss at every position."""
    torch.manual_seed(0)
    x = torch.randint(0, 11, (2, 2 * toy.block_size + 1))
    losses = position_losses(GPT(toy).eval(), x[:, :-1], x[:, 1:])
    assert losses.shape == (2 * toy.block_size,) and torch.isfinite(losses).all()


def test_a_registered_scheme_is_counted(toy):
    """Its parameters count in the model's; GPT's FLOP count adds its own per-token term to 6N (its
    parameters left out) and attention's."""
    model = GPT(toy)
    assert model.num_params() == GPT(GPTConfig.from_flat(**{**vars(toy), "pos": "none"})).num_params() + 2
    c = toy
    attention = 12 * c.n_layer * c.n_head * c.head_dim * c.block_size
    assert model.flops_per_token() == (6 * (model.num_params() - 2) + attention + 3 * c.block_size, None)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_a_schemes_flops_per_token_are_the_matmuls_of_its_own_hooks_once_a_batch(pos):
    """flops_per_token(T, B) times the B T tokens of a forward is what torch counts in the scheme's own hooks
    (embed, rotation, score_bias) over one batch, forward and backward: a bias built once a forward is shared
    by the batch, not counted once a sequence. A scheme that says None (unknown) is noted instead."""
    B, T = 3, 8
    scheme = GPT(
        GPTConfig.from_flat(pos=pos, block_size=T, n_layer=1, n_head=2, n_embd=16, vocab_size=11)
    ).transformer.wpe
    own, positions = scheme.flops_per_token(T, B), torch.arange(T)
    if own is None:  # unknown: said, not counted as 0 (test_a_scheme_that_does_not_say_its_flops_...)
        return
    tokens = torch.randn(B, T, 16, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        rotation = scheme.rotation(positions) or ()
        outputs = [scheme.embed(tokens, positions), *rotation, scheme.score_bias(positions, positions)]
        sum(out.sum() for out in outputs if out is not None).backward()
    assert counter.get_total_flops() == own * B * T


def test_a_scheme_that_does_not_say_its_flops_is_noted_as_not_counted(monkeypatch):
    """PositionScheme.flops_per_token's default is None, unknown: GPT.flops_per_token counts 6N and attention
    and says that the scheme's own compute is left out, rather than counting it as 0."""
    monkeypatch.setitem(POSITION_MODULES, "unflagged", UnflaggedBias)
    config = GPTConfig.from_flat(pos="unflagged", block_size=8, n_layer=2, n_head=2, n_embd=16, vocab_size=11)
    flops, note = GPT(config).flops_per_token(batch_size=4)
    assert note == "FLOPs of pos=unflagged's own compute not counted (unknown)"
    none = GPT(GPTConfig.from_flat(**{**vars(config), "pos": "none"})).flops_per_token(batch_size=4)
    assert (flops, none[1]) == (none[0], None)


# -----------------------------------------------------------------------------
# No scheme's name compared outside positions.py


SCHEME_CLASSES = {cls.__name__ for cls in POSITION_MODULES.values()}


def strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(set(), *map(strings, node.elts))
    return set()


def name_comparisons(source):
    """(line, code) of each comparison of a position scheme's name (config.pos == "rope", pos in ("alibi",
    ...), config["pos"] != "learned") and each isinstance/issubclass with a scheme's class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = any(strings(side) & set(POS_SCHEMES) for side in sides)
            of_pos = any("pos" in ast.unparse(side) for side in sides if not strings(side))
            if names and of_pos:
                found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
            named = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node.args[-1])
                     if isinstance(n, (ast.Name, ast.Attribute))}  # fmt: skip
            if named & SCHEME_CLASSES:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_name_check_finds_each_kind_of_comparison():
    """The check below can fail: each way of asking a scheme's name instead of the scheme is caught."""
    kinds = ['config.pos == "rope"', 'c["pos"] != "learned"', 'pos in ("alibi", "none")']
    kinds += ["isinstance(wpe, RotaryPositions)", "isinstance(m, (nn.Linear, positions.ALiBiPositions))"]
    for code in kinds:
        assert name_comparisons(code), code
    assert not name_comparisons('scaling in ("none", "plain")') and not name_comparisons('text == "none"')


def test_no_code_outside_positions_compares_a_schemes_name():
    """Every Python file but positions.py, the tests and lab/experiments/ asks the scheme (rotates, biased,
    length_limit, ...) instead of comparing config.pos to a name: a fork adds its scheme in positions.py."""
    paths = [p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in EXEMPT]
    assert len(paths) > 30 and ROOT / "model.py" in paths
    found = {
        str(p.relative_to(ROOT)): name_comparisons(p.read_text()) for p in paths if p.name != "positions.py"
    }
    assert {path: hits for path, hits in found.items() if hits} == {}


class UnflaggedBias(PositionScheme):
    """A score bias and no flag: it overrides score_bias and sets nothing else, as a forker may write it."""

    def score_bias(self, query_pos, key_pos):
        distance = (query_pos[:, None] - key_pos[None, :]).clamp(min=0).float()
        return (-0.3 * distance)[None, None]  # (1, 1, n_query, n_key)


def test_a_score_bias_applies_in_training_as_in_cached_decoding(monkeypatch):
    """Overriding score_bias is all it takes: the training forward (no cache) adds the bias as cached decoding
    does, so both give the same logits; a flag a forker could forget would leave the forward without it."""
    monkeypatch.setitem(POSITION_MODULES, "unflagged", UnflaggedBias)
    torch.manual_seed(0)
    config = GPTConfig.from_flat(pos="unflagged", block_size=8, n_layer=2, n_head=2, n_embd=16, vocab_size=11)
    model = GPT(config).eval()
    x = torch.randint(0, 11, (2, 8))
    with torch.no_grad():
        full = model(x)[0]
        model.setup_cache(2, 8, chunk=8)
        cached = model(x, input_pos=torch.arange(8))[0]
    torch.testing.assert_close(full, cached, rtol=0, atol=1e-5)


class LinearBias(PositionScheme):
    """A bias from an nn.Linear of the distance, whose init_weights starts it at a chosen slope."""

    def __init__(self, config):
        super().__init__(config)
        self.slope = nn.Linear(1, config.n_head)

    def init_weights(self):
        nn.init.constant_(self.slope.weight, -0.5)
        nn.init.zeros_(self.slope.bias)

    def score_bias(self, query_pos, key_pos):
        distance = (query_pos[:, None] - key_pos[None, :]).clamp(min=0).float()[..., None]
        return self.slope(distance).permute(2, 0, 1)[None]  # (1, n_head, n_query, n_key)


def test_a_schemes_own_init_weights_runs_after_gpt_2s_draw_of_its_children(monkeypatch):
    """GPT.init_weights gives every nn.Linear N(0, 0.02), the scheme's children too, and then calls the
    scheme's init_weights: the start a scheme sets for its own nn.Linear stands in the built model."""
    monkeypatch.setitem(POSITION_MODULES, "linear_bias", LinearBias)
    torch.manual_seed(0)
    model = GPT(
        GPTConfig.from_flat(pos="linear_bias", block_size=8, n_layer=1, n_head=2, n_embd=16, vocab_size=11)
    )
    assert torch.equal(model.transformer.wpe.slope.weight, torch.full((2, 1), -0.5))


# -----------------------------------------------------------------------------
# The interface's names: the ones its docstring lists, each what the core asks and only a scheme can answer


def listed_names(doc):
    """The names a docstring lists: each entry line starts with 4 spaces, then the name (continuations are
    indented further)."""
    return {match.group(1) for match in re.finditer(r"^ {4}(\w+)", doc, re.MULTILINE)}


def test_the_listing_reads_each_entry_and_no_continuation():
    """The check below can fail: an entry line gives its name, a continuation line or prose none."""
    doc = "Names:\n    embed(x)   -> y\n                continued(z)\n    length_limit    the longest\nprose"
    assert listed_names(doc) == {"embed", "length_limit"}


def test_position_schemes_public_names_are_the_ones_its_docstring_lists():
    """What PositionScheme itself defines without a leading "_" is exactly what its docstring lists, 13 names:
    a name added to the class without its entry (or the reverse) fails here, and so does a 14th."""
    public = {name for name in vars(PositionScheme) if not name.startswith("_")}
    assert public == listed_names(inspect.getdoc(PositionScheme))
    assert len(public) <= 13, sorted(public)
