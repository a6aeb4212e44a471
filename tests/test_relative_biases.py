"""The learned relative biases, --pos=t5 and --pos=fire: T5's buckets and bias equal transformers' T5Attention
(bidirectional=False, as a decoder), FIRE's input stays in [0, 1] at any length and its bias is a function of
(i, i - j), both train inside a GPT. Generation, compilation, causality and the rest run over every scheme
in the files that test them (parametrized over POS_SCHEMES); S²-Attn is in tests/test_s2_attn.py."""

import pytest
import torch

from model import GPT, GPTConfig
from positions import FIREPositions, T5Positions, fire_input, t5_bucket


def tiny_config(pos, **overrides):
    fields = dict(block_size=16, vocab_size=32, n_layer=2, n_head=4, n_embd=16, dropout=0.0, pos=pos)
    return GPTConfig.from_flat(**fields | overrides)


def random_positions(g, n, high):
    return torch.randint(0, high, (n,), generator=g)


# -----------------------------------------------------------------------------
# T5: parity with transformers


@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 40), (8, 9), (64, 1000)])
def test_t5_bucket_equals_transformers(num_buckets, max_distance):
    """t5_bucket(i - j) = T5Attention._relative_position_bucket(j - i, bidirectional=False) (transformers'
    relative_position is memory - context, key minus query: the opposite sign), for distances 0 to past
    max_distance and for later keys (j > i, bucket 0), at T5's sizes and others."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason="the parity needs transformers")
    g = torch.Generator().manual_seed(num_buckets)
    distance = torch.cat([torch.arange(-5, 3 * max_distance), torch.randint(0, 10**6, (200,), generator=g)])
    expected = t5.T5Attention._relative_position_bucket(-distance, False, num_buckets, max_distance)
    assert torch.equal(t5_bucket(distance, num_buckets, max_distance), expected)


@pytest.mark.parametrize("n_query, n_key, past", [(24, 24, 0), (1, 300, 299), (5, 260, 255), (7, 7, 0)])
def test_t5_score_bias_equals_transformers_compute_bias(n_query, n_key, past):
    """T5Positions.score_bias over query positions past .. past + n_query - 1 and keys 0 .. n_key - 1 equals
    transformers' decoder compute_bias(n_query, n_key, past_seen_tokens=past) on the same random weights: a
    prefill, cached decoding steps (one query after 299 keys; five after 255), distances past max_distance."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5", reason="the parity needs transformers")
    torch.manual_seed(0)
    config = t5.T5Config(d_model=16, d_kv=4, num_heads=4, is_decoder=True)
    reference = t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    ours = T5Positions(tiny_config("t5"))
    assert (ours.num_buckets, ours.max_distance) == (
        config.relative_attention_num_buckets,
        config.relative_attention_max_distance,
    )
    ours.relative_attention_bias.weight.data.copy_(reference.relative_attention_bias.weight)
    expected = reference.compute_bias(n_query, n_key, past_seen_tokens=past)
    got = ours.score_bias(torch.arange(past, past + n_query), torch.arange(n_key))
    assert got.shape == (1, 4, n_query, n_key)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_t5_bias_is_translation_invariant_and_flat_past_max_distance():
    """Shifting queries and keys together leaves T5's bias unchanged (a function of i - j only), and every
    distance from max_distance (128) on gets the last bucket's bias, as from 113 on, where it starts: what
    longer inputs meet is what training saw. Distance 112, a bucket before, gets another."""
    torch.manual_seed(1)
    t5 = T5Positions(tiny_config("t5"))
    g = torch.Generator().manual_seed(2)
    query, key = random_positions(g, 9, 400), random_positions(g, 11, 400)
    for shift in (1, 37, 1000):
        torch.testing.assert_close(t5.score_bias(query + shift, key + shift), t5.score_bias(query, key))
    far = t5.score_bias(torch.tensor([5000]), torch.tensor([5000 - 113, 5000 - 128, 4000, 0]))[0, :, 0]
    assert torch.equal(far, far[:, :1].expand_as(far))
    near = t5.score_bias(torch.tensor([5000]), torch.tensor([5000 - 112]))[0, :, 0]
    assert not torch.equal(near, far[:, :1])


# -----------------------------------------------------------------------------
# FIRE: the progressive interpolation and the bias


def fire_parameters(seed):
    """Random c > 0 and L >= 1 in float64, as tensors that collect gradients."""
    g = torch.Generator().manual_seed(seed)
    c = torch.empty((), dtype=torch.float64).uniform_(0.01, 3, generator=g).requires_grad_()
    L = torch.empty((), dtype=torch.float64).uniform_(1, 40, generator=g).requires_grad_()
    return c, L


@pytest.mark.parametrize("seed", range(4))
def test_fire_input_stays_in_0_1_up_to_ten_times_the_training_length(seed):
    """For every 0 <= j <= i < 10 x 64 and random c > 0, L >= 1: psi(i - j) / psi(max(L, i)) lies in [0, 1],
    is 0 at j = i, grows with the distance for a fixed query, and reaches 1 only at j = 0 once i >= L."""
    c, L = fire_parameters(seed)
    pos = torch.arange(640)
    x = fire_input(pos, pos, c.detach(), L.detach())
    causal = pos[:, None] >= pos[None, :]
    assert x[causal].min() >= 0 and x[causal].max() <= 1 + 1e-12
    assert torch.equal(x.diagonal(), torch.zeros(640, dtype=torch.float64))
    rows = x.where(causal, float("nan")).flip(1)  # each row from its own position back to key 0
    steps = rows[:, 1:] - rows[:, :-1]
    assert (steps[steps.isfinite()] > 0).all(), "further keys get larger inputs"
    late = pos >= L.item()
    torch.testing.assert_close(x[late, 0], torch.ones(int(late.sum()), dtype=torch.float64))


def test_fire_input_worked_by_hand():
    """c = 1, L = 4: ln 3 / ln 5 at (i, j) = (2, 0) (normalised by L), 1 at (8, 0), ln 3 / ln 9 = 1/2 at
    (8, 6); a later key (j > i, masked) counts as j = i."""
    one, four = torch.tensor(1.0, dtype=torch.float64), torch.tensor(4.0, dtype=torch.float64)
    x = fire_input(torch.tensor([2, 8]), torch.tensor([0, 6, 9]), one, four)
    expected = torch.tensor([[1.0986123 / 1.6094379, 0, 0], [1, 0.5, 0]], dtype=torch.float64)
    torch.testing.assert_close(x, expected, rtol=0, atol=1e-7)


def test_fire_bias_is_a_function_of_the_query_and_the_distance_not_of_the_call():
    """FIRE's bias of query i on key j is the same whatever else is in the call (a prefill, one decode step,
    keys in a ring's order): a function of (i, i - j). Unlike T5's it depends on i itself: shifting both
    positions past L changes it, since the same distance is read against a longer context."""
    torch.manual_seed(3)
    fire = FIREPositions(tiny_config("fire")).double()
    full = fire.score_bias(torch.arange(40), torch.arange(40))[0]
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        query, key = random_positions(g, 3, 40), torch.randperm(40, generator=g)[:7]
        part = fire.score_bias(query, key)[0]
        torch.testing.assert_close(part, full[:, query][:, :, key], rtol=0, atol=0)
    same_distance = fire.score_bias(torch.tensor([10, 30]), torch.tensor([5, 25]))[0]
    assert not torch.allclose(same_distance[:, 0, 0], same_distance[:, 1, 1])


def test_fire_gradients_reach_c_l_and_every_mlp_weight():
    """A loss on FIRE's bias sends a gradient to c, to L (through the queries below L) and to both layers of
    f, weights and biases: all of FIRE is learned."""
    torch.manual_seed(5)
    fire = FIREPositions(tiny_config("fire")).double()  # L = 1 + 16 / 4 = 5
    bias = fire.score_bias(torch.arange(16), torch.arange(16))
    weights = torch.randn(bias.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    (bias * weights).tril().sum().backward()
    for name, param in fire.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_fire_starts_from_the_authors_c_and_a_quarter_of_block_size():
    """c starts at 0.1 and L at 1 + block_size / 4 (the public FIRE code's 512, a quarter of the paper's
    2048, as a share of the training length)."""
    fire = FIREPositions(tiny_config("fire", block_size=64))
    assert abs(fire.c_log.exp().item() - 0.1) < 1e-7 and abs(fire.L_log.exp().item() + 1 - 17) < 1e-5


# -----------------------------------------------------------------------------
# Both, inside a GPT


@pytest.mark.parametrize("pos", ["t5", "fire"])
def test_a_tiny_gpt_trains_and_every_bias_parameter_learns(pos):
    """Twenty AdamW steps on one batch lower the loss by a third or more; the first step's gradient reaches
    every parameter of the position scheme, and each of them moves."""
    torch.manual_seed(7)
    model = GPT(tiny_config(pos, n_embd=32))
    idx = torch.randint(0, 32, (4, 17), generator=torch.Generator().manual_seed(8))
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95), "cpu")
    scheme = dict(model.transformer.wpe.named_parameters())
    before = {name: p.detach().clone() for name, p in scheme.items()}
    losses = []
    for step in range(20):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scheme.values()), pos
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 2 / 3 * losses[0], losses
    assert all(not torch.equal(before[name], p) for name, p in scheme.items())
