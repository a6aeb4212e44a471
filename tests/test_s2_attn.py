"""S²-Attn (lab.finetune.s2.shifted_sparse_attention): LongLoRA's grouped training attention, causal and
without its released code's wrap-around leak; full attention outside training."""

import pytest
import torch
from helpers import TINY_RUN, finetune_error_line

import train
from lab.finetune import __main__ as finetune
from lab.finetune.s2 import s2_mask, shifted_sparse_attention, use_s2_attn
from model import GPT, GPTConfig
from positions import POS_SCHEMES, POSITION_MODULES, PositionScheme, overrides


def visible(n_head, T, group):
    """(nh, T, T) bools by brute force: query t of head h sees key s when s <= t and both lie in the same
    group: groups [0, G), [G, 2G), ... for the first half of the heads; [0, G/2), [G/2, 3G/2), ..., the last
    [T - G/2, T) for the second half (groups shifted by G/2, never wrapping)."""
    t = torch.arange(T)
    plain = t // group
    shifted = torch.div(t - group // 2, group, rounding_mode="floor")  # -1 for the first G/2 tokens
    ids = [plain if h < n_head // 2 else shifted for h in range(n_head)]
    return torch.stack([(g[:, None] == g[None, :]) & (t[:, None] >= t[None, :]) for g in ids])


def reference(q, k, v, group, bias=None):
    """Softmax attention under visible(), one score at a time in float64."""
    allowed = visible(q.size(1), q.size(2), group)
    scores = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5 + (0 if bias is None else bias)
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("seed", range(6))
def test_s2_attn_is_per_group_causal_attention_with_half_the_heads_shifted(seed):
    """At random sizes, shifted_sparse_attention equals attention restricted by the brute-force visibility."""
    g = torch.Generator().manual_seed(seed)
    n_head = 2 * int(torch.randint(1, 4, (), generator=g))
    group = 2 * int(torch.randint(1, 5, (), generator=g))
    T = group * int(torch.randint(1, 6, (), generator=g))
    q, k, v = torch.randn(3, 2, n_head, T, 4, generator=g, dtype=torch.float64)
    torch.testing.assert_close(shifted_sparse_attention(q, k, v, group), reference(q, k, v, group))


class QueryDependentBias(PositionScheme):
    """A toy scheme whose score bias depends on the query's position i itself, not only on i - j (as FIRE's
    f(psi(i - j) / psi(max(L, i))) does): head h adds -c_h (i - j) / (i + 1) + d_h i / T."""

    def __init__(self, n_head, T):
        super().__init__(None)
        self.c = torch.linspace(0.5, 2.0, n_head, dtype=torch.float64)[:, None, None]
        self.d = torch.linspace(-1.0, 1.0, n_head, dtype=torch.float64)[:, None, None]
        self.T = T

    def score_bias(self, query_pos, key_pos):
        i, j = query_pos[:, None].double(), key_pos[None, :].double()
        return (-self.c * (i - j) / (i + 1) + self.d * i / self.T)[None]  # (1, nh, n_query, n_key)


def test_s2_attn_adds_a_distance_bias_such_as_alibis_in_every_group():
    """ALiBi's bias (by distance) applies in every group, shifted ones included, as in full attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 1, 4, 16, 8, generator=g, dtype=torch.float64)
    config = GPTConfig.from_flat(pos="alibi", block_size=16, n_layer=1, n_head=4, n_embd=16, vocab_size=11)
    alibi = POSITION_MODULES["alibi"](config).double()
    pos = torch.arange(16)
    bias = alibi.score_bias(pos, pos)[0]
    torch.testing.assert_close(shifted_sparse_attention(q, k, v, 4, alibi), reference(q, k, v, 4, bias))


@pytest.mark.parametrize("group", [4, 8, 16])
def test_s2_attn_reads_a_score_bias_at_each_groups_true_positions(group):
    """A bias that depends on the query's position, not only on the distance: S²-Attn equals the brute-force
    reference that applies its visibility (groups, the shifted half) and the bias at the true positions
    (i, j) of every pair it lets through, in every head, shifted groups and the wrapped one included."""
    g = torch.Generator().manual_seed(group)
    T, n_head = 16, 4
    q, k, v = torch.randn(3, 2, n_head, T, 8, generator=g, dtype=torch.float64)
    scheme = QueryDependentBias(n_head, T)
    i, j = torch.arange(T, dtype=torch.float64)[:, None], torch.arange(T, dtype=torch.float64)[None, :]
    bias = -scheme.c * (i - j) / (i + 1) + scheme.d * i / T  # (nh, T, T) by the formula, every pair
    expected = reference(q, k, v, group, bias)
    torch.testing.assert_close(shifted_sparse_attention(q, k, v, group, scheme), expected)


BIASED = [pos for pos in POS_SCHEMES if overrides(POSITION_MODULES[pos], "score_bias")]


@pytest.mark.parametrize("pos", BIASED)
def test_s2_attn_adds_each_schemes_bias_at_the_true_positions(pos):
    """With each biased scheme's own bias (random weights), S²-Attn equals the brute-force visibility with the
    bias of each query and key at their true positions, in every group (FIRE's depends on the query's
    position)."""
    torch.manual_seed(2)
    config = GPTConfig.from_flat(pos=pos, block_size=16, n_layer=1, n_head=4, n_embd=16, vocab_size=11)
    scheme = POSITION_MODULES[pos](config).double()  # PyTorch's initialisation: a bias of order 1
    pos_ids = torch.arange(16)
    bias = scheme.score_bias(pos_ids, pos_ids)
    q, k, v = torch.randn(3, 1, 4, 16, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.testing.assert_close(shifted_sparse_attention(q, k, v, 4, scheme), reference(q, k, v, 4, bias))


def test_no_token_sees_a_later_one_across_the_wrap():
    """Perturbing the tokens after t leaves output t unchanged, in every head: the last shifted group (the
    sequence's end, then its start) is two causal pieces, not the wrap LongLoRA's code lets leak."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 1, 4, 16, 8, generator=g, dtype=torch.float64)
    y = shifted_sparse_attention(q, k, v, 8)
    for t in range(15):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t + 1 :] += torch.randn(k2[:, :, t + 1 :].shape, generator=g, dtype=torch.float64)
        v2[:, :, t + 1 :] += torch.randn(v2[:, :, t + 1 :].shape, generator=g, dtype=torch.float64)
        assert torch.equal(shifted_sparse_attention(q, k2, v2, 8)[:, :, : t + 1], y[:, :, : t + 1]), t


def test_unshifted_heads_see_their_group_only_and_shifted_heads_cross_its_border():
    """Who sees whom, from gradients: output t of an unshifted head depends on the values of its own group's
    tokens <= t only; the shifted heads are the only ones whose output at a group's start depends on the
    previous group."""
    T, G = 16, 8
    q, k = torch.randn(2, 1, 2, T, 4, dtype=torch.float64)
    v = torch.randn(1, 2, T, 4, dtype=torch.float64, requires_grad=True)
    for h in range(2):
        for t in range(T):
            (grad,) = torch.autograd.grad(shifted_sparse_attention(q, k, v, G)[0, h, t].sum(), v)
            sees = grad[0, h].abs().sum(-1) > 0
            assert torch.equal(sees, visible(2, T, G)[h, t]), (h, t)
    # token G (the second group's first) sees token G - 1 (the first group's last) through head 1 only
    assert visible(2, T, G)[:, G, G - 1].tolist() == [False, True]


def test_s2_mask_blocks_the_wrapped_groups_halves_from_each_other():
    mask = s2_mask(2, 8, 4).view(2, 2, 4, 4)
    assert torch.isinf(mask[1, -1, 2:, :2]).all() and (mask[1, -1, 2:, 2:].tril() == 0).all()
    assert torch.equal(mask[0, -1], mask[1, 0])  # every other group: causal only


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_model_uses_s2_attn_in_training_only(pos):
    """With s2_group set, eval mode (train.py's evaluation, sample.py, lab/eval_length.py) is full attention,
    bit for bit; training mode differs, and is causal."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.from_flat(pos=pos, block_size=16, n_layer=2, n_head=2, n_embd=16, vocab_size=11))
    x = torch.randint(0, 11, (2, 16))
    model.eval()
    full = model(x)[0]
    use_s2_attn(model, 4)
    assert torch.equal(model(x)[0], full)
    model.train()
    s2 = model(x)[0]
    assert not torch.allclose(s2, full)
    x2 = x.clone()
    x2[:, 9:] = (x2[:, 9:] + 1) % 11
    assert torch.equal(model(x2)[0][:, :9], s2[:, :9])


@pytest.mark.parametrize("pos", BIASED)
def test_s2_attn_builds_the_bias_once_a_forward_from_group_sized_calls(pos, monkeypatch):
    """A training forward under S²-Attn calls score_bias 2 T / G times (each group, plain and shifted), each
    on G queries and G keys: never the full T x T, and not again in each of the three layers."""
    torch.manual_seed(0)
    T, G = 16, 4
    model = GPT(
        GPTConfig.from_flat(pos=pos, block_size=T, n_layer=3, n_head=2, n_embd=16, vocab_size=11)
    ).train()
    use_s2_attn(model, G)
    scheme, shapes = model.transformer.wpe, []
    score_bias = scheme.score_bias
    monkeypatch.setattr(
        scheme, "score_bias", lambda q, k: shapes.append((len(q), len(k))) or score_bias(q, k)
    )
    x = torch.randint(0, 11, (2, T))
    model(x, x)[1].backward()
    assert shapes == [(G, G)] * (2 * T // G)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--s2_attn", "--s2_group=6"], "s2_group=6 must divide block_size=16"),
        (["--s2_attn", "--s2_group=3"], "must be even"),
        (["--s2_group=4"], "--s2_group needs --s2_attn"),
        (["--s2_attn", "--n_head=1"], "n_head"),
    ],
)
def test_a_group_that_does_not_fit_is_a_one_line_error(capsys, tmp_path, flags, words):
    err = finetune_error_line(capsys, [*TINY_RUN, f"--out_dir={tmp_path}", *flags], 2)
    assert words in err


@pytest.mark.parametrize(
    "block_size, words",
    [
        (6, "the default --s2_group, block_size // 4 = 1 (block_size=6), must be even and >= 2"),
        (20, "the default --s2_group, block_size // 4 = 5 (block_size=20), must be even and >= 2"),
        (18, "the default --s2_group, block_size // 4 = 4 (block_size=18), must divide block_size=18"),
    ],
)
def test_a_default_group_that_does_not_fit_names_block_size_not_a_flag_never_given(
    capsys, tmp_path, block_size, words
):
    """No --s2_group given: the group is block_size // 4, so the line names block_size and how to choose."""
    err = finetune_error_line(
        capsys, [*TINY_RUN, f"--out_dir={tmp_path}", "--s2_attn", f"--block_size={block_size}"], 2
    )
    assert words in err and err.endswith(
        "give an --s2_group (even, dividing block_size) or a block_size that is a multiple of 8"
    )


def test_s2_group_defaults_to_a_quarter_of_block_size():
    cfg, _ = train.parse_args([*TINY_RUN, "--s2_attn", "--out_dir=out/x"], finetune.Config)
    assert cfg.s2_group == 4


def test_the_lessons_figure_shows_the_pattern_the_code_applies():
    """docs/figures/s2_attn.png is drawn from lab.experiments.longlora.visibility, read off the attention
    itself: it equals the brute-force pattern."""
    from lab.experiments.longlora import visibility

    assert torch.equal(visibility(2, 16, 4), visible(2, 16, 4))
    assert torch.equal(visibility(4, 24, 6), visible(4, 24, 6))
