"""Property tests that grade the course's exercises (lab/course/exercises.py): each checks what a function
must do over random sizes and seeds, plus a value worked by hand where a convention matters (which coordinates
RoPE pairs, which head gets ALiBi's steepest slope), so that a body returning a constant, or one handling only
the shapes of the lesson's snapshot tests, fails.

Each test calls the functions of one exercise and no other a student writes (tests/test_course.py checks it):
ex6 and ex9 run pos="none" models one token at a time, which need no other exercise, and ex7's tests hand
rope_frequencies the theta_i and the YaRN ramp it builds on. Small shapes, float64 where exactness is the
point. A failing comparison's message (near, close) gives got, expected, the tolerance and the dtype:
python -m lab.course grade shows it, with the exercise's hints.
"""

import math
import random

import pytest
import torch

import positions
from model import GPT, GPTConfig, KVCache, cached_key_positions
from positions import (
    LearnedPositions,
    alibi_bias,
    alibi_bias_at,
    alibi_slopes,
    apply_rope,
    causal_mask,
    rope_cos_sin,
    rope_inv_freq,
    sinusoidal_embedding,
)

SEEDS = range(3)


def near(got, expected, tol, what, dtype=None):
    """|got - expected| < tol for two numbers. The message, which python -m lab.course grade shows, gives the
    numbers: got, expected, the gap, the tolerance and the dtype, so that a float32 answer to a float64
    question reads as one, not as a wrong formula."""
    gap = abs(got - expected)
    assert gap < tol, f"{what}: got {got!r}, expected {expected!r}, off by {gap:.2g}, tolerance {tol:g}" + (
        f", dtype {dtype}" if dtype is not None else ""
    )


def close(got, expected, what="", rtol=None, atol=None):
    """torch.testing.assert_close, its message one line: what, the worst entry (got and expected there), the
    dtype, then assert_close's own numbers (greatest differences, each with the tolerance allowed)."""

    def message(default):
        worst = ""
        tensors = isinstance(got, torch.Tensor) and isinstance(expected, torch.Tensor)
        if tensors and got.shape == expected.shape and got.numel():
            gap = (got.double() - expected.double()).abs().nan_to_num(float("inf"))
            at = tuple(torch.nonzero(gap == gap.max())[0].tolist())
            worst = f"at {list(at)} got {got[at].item()!r}, expected {expected[at].item()!r}, "
            worst += f"dtype {got.dtype}; "
        lines = [line for line in default.splitlines() if line.strip()]
        numbers = [line for line in lines if line.startswith("Greatest") and "(up to 0 allowed)" not in line]
        return (f"{what}: " if what else "") + worst + "; ".join(numbers or lines)

    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, msg=message)


def nope_model(seed, **overrides):
    """A tiny GPT without positions, float64, eval: its forward pass calls no exercise's function, one token
    at a time through a KV cache only ex6's."""
    torch.manual_seed(seed)
    fields = dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, pos="none")
    return GPT(GPTConfig.from_flat(**(fields | overrides))).double().eval()


# -----------------------------------------------------------------------------
# ex1: the sinusoidal table


@pytest.mark.parametrize("seed", SEEDS)
def test_sinusoidal_table_matches_its_formula_at_random_sizes(seed):
    """PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i), w_i = base^(-2i/dim), at every entry of tables of
    random size and base, in the dtype asked for."""
    rng = random.Random(seed)
    n_pos, dim, base = rng.randint(1, 300), 2 * rng.randint(1, 24), rng.choice([100.0, 10000.0, 5e5])
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        pe = sinusoidal_embedding(n_pos, dim, base=base, dtype=dtype)
        assert pe.shape == (n_pos, dim) and pe.dtype == dtype, (pe.shape, pe.dtype)
        for p in {0, n_pos - 1, *rng.sample(range(n_pos), min(n_pos, 20))}:
            for i in range(dim // 2):
                angle = p * base ** (-2 * i / dim)
                got = pe[p, 2 * i].item(), pe[p, 2 * i + 1].item()
                near(got[0], math.sin(angle), tol, f"PE[{p}, {2 * i}] = sin({angle:.17g})", dtype)
                near(got[1], math.cos(angle), tol, f"PE[{p}, {2 * i + 1}] = cos({angle:.17g})", dtype)


def test_sinusoidal_first_rows_worked_by_hand():
    """dim 4, base 100: w = (1, 0.1). Row 0 is (0, 1, 0, 1);
    row 2 is (sin 2, cos 2, sin 0.2, cos 0.2), interleaved."""
    pe = sinusoidal_embedding(3, 4, base=100.0, dtype=torch.float64)
    expected = torch.tensor(
        [
            [0, 1, 0, 1],
            [math.sin(1), math.cos(1), math.sin(0.1), math.cos(0.1)],
            [math.sin(2), math.cos(2), math.sin(0.2), math.cos(0.2)],
        ],
        dtype=torch.float64,
    )
    close(
        pe,
        expected,
        "rows 0 to 2 of sinusoidal_embedding(3, 4, base=100.0, dtype=torch.float64)",
        rtol=0,
        atol=1e-15,
    )


# -----------------------------------------------------------------------------
# ex2: the learned table


@pytest.mark.parametrize("seed", SEEDS)
def test_learned_grow_refuses_only_past_block_size(seed):
    """grow(n) is silent for every n up to block_size and a ValueError naming block_size past it."""
    block = random.Random(seed).randint(1, 40)
    table = LearnedPositions(GPTConfig.from_flat(block_size=block, n_embd=8, n_head=2, pos="learned"))
    for n in range(1, block + 1):
        table.grow(n)
    for n in (block + 1, 2 * block + 3):
        with pytest.raises(ValueError, match=f"block_size={block}"):
            table.grow(n)


@pytest.mark.parametrize("seed", SEEDS)
def test_learned_embed_adds_the_rows_at_the_given_positions(seed):
    """embed(tok, positions) = tok + table[positions] for any positions (a KV cache passes the later ones),
    and the gradient reaches exactly those rows of the table."""
    rng = random.Random(seed)
    block, n_embd, B, T = rng.randint(4, 30), 2 * rng.randint(1, 8), rng.randint(1, 3), rng.randint(1, 4)
    torch.manual_seed(seed)
    table = LearnedPositions(GPTConfig.from_flat(block_size=block, n_embd=n_embd, n_head=1, pos="learned"))
    positions = torch.tensor(rng.sample(range(block), T))
    tok = torch.randn(B, T, n_embd)
    out = table.embed(tok, positions)
    torch.testing.assert_close(out, tok + table.weight.detach()[positions], rtol=0, atol=0)
    out.sum().backward()
    touched = table.weight.grad.abs().sum(dim=1) > 0
    assert touched.nonzero().flatten().tolist() == sorted(positions.tolist())


# -----------------------------------------------------------------------------
# ex3: RoPE's frequencies and rotation


@pytest.mark.parametrize("seed", SEEDS)
def test_rope_inv_freq_is_base_to_the_minus_2i_over_d(seed):
    """theta_i = base^(-2i/dim) for i < dim/2, in float64; by hand, dim 4 and base 100 give (1, 0.1)."""
    rng = random.Random(seed)
    dim, base = 2 * rng.randint(1, 64), rng.uniform(2.0, 1e6)
    theta = rope_inv_freq(dim, base)
    assert theta.shape == (dim // 2,) and theta.dtype == torch.float64
    for i in range(dim // 2):
        expected = base ** (-2 * i / dim)
        assert abs(theta[i].item() - expected) <= 1e-12 * expected, (
            f"theta_{i} of rope_inv_freq({dim}, {base}): got {theta[i].item()!r}, expected {expected!r}, "
            "relative tolerance 1e-12"
        )
    close(rope_inv_freq(4, 100.0), torch.tensor([1.0, 0.1], dtype=torch.float64), "rope_inv_freq(4, 100.0)")


@pytest.mark.parametrize("seed", SEEDS)
def test_rope_cos_sin_turn_each_pair_by_position_times_theta(seed):
    """cos = cos(m theta_i) at columns i and i + d/2; sin = -sin(m theta_i) at i, +sin(m theta_i) at i + d/2;
    times the attention scale, (T, d), in theta's dtype, at any positions (a KV cache asks for late ones
    alone)."""
    rng = random.Random(seed)
    positions = torch.tensor(rng.sample(range(5000), rng.randint(1, 6)))
    theta = torch.rand(rng.randint(1, 9), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    scale = rng.choice([1.0, 1.25])
    cos, sin = rope_cos_sin(positions, theta, scale)
    half = len(theta)
    assert cos.shape == sin.shape == (len(positions), 2 * half) and cos.dtype == sin.dtype == torch.float64
    for row, m in enumerate(positions.tolist()):
        for i, t in enumerate(theta.tolist()):
            for column, sign in ((i, -1), (i + half, 1)):
                where = f"[{row}, {column}] at position {m}"
                near(cos[row, column].item(), scale * math.cos(m * t), 1e-9, f"cos{where}", cos.dtype)
                near(sin[row, column].item(), sign * scale * math.sin(m * t), 1e-9, f"sin{where}", sin.dtype)


def tables_of(angle):
    """apply_rope's tables (rope_cos_sin's form) for angles (T, d/2), built here from the formula: cos of each
    angle twice, sin of -angle then +angle."""
    return torch.cat([angle, angle], dim=-1).cos(), torch.cat([-angle, angle], dim=-1).sin()


@pytest.mark.parametrize("seed", SEEDS)
def test_apply_rope_turns_each_half_pair_by_plus_the_angle(seed):
    """Coordinates i and i + d/2 form a pair, turned by +angle: as the complex number x_i + j x_(i+d/2) times
    e^(j angle). Random batch, heads, length and head size; computed in cos's dtype, returned in x's."""
    rng = random.Random(seed)
    B, H, T, d = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 6), 2 * rng.randint(1, 8)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, T, d, dtype=torch.float64, generator=g)
    angle = 10 * torch.randn(T, d // 2, dtype=torch.float64, generator=g)
    out = apply_rope(x, *tables_of(angle))
    assert out.shape == x.shape and out.dtype == x.dtype
    turned = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * torch.polar(torch.ones_like(angle), angle)
    expected = torch.cat([turned.real, turned.imag], dim=-1)
    close(
        out,
        expected,
        "apply_rope must turn each pair (x_i, x_(i+d/2)) by +angle: (x cos - y sin, x sin + y cos)",
        rtol=0,
        atol=1e-12,
    )
    assert apply_rope(x.float(), *tables_of(angle)).dtype == torch.float32


@pytest.mark.parametrize("seed", SEEDS)
def test_apply_rope_turns_only_the_first_d_dimensions(seed):
    """Partial rotation (rope_fraction < 1): with cos and sin for d < head_dim dimensions, the first d turn as
    a head of size d would, halves within them, and the rest pass unchanged."""
    rng = random.Random(seed)
    d = 2 * rng.randint(1, 6)
    head_dim = d + rng.randint(1, 8)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, rng.randint(1, 5), head_dim, dtype=torch.float64, generator=g)
    angle = 10 * torch.randn(x.size(1), d // 2, dtype=torch.float64, generator=g)
    out = apply_rope(x, *tables_of(angle))
    assert out.shape == x.shape
    turned = torch.complex(x[..., : d // 2], x[..., d // 2 : d]) * torch.polar(torch.ones_like(angle), angle)
    close(
        out[..., :d],
        torch.cat([turned.real, turned.imag], dim=-1),
        f"the first {d} dimensions, turned",
        rtol=0,
        atol=1e-12,
    )
    assert torch.equal(out[..., d:], x[..., d:]), "the dimensions past d carry no position: unchanged"


def test_apply_rope_worked_by_hand():
    """d = 4, x = (1, 2, 3, 4), angles (pi/2, pi): pair (1, 3) turns a quarter to (-3, 1), pair (2, 4) half a
    turn to (-2, -4): (-3, -2, 1, -4). Turning by -angle gives (3, -2, -1, -4); RoFormer's interleaved pairs
    (-2, 1, -3, -4)."""
    angle = torch.tensor([[math.pi / 2, math.pi]], dtype=torch.float64)
    out = apply_rope(torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64), *tables_of(angle))
    close(
        out,
        torch.tensor([[-3.0, -2.0, 1.0, -4.0]], dtype=torch.float64),
        "x = (1, 2, 3, 4) turned by (pi/2, pi)",
        rtol=0,
        atol=1e-15,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_rope_scores_depend_only_on_the_offset_at_random_sizes(seed):
    """<R_m q, R_n k> = <R_(m+s) q, R_(n+s) k> for random head sizes, bases, positions and shifts, with the
    three functions together as RotaryPositions uses them; and the rotation keeps every norm."""
    rng = random.Random(seed)
    d, base = 2 * rng.randint(1, 16), rng.choice([100.0, 10000.0, 1e6])
    inv_freq = rope_inv_freq(d, base)
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, d, dtype=torch.float64, generator=g)

    def turned(x, m):
        return apply_rope(x, *rope_cos_sin(torch.tensor([m]), inv_freq))[0]

    for _ in range(5):
        m, n, shift = rng.randint(0, 500), rng.randint(0, 500), rng.randint(1, 10_000)
        score = turned(q, m) @ turned(k, n)
        near(
            (turned(q, m + shift) @ turned(k, n + shift)).item(),
            score.item(),
            1e-9,
            f"the score at positions ({m + shift}, {n + shift}), against ({m}, {n})",
            q.dtype,
        )
        near(
            turned(q, m).norm().item(),
            q.norm().item(),
            1e-12,
            f"the norm of q turned to position {m}",
            q.dtype,
        )
    assert not torch.allclose(turned(q, 1), q[0]), "position 1 must turn q"


# -----------------------------------------------------------------------------
# ex4: ALiBi


@pytest.mark.parametrize("seed", SEEDS)
def test_alibi_slopes_at_random_head_counts(seed):
    """For n heads, P the largest power of two <= n: heads 0 .. P-1 get r^1, r^2, ..., r^P with r = 2^(-8/P),
    the steepest first; heads P .. n-1 the odd powers r'^1, r'^3, ... of r' = 2^(-8/(2P)) (Press et al.'s
    code)."""
    rng = random.Random(seed)
    for n in [2 ** rng.randint(0, 6), *rng.sample(range(1, 80), 5)]:
        slopes = alibi_slopes(n)
        P = 2 ** math.floor(math.log2(n))
        assert slopes.shape == (n,), slopes.shape
        assert abs(slopes[0].item() - 2 ** (-8 / P)) < 1e-7, (
            f"alibi_slopes({n})[0] must be the steepest slope 2^(-8/{P}) = {2 ** (-8 / P):.4g}, got "
            f"{slopes[0].item():.4g} (the first slopes: {[round(m, 4) for m in slopes[:4].tolist()]})"
        )
        for h in range(n):
            expected = 2 ** (-8 / P * (h + 1)) if h < P else 2 ** (-8 / (2 * P) * (2 * (h - P) + 1))
            near(slopes[h].item(), expected, 1e-7, f"alibi_slopes({n})[{h}]", slopes.dtype)


@pytest.mark.parametrize("seed", SEEDS)
def test_alibi_bias_between_any_positions(seed):
    """alibi_bias_at(slopes, query_pos, key_pos)[h, a, b] = -m_h (query_pos[a] - key_pos[b]), whatever the
    positions (a KV cache holds them out of order), in the slopes' dtype."""
    rng = random.Random(seed)
    slopes = torch.rand(rng.randint(1, 5), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    query_pos = torch.tensor([rng.randint(0, 200) for _ in range(rng.randint(1, 5))])
    key_pos = torch.tensor([rng.randint(0, 200) for _ in range(rng.randint(1, 7))])
    bias = alibi_bias_at(slopes, query_pos, key_pos)
    assert bias.shape == (len(slopes), len(query_pos), len(key_pos)) and bias.dtype == torch.float64
    for h, m in enumerate(slopes.tolist()):
        for a, i in enumerate(query_pos.tolist()):
            for b, j in enumerate(key_pos.tolist()):
                near(
                    bias[h, a, b].item(),
                    -m * (i - j),
                    1e-12,
                    f"bias[{h}, {a}, {b}] (query {i}, key {j})",
                    bias.dtype,
                )


@pytest.mark.parametrize("seed", SEEDS)
def test_alibi_bias_puts_the_queries_last(seed):
    """alibi_bias(slopes, n_query, n_key): the queries are the last n_query of the n_key positions."""
    rng = random.Random(seed)
    n_key = rng.randint(1, 9)
    n_query = rng.randint(1, n_key)
    slopes = torch.rand(rng.randint(1, 4), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    bias = alibi_bias(slopes, n_query, n_key)
    assert bias.shape == (len(slopes), n_query, n_key)
    for h, m in enumerate(slopes.tolist()):
        for a in range(n_query):
            for j in range(n_key):
                near(
                    bias[h, a, j].item(),
                    -m * (n_key - n_query + a - j),
                    1e-12,
                    f"bias[{h}, {a}, {j}]",
                    bias.dtype,
                )


# -----------------------------------------------------------------------------
# ex5: the causal mask


@pytest.mark.parametrize("seed", range(5))
def test_causal_mask_matches_its_definition_at_random_positions(seed):
    """Query i sees key j iff j >= 0 (-1: an empty cache slot), j <= i and, with a window W, i - j < W; for
    positions in any order, as a KV cache's ring holds them. -> (n_query, n_key) bool"""
    rng = random.Random(seed)
    query_pos = torch.tensor(sorted(rng.sample(range(60), rng.randint(1, 6))))
    key_pos = torch.tensor([rng.choice([-1, *range(60)]) for _ in range(rng.randint(1, 12))])
    for window in (None, rng.randint(1, 10)):
        mask = causal_mask(query_pos, key_pos, window)
        assert mask.shape == (len(query_pos), len(key_pos)) and mask.dtype == torch.bool
        for a, i in enumerate(query_pos.tolist()):
            for b, j in enumerate(key_pos.tolist()):
                sees = j >= 0 and j <= i and (window is None or i - j < window)
                assert mask[a, b].item() == sees, (
                    f"query {i}, key {j}, window {window}: should see it: {sees}"
                )


def test_causal_mask_worked_by_hand():
    """Queries 2 and 3 over keys 0, 1, 2, 3 and an empty slot: causal, then with a window of 2."""
    query_pos, key_pos = torch.tensor([2, 3]), torch.tensor([0, 1, 2, 3, -1])
    for window, expected in (
        (None, [[True, True, True, False, False], [True, True, True, True, False]]),
        (2, [[False, True, True, False, False], [False, False, True, True, False]]),
    ):
        got = causal_mask(query_pos, key_pos, window).tolist()
        assert got == expected, (
            f"causal_mask([2, 3], [0, 1, 2, 3, -1], {window}): got {got}, expected {expected}"
        )


# -----------------------------------------------------------------------------
# ex6: the KV cache


def fill_cache(seed):
    """A layer's KVCache (random window, chunk and length) fed keys and values in random chunks, as
    GPT.forward does (the key positions from cached_key_positions, then update).
    -> yields (cache, window, query_pos, key_pos, k_all, v_all, {position: (k, v)}) per step"""
    rng = random.Random(seed)
    window, chunk, max_len = rng.choice([None, rng.randint(1, 6)]), rng.randint(1, 7), rng.randint(8, 30)
    size = GPT.cache_size(max_len, window, chunk)
    cache = KVCache(2, 3, size, 4, torch.float32, "cpu", ring=size < max_len)  # (B=2, n_head=3, size, hs=4)
    g = torch.Generator().manual_seed(seed)
    given, seen = {}, 0
    while seen < max_len:
        T = min(rng.randint(1, chunk), max_len - seen)
        query_pos = torch.arange(seen, seen + T)
        k, v = torch.randn(2, 2, 3, T, 4, generator=g)
        key_pos = cached_key_positions(query_pos[-1:] + 1, size)
        k_all, v_all = cache.update(query_pos, k, v, size)  # every slot, as a compiled step attends
        given |= {seen + t: (k[:, :, t], v[:, :, t]) for t in range(T)}
        seen += T
        yield cache, window, chunk, query_pos, key_pos, k_all, v_all, given


@pytest.mark.parametrize("seed", range(6))
def test_kv_cache_hands_each_query_exactly_the_keys_it_may_see(seed):
    """At every step, among the keys update hands back, those a query i may see (position j >= 0, j <= i,
    within the window) are exactly positions max(0, i - W + 1) .. i, each once, with the keys and values given
    for them; a windowed cache holds no more than W + chunk - 1 slots."""
    for cache, window, chunk, query_pos, key_pos, k_all, v_all, given in fill_cache(seed):
        assert k_all.shape[2] == v_all.shape[2] == key_pos.numel(), "one key position per key handed back"
        for i in query_pos.tolist():
            visible = [
                (slot, j)
                for slot, j in enumerate(key_pos.tolist())
                if 0 <= j <= i and (window is None or i - j < window)
            ]
            first = 0 if window is None else max(0, i - window + 1)
            assert sorted(j for _, j in visible) == list(range(first, i + 1)), (
                f"query {i} (window {window}) should see keys {first}..{i}, "
                f"it gets {sorted(j for _, j in visible)}"
            )
            for slot, j in visible:
                k_j, v_j = given[j]
                same = torch.equal(k_all[:, :, slot], k_j) and torch.equal(v_all[:, :, slot], v_j)
                assert same, (
                    f"the key or value handed back for position {j} (slot {slot}) is not the one given"
                )
        if window is not None:
            assert cache.k.size(2) <= window + chunk - 1, (
                "a sliding window needs a ring of window + chunk - 1 slots"
            )


@pytest.mark.parametrize("seed", range(4))
def test_kv_cache_keeps_position_p_in_slot_p_mod_size(seed):
    """Position p is written in slot p % size, and cached_key_positions says so, for every position the cache
    still holds (the latest min(seen, size))."""
    for cache, _, _, query_pos, key_pos, _, _, given in fill_cache(seed):
        size, seen = cache.k.size(2), query_pos[-1].item() + 1
        for p in range(max(0, seen - size), seen):
            slot = p % size
            assert key_pos[slot].item() == p, f"slot {slot} should hold position {p}"
            k_p, v_p = given[p]
            same = torch.equal(cache.k[:, :, slot], k_p) and torch.equal(cache.v[:, :, slot], v_p)
            assert same, f"slot {slot} should hold the key and value given for position {p}"


@pytest.fixture
def given_causal_mask(monkeypatch):
    """The cached forward masks every slot through positions.causal_mask (ex5): here a reference, so that
    ex6's model-level tests grade ex6 alone."""

    def causal_mask(query_pos, key_pos, window=None):
        i, j = torch.meshgrid(query_pos, key_pos, indexing="ij")
        seen = (j >= 0) & (j <= i)
        return seen if window is None else seen & (i - j < window)

    monkeypatch.setattr(positions, "causal_mask", causal_mask)


@pytest.mark.parametrize("seed", SEEDS)
def test_decoding_one_token_at_a_time_matches_the_full_forward_past_block_size(seed, given_causal_mask):
    """Feeding a NoPE model one token at a time through its KV caches (positions counting past block_size)
    gives the logits of one forward pass over the whole sequence, at every position."""
    rng = random.Random(seed)
    model_ = nope_model(seed, n_layer=rng.randint(1, 2))
    length = rng.randint(9, 32)
    idx = torch.randint(0, 32, (rng.randint(1, 2), length), generator=torch.Generator().manual_seed(seed))
    full, _ = model_(idx)
    model_.setup_cache(idx.size(0), length)
    stepped = torch.cat(
        [model_(idx[:, t : t + 1], input_pos=torch.tensor([t]))[0] for t in range(length)], dim=1
    )
    close(
        stepped, full, "the logits decoded one token at a time, against one forward pass", rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_decoding_in_a_window_sees_only_the_latest_tokens(seed, given_causal_mask):
    """With a window W, a one-layer NoPE model decoding token t sees tokens t - W + 1 .. t: its logits are
    those of a forward pass over just those tokens (without positions, where they stand does not matter)."""
    rng = random.Random(seed)
    model_ = nope_model(seed, n_layer=1)
    window, length = rng.randint(1, 6), rng.randint(10, 24)
    idx = torch.randint(0, 32, (1, length), generator=torch.Generator().manual_seed(seed))
    model_.setup_cache(1, length, window)
    for t in range(length):
        logits = model_(idx[:, t : t + 1], input_pos=torch.tensor([t]))[0][:, -1]
        alone = model_(idx[:, max(0, t - window + 1) : t + 1])[0][:, -1]
        close(logits, alone, f"token {t}, window {window}", rtol=0, atol=1e-10)
