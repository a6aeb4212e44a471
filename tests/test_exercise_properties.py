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
from lab.measure import instruments
from model import GPT, GPTConfig, KVCache
from positions import (
    LearnedPositions,
    alibi_bias,
    alibi_bias_at,
    alibi_slopes,
    apply_rope,
    cached_key_positions,
    causal_mask,
    fire_input,
    rope_cos_sin,
    rope_frequencies,
    rope_inv_freq,
    sinusoidal_embedding,
    t5_bucket,
    yarn_ramp,
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
def test_learned_check_length_refuses_only_past_block_size(seed):
    """check_length(n) is silent for every n up to block_size and a ValueError naming block_size past it."""
    block = random.Random(seed).randint(1, 40)
    table = LearnedPositions(GPTConfig.from_flat(block_size=block, n_embd=8, n_head=2, pos="learned"))
    for n in range(1, block + 1):
        table.check_length(n)
    for n in (block + 1, 2 * block + 3):
        with pytest.raises(ValueError, match=f"block_size={block}"):
            table.check_length(n)


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


# -----------------------------------------------------------------------------
# ex7: RoPE context extension. rope_frequencies builds on rope_inv_freq (ex3) and yarn_ramp (ex8): here both
# are given, so that ex7 is graded alone.


def given_theta(dim, base=10000.0):
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


def given_ramp(dim, base, original_len, beta_fast=32, beta_slow=1):
    """A stand-in for YaRN's ramp: any values in [0, 1] show how rope_frequencies blends with it."""
    return torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64) ** 2


@pytest.fixture
def given_parts(monkeypatch):
    monkeypatch.setattr(positions, "rope_inv_freq", given_theta)
    monkeypatch.setattr(positions, "yarn_ramp", given_ramp)


def shapes(seed):
    rng = random.Random(seed)
    return (
        2 * rng.randint(2, 32),
        rng.choice([500.0, 10000.0, 1e6]),
        rng.uniform(1.5, 16.0),
        rng.randint(8, 4096),
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_rope_frequencies_at_factor_one_are_plain_rope(given_parts, seed):
    """Without scaling, and with any scaling at factor 1: theta_i = rope_inv_freq(d, base) in float32, and an
    attention scale of 1."""
    d, base, _, T = shapes(seed)
    for scaling in (None, *positions.ROPE_SCALINGS):
        inv_freq, scale = rope_frequencies(d, base, scaling, 1.0, original_len=T, seq_len=T)
        assert inv_freq.dtype == torch.float32, scaling
        close(inv_freq, given_theta(d, base).float(), f"scaling={scaling}, factor 1")
        assert scale == 1.0, scaling


@pytest.mark.parametrize("seed", SEEDS)
def test_linear_scaling_divides_theta_by_the_factor(given_parts, seed):
    """Position interpolation: theta_i / s, attention scale 1."""
    d, base, s, T = shapes(seed)
    inv_freq, scale = rope_frequencies(d, base, "linear", s, original_len=T)
    close(inv_freq.double(), given_theta(d, base) / s, f"linear, factor {s:.4g}", rtol=1e-6, atol=0)
    assert scale == 1.0


@pytest.mark.parametrize("seed", SEEDS)
def test_ntk_scaling_raises_the_base(given_parts, seed):
    """NTK-aware: base' = base s^(d/(d-2)): the fastest pair keeps theta_0 = 1,
    the slowest is divided by s."""
    d, base, s, T = shapes(seed)
    inv_freq, scale = rope_frequencies(d, base, "ntk", s, original_len=T)
    close(
        inv_freq.double(),
        given_theta(d, base * s ** (d / (d - 2))),
        f"ntk, factor {s:.4g}",
        rtol=1e-6,
        atol=0,
    )
    assert inv_freq[0] == 1.0 and scale == 1.0
    assert abs(inv_freq[-1].item() * s / given_theta(d, base)[-1].item() - 1) < 1e-5


@pytest.mark.parametrize("seed", SEEDS)
def test_dynamic_ntk_follows_the_current_length(given_parts, seed):
    """Dynamic NTK at length L: plain RoPE while L <= T, then base' = base (s L / T - (s - 1))^(d/(d-2))."""
    d, base, s, T = shapes(seed)
    for L in (1, T // 2 + 1, T):
        inv_freq, _ = rope_frequencies(d, base, "dynamic", s, original_len=T, seq_len=L)
        close(inv_freq, given_theta(d, base).float(), f"L = {L} <= T = {T}")
    for L in (T + 1, 3 * T, int(s * T) + 5):
        inv_freq, scale = rope_frequencies(d, base, "dynamic", s, original_len=T, seq_len=L)
        grown = base * (s * L / T - (s - 1)) ** (d / (d - 2))
        close(inv_freq.double(), given_theta(d, grown), f"L = {L} > T = {T}", rtol=1e-6, atol=0)
        assert scale == 1.0


@pytest.mark.parametrize("seed", SEEDS)
def test_yarn_blends_theta_by_its_ramp_and_scales_attention(given_parts, seed):
    """YaRN: theta_i / s where the ramp is 1, theta_i where it is 0, linear between (the ramp is given here:
    ex8 writes it); attention scale 0.1 ln s + 1."""
    d, base, s, T = shapes(seed)
    inv_freq, scale = rope_frequencies(d, base, "yarn", s, original_len=T)
    ramp, theta = given_ramp(d, base, T), given_theta(d, base)
    close(
        inv_freq.double(), theta / s * ramp + theta * (1 - ramp), f"yarn, factor {s:.4g}", rtol=1e-6, atol=0
    )
    near(scale, 0.1 * math.log(s) + 1, 1e-12, f"yarn's attention scale at factor {s:.4g}")


@pytest.mark.parametrize("seed", SEEDS)
def test_longrope_divides_theta_by_the_short_or_long_factors(given_parts, seed):
    """LongRoPE: theta_i / short_i while the length is at most T (or not given), theta_i / long_i past it; the
    attention scale as given, else sqrt(1 + ln s / ln T); no factors is a ValueError."""
    d, base, s, T = shapes(seed)
    rng = random.Random(seed)
    short = sorted(rng.uniform(1.0, 2.0) for _ in range(d // 2))
    long = sorted(rng.uniform(1.0, 2.0 * s) for _ in range(d // 2))
    factors = dict(short_factor=short, long_factor=long)
    for L, divisors in ((None, short), (T, short), (T + 1, long), (int(s * T), long)):
        inv_freq, scale = rope_frequencies(d, base, "longrope", s, T, L, **factors)
        expected = given_theta(d, base) / torch.tensor(divisors, dtype=torch.float64)
        close(inv_freq.double(), expected, f"longrope at L = {L}, T = {T}", rtol=1e-6, atol=0)
        near(scale, math.sqrt(1 + math.log(s) / math.log(T)), 1e-12, f"longrope's scale at s = {s:.4g}")
    assert rope_frequencies(d, base, "longrope", s, T, T + 1, **factors, attention_factor=1.3)[1] == 1.3
    with pytest.raises(ValueError):
        rope_frequencies(d, base, "longrope", s, T, T + 1)


def test_rope_frequencies_refuse_what_they_cannot_extend(given_parts):
    """An unknown scaling, a factor below 1, and dynamic or yarn without the lengths they need: ValueError."""
    for kwargs in (
        dict(scaling="cubic"),
        dict(scaling="linear", factor=0.5),
        dict(scaling="dynamic", factor=2.0),
        dict(scaling="yarn", factor=2.0),
    ):
        with pytest.raises(ValueError):
            rope_frequencies(16, 10000.0, **kwargs)


# -----------------------------------------------------------------------------
# ex8: the YaRN ramp


def test_yarn_ramp_worked_by_hand():
    """d = 8, T = 64: i(32) = -0.497, i(1) = 1.008, so low 0, high 2: (0, 0.5, 1, 1). d = 16: low 0, high 3:
    (0, 1/3, 2/3, 1, 1, 1, 1, 1). d = 8, T = 4: i(1) = -0.196, so high = low = 0, +0.001 as released:
    (0, 1, 1, 1)."""
    close(
        yarn_ramp(8, 10000.0, 64),
        torch.tensor([0, 0.5, 1, 1], dtype=torch.float64),
        "yarn_ramp(8, 10000.0, 64)",
    )
    close(
        yarn_ramp(16, 10000.0, 64),
        torch.tensor([0, 1 / 3, 2 / 3, 1, 1, 1, 1, 1], dtype=torch.float64),
        "yarn_ramp(16, 10000.0, 64)",
    )
    close(
        yarn_ramp(8, 10000.0, 4), torch.tensor([0, 1, 1, 1], dtype=torch.float64), "yarn_ramp(8, 10000.0, 4)"
    )


@pytest.mark.parametrize("seed", range(5))
def test_yarn_ramp_keeps_fast_pairs_and_moves_slow_ones(seed):
    """Pair i turns r_i = T theta_i / 2 pi times over T. Its ramp is 0 (theta kept) where r_i > beta_fast, 1
    (theta / s) where r_i < beta_slow, and in between it climbs in equal steps of the pair index."""
    rng = random.Random(seed)
    d, base, T = 2 * rng.randint(2, 64), rng.choice([1000.0, 10000.0, 5e5]), rng.randint(16, 8192)
    beta_fast, beta_slow = rng.choice([16, 32, 64]), rng.choice([1, 2])
    ramp = yarn_ramp(d, base, T, beta_fast, beta_slow)
    assert ramp.shape == (d // 2,) and ramp.dtype == torch.float64
    rotations = [T * base ** (-2 * i / d) / (2 * math.pi) for i in range(d // 2)]
    for i, r in enumerate(rotations):
        if r > beta_fast:
            assert ramp[i] == 0, f"pair {i} turns {r:.1f} > {beta_fast} times: keep it (ramp 0)"
        if r < beta_slow:
            assert ramp[i] == 1, f"pair {i} turns {r:.2f} < {beta_slow} times: interpolate it (ramp 1)"
    assert (ramp.diff() >= 0).all() and ramp.min() >= 0 and ramp.max() <= 1, ramp
    between = ramp[(ramp > 0) & (ramp < 1)]
    if len(between) > 1:
        close(
            between.diff(),
            torch.full_like(between.diff(), between.diff()[0].item()),
            "the steps of the ramp between 0 and 1",
        )


# -----------------------------------------------------------------------------
# ex9: the permutation-equivariance measure


@pytest.mark.parametrize("seed", range(4))
def test_swap_permutation_puts_the_last_piece_first_at_random_sizes(seed):
    """(A + middle + B)[perm] = B + middle + A, for pieces of any length (the middle may be empty)."""
    rng = random.Random(seed)
    a, mid, b = rng.randint(1, 5), rng.randint(0, 5), rng.randint(1, 5)
    pieces = [list(range(100, 100 + a)), list(range(200, 200 + mid)), list(range(300, 300 + b))]
    perm = instruments.swap_permutation(pieces)
    tokens = torch.tensor(pieces[0] + pieces[1] + pieces[2])
    assert tokens[perm].tolist() == pieces[2] + pieces[1] + pieces[0]


@pytest.mark.parametrize("seed", SEEDS)
def test_swap_differences_is_the_largest_gap_up_to_the_permutation(seed):
    """For each hidden state: the largest |h(permuted)[where token i went] - h(original)[i]| over the given
    words, and over the other tokens (0 when there are none). Checked against the hidden states themselves for
    a random permutation of a random sentence; without the mask a NoPE model gives 0 up to rounding
    (equivariance)."""
    rng = random.Random(seed)
    model_ = nope_model(seed, n_layer=rng.randint(1, 2))
    T = rng.randint(3, 10)
    ids = torch.randint(0, 32, (T,), generator=torch.Generator().manual_seed(seed))
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(seed + 1))
    words = sorted(rng.sample(range(T), rng.randint(1, T)))
    rows = instruments.swap_differences(model_, ids, ids[perm], perm, words)
    states = instruments.hidden_states(model_, ids[None])
    permuted = instruments.hidden_states(model_, ids[perm][None])
    assert len(rows) == len(states) == model_.config.n_layer + 1
    where = {i: q for q, i in enumerate(perm.tolist())}  # token i of the original is at position where[i]
    for h, h_perm, row in zip(states, permuted, rows):
        gaps = [(h_perm[0, where[i]] - h[0, i]).abs().max().item() for i in range(T)]
        rest = [gaps[i] for i in range(T) if i not in words]
        assert row == pytest.approx(
            (max(gaps[i] for i in words), max(rest) if rest else 0.0), rel=1e-12, abs=0
        )
    unmasked = instruments.swap_differences(model_, ids, ids[perm], perm, words, mask=False)
    assert max(max(row) for row in unmasked) < 1e-12


# -----------------------------------------------------------------------------
# ex10: the position probe


@pytest.mark.parametrize("seed", SEEDS)
def test_probe_targets_match_a_loop_at_random_windows(seed):
    """Per token: its position in the window, and how far back the latest newline at or before it is (NaN when
    none is in the window), as two (N, T) float64 tensors."""
    rng = random.Random(seed)
    n, T, newline = rng.randint(1, 5), rng.randint(1, 20), rng.randint(0, 3)
    windows = torch.randint(0, 4, (n, T), generator=torch.Generator().manual_seed(seed))
    position, distance = instruments.probe_targets(windows, newline)
    assert position.shape == distance.shape == (n, T) and position.dtype == distance.dtype == torch.float64
    for w in range(n):
        latest = None
        for t in range(T):
            latest = t if windows[w, t] == newline else latest
            assert position[w, t] == t
            if latest is None:
                assert distance[w, t].isnan(), (w, t)
            else:
                assert distance[w, t] == t - latest, (w, t)


@pytest.mark.parametrize("seed", SEEDS)
def test_fit_ridge_solves_the_centred_normal_equations(seed):
    """Without a ridge an exact linear relation y = X w + b is recovered. With one, the weights solve
    (Xc^T Xc + lambda I) w = Xc^T (y - mean y), lambda = ridge x the mean diagonal of Xc^T Xc (Xc: X centred),
    and the intercept is not penalised: the residuals average to 0."""
    rng = random.Random(seed)
    N, C = rng.randint(20, 60), rng.randint(1, 6)
    g = torch.Generator().manual_seed(seed)
    X = 3 * torch.randn(N, C, dtype=torch.float64, generator=g) + 5
    w_true, b_true = torch.randn(C, dtype=torch.float64, generator=g), rng.uniform(-10, 10)
    w, b = instruments.fit_ridge(X, X @ w_true + b_true, 0.0)
    close(w, w_true, "the weights of an exact linear relation, without a ridge", rtol=0, atol=1e-9)
    near(float(b), b_true, 1e-8, "its intercept")
    y = torch.randn(N, dtype=torch.float64, generator=g)
    ridge = rng.choice([1e-3, 0.1, 2.0])
    w, b = instruments.fit_ridge(X, y, ridge)
    Xc = X - X.mean(dim=0)
    penalty = ridge * (Xc.T @ Xc).diagonal().mean()
    close(
        Xc.T @ (Xc @ w - (y - y.mean())) + penalty * w,
        torch.zeros(C, dtype=torch.float64),
        f"the normal equations' residual at ridge {ridge}",
        rtol=0,
        atol=1e-9,
    )
    near((y - X @ w - b).mean().item(), 0.0, 1e-12, "the mean residual (an unpenalised intercept makes it 0)")


def test_r_squared_worked_by_hand():
    """R^2 = 1 - sum (y - prediction)^2 / sum (y - mean y)^2, a float: 1 for a perfect fit, 0 for the mean,
    0.8 for y = (1, 2, 3, 4) and prediction (1, 2, 3, 5) (1 - 1/5)."""
    y = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    assert instruments.r_squared(y, y) == 1.0
    assert instruments.r_squared(y, torch.full_like(y, 2.5)) == 0.0
    value = instruments.r_squared(y, torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64))
    assert isinstance(value, float), f"r_squared returns a Python float, got {type(value).__name__}"
    near(value, 0.8, 1e-12, "r_squared((1, 2, 3, 4), (1, 2, 3, 5))")


# -----------------------------------------------------------------------------
# ex11: T5's buckets


def t5_bucket_sizes(rng):
    """Random (num_buckets, max_distance): an even count of buckets, max_distance past the exact half."""
    num_buckets = 2 * rng.randint(2, 32)
    return num_buckets, rng.randint(num_buckets // 2 + 1, 600)


@pytest.mark.parametrize("seed", SEEDS)
def test_t5_bucket_follows_its_formula_at_random_sizes(seed):
    """With n = num_buckets / 2: bucket d for d < n, else min(n + floor(ln(d / n) / ln(max_distance / n)
    (num_buckets - n)), num_buckets - 1). T5 computes the log in float32: where the exact value lies within
    1e-4 of a bucket border, either side is accepted."""
    rng = random.Random(seed)
    num_buckets, max_distance = t5_bucket_sizes(rng)
    n = num_buckets // 2
    distance = torch.tensor([*range(3 * max_distance), *rng.sample(range(10**6), 50)])
    buckets = t5_bucket(distance, num_buckets, max_distance)
    assert buckets.shape == distance.shape and buckets.dtype == torch.long, (buckets.shape, buckets.dtype)
    for d, got in zip(distance.tolist(), buckets.tolist()):
        if d < n:
            assert got == d, f"t5_bucket({d}) with {num_buckets} buckets: got {got}, expected {d} (exact)"
            continue
        exact = n + math.log(d / n) / math.log(max_distance / n) * (num_buckets - n)
        allowed = {min(math.floor(exact + e), num_buckets - 1) for e in (-1e-4, 0, 1e-4)}
        assert got in allowed, (
            f"t5_bucket({d}, {num_buckets}, {max_distance}): got {got}, expected {sorted(allowed)} "
            f"(n + ln(d/n) / ln(max_distance/n) (num_buckets - n) = {exact:.6f}, capped at {num_buckets - 1})"
        )


@pytest.mark.parametrize("seed", SEEDS)
def test_t5_bucket_is_monotone_exact_below_half_and_capped_from_max_distance(seed):
    """Buckets never decrease with the distance; d < num_buckets / 2 is its own bucket; every
    d >= max_distance is in the last, num_buckets - 1; a later key (d < 0) is bucket 0; a 2-D grid of
    distances i - j gets the bucket of each entry."""
    rng = random.Random(seed)
    num_buckets, max_distance = t5_bucket_sizes(rng)
    distance = torch.arange(-9, 4 * max_distance)
    buckets = t5_bucket(distance, num_buckets, max_distance)
    assert (buckets[1:] >= buckets[:-1]).all(), "buckets must not decrease as the distance grows"
    assert (buckets[distance < 0] == 0).all(), "a later key counts as distance 0"
    small = (distance >= 0) & (distance < num_buckets // 2)
    assert torch.equal(buckets[small], distance[small]), "each d < num_buckets / 2 is its own bucket"
    far = buckets[distance >= max_distance]
    assert (far == num_buckets - 1).all(), (
        f"every d >= max_distance={max_distance} is in bucket {num_buckets - 1}"
    )
    grid = torch.arange(9)[:, None] - torch.arange(9)[None, :]  # i - j over a 9 x 9 grid
    assert torch.equal(t5_bucket(grid, num_buckets, max_distance), buckets[grid + 9]), "entrywise on a grid"


def test_t5_bucket_worked_by_hand():
    """T5's 32 buckets to 128: 0 .. 15 exact, then 16 -> 16, 20 -> 17 (16 + floor(16 ln 1.25 / ln 8) = 16 +
    floor(1.717)), 32 -> 21, 64 -> 26, 112 -> 30, 113 -> 31, 10^6 -> 31."""
    distance = torch.tensor([0, 7, 15, 16, 20, 32, 64, 112, 113, 10**6])
    expected = [0, 7, 15, 16, 17, 21, 26, 30, 31, 31]
    assert t5_bucket(distance).tolist() == expected, (
        f"got {t5_bucket(distance).tolist()}, expected {expected}"
    )


# -----------------------------------------------------------------------------
# ex12: FIRE's progressive interpolation


def fire_settings(rng):
    """Random c > 0 and L >= 1, float64 tensors."""
    c = torch.tensor(rng.uniform(0.01, 3.0), dtype=torch.float64)
    return c, torch.tensor(rng.uniform(1.0, 50.0), dtype=torch.float64)


@pytest.mark.parametrize("seed", SEEDS)
def test_fire_input_follows_its_formula_at_random_positions(seed):
    """fire_input(query_pos, key_pos, c, L)[a, b] = ln(1 + c (i - j)) / ln(1 + c max(L, i)) for query i =
    query_pos[a] and key j = key_pos[b] <= i, whatever the positions' order, in c's dtype."""
    rng = random.Random(seed)
    c, L = fire_settings(rng)
    query_pos = torch.tensor(rng.sample(range(300), rng.randint(1, 6)))
    key_pos = torch.tensor(rng.sample(range(300), rng.randint(1, 8)))
    x = fire_input(query_pos, key_pos, c, L)
    assert x.shape == (len(query_pos), len(key_pos)) and x.dtype == torch.float64, (x.shape, x.dtype)
    for a, i in enumerate(query_pos.tolist()):
        for b, j in enumerate(key_pos.tolist()):
            if j <= i:
                expected = math.log1p(c.item() * (i - j)) / math.log1p(c.item() * max(L.item(), i))
                near(
                    x[a, b].item(), expected, 1e-12, f"query {i}, key {j}, c={c.item():.4g}, L={L.item():.4g}"
                )


@pytest.mark.parametrize("seed", SEEDS)
def test_fire_input_is_in_0_1_zero_at_the_query_and_grows_with_the_distance(seed):
    """Over all 0 <= j <= i < 10 x 64: inputs in [0, 1] (no extrapolation, at any length), 0 at j = i, larger
    for a further key; for a fixed distance, no larger from a later query (a longer context squeezes it);
    a function of (i, i - j) alone: one pair at a time gives the grid's value."""
    rng = random.Random(seed)
    c, L = fire_settings(rng)
    pos = torch.arange(640)
    x = fire_input(pos, pos, c, L)
    causal = pos[:, None] >= pos[None, :]
    assert x[causal].min() >= 0 and x[causal].max() <= 1 + 1e-12, (x[causal].min(), x[causal].max())
    assert (x.diagonal() == 0).all(), "a query on itself (distance 0) gets input 0"
    closer = causal[:, 1:]  # (i, j + 1) with j + 1 <= i: key j is one further back than key j + 1
    assert (x[:, :-1][closer] > x[:, 1:][closer]).all(), "a further key gets a larger input"
    by_distance = [x.diagonal(-d) for d in (1, 5, 100)]  # (i, i - d) for i = d, d + 1, ...
    assert all((row[1:] <= row[:-1] + 1e-15).all() for row in by_distance), (
        "a later query squeezes a distance"
    )
    for i, j in [(rng.randrange(640), 0) for _ in range(5)] + [(639, rng.randrange(640)) for _ in range(5)]:
        one = fire_input(torch.tensor([i]), torch.tensor([j]), c, L)
        near(one.item(), x[i, j].item(), 1e-15, f"fire_input at ({i}, {j}) alone and in the grid")
