"""Property tests that grade the course's later exercises (ex7-ex12: RoPE's context extension, the YaRN ramp,
the permutation measure, the position probe, T5's buckets, FIRE's interpolation), as
tests/test_exercise_properties.py grades ex1-ex6, with its helpers: random sizes and seeds, a value worked by
hand where a convention matters, each test calling the functions of its own exercise only."""

import math
import random

import pytest
import torch
from test_exercise_properties import SEEDS, close, near, nope_model

import positions
from lab.measure import instruments
from positions import fire_input, rope_frequencies, t5_bucket, yarn_ramp

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
