"""The lesson's claims about position encodings, each proved on the model's own code.

Float64 wherever the point is exactness; tiny shapes and fixed seeds everywhere.
"""

import math

import pytest
import torch

from model import GPT, CausalSelfAttention, GPTConfig
from positions import (
    POS_SCHEMES,
    POSITION_MODULES,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    overrides,
    rope_cos_sin,
    rope_frequencies,
    sinusoidal_embedding,
)


def tiny_config(pos, **overrides):
    fields = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, pos=pos)
    fields.update(overrides)
    return GPTConfig.from_flat(**fields)


def attention_layer(n_embd=16, n_head=2, seed=0):
    torch.manual_seed(seed)
    layer = CausalSelfAttention(tiny_config("none", n_embd=n_embd, n_head=n_head)).double()
    return layer.eval()


def rope_cos_sin_at(positions, head_dim, dtype=torch.float64):
    inv_freq, scale = rope_frequencies(head_dim)
    return rope_cos_sin(torch.as_tensor(positions), inv_freq.to(dtype), scale)


# -----------------------------------------------------------------------------
# 1-3. Attention without positions sees a set, not a sequence

NO_MASK = torch.zeros(1, 1, 1, 1)  # an additive mask of zeros: every query sees every key (no causal mask)


def test_attention_without_positions_or_mask_is_permutation_equivariant():
    """Attn(PX) = P Attn(X): with neither positions nor a mask, attention cannot see order at all."""
    layer = attention_layer()
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    for seed in range(5):
        perm = torch.randperm(10, generator=torch.Generator().manual_seed(seed))
        out_of_permuted = layer(x[:, perm], mask=NO_MASK)
        permuted_out = layer(x, mask=NO_MASK)[:, perm]
        torch.testing.assert_close(out_of_permuted, permuted_out, rtol=0, atol=1e-12)


def test_causal_mask_breaks_equivariance_but_not_within_the_prefix():
    """The trap: the causal mask makes the whole sequence order-dependent, yet the output at position i
    is unchanged by any reordering of the tokens before i, so one masked attention layer cannot tell a
    token 1 step back from one 500 steps back."""
    layer = attention_layer()
    T, i = 600, 599
    x = torch.randn(1, T, 16, dtype=torch.float64)
    perm = torch.randperm(T, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-6), (
        "the mask should break equivariance"
    )

    # move the token one step back to 500 steps back, and shuffle the rest of the prefix
    prefix = torch.arange(i)
    reordered = torch.cat(
        [prefix[torch.randperm(i, generator=torch.Generator().manual_seed(1))], torch.tensor([i])]
    )
    reordered[[i - 1, i - 500]] = reordered[[i - 500, i - 1]]
    out, out_reordered = layer(x), layer(x[:, reordered])
    torch.testing.assert_close(out_reordered[:, i], out[:, i], rtol=0, atol=1e-12)


def test_causal_mask_alone_lets_attention_count_from_a_distinct_first_token():
    """Why NoPE trains at all: in [BOS, a, a, a, ...] the token a at position i gives weight 1/(i + 1)-ish to
    BOS, so one masked layer with no positions already outputs something different at every position."""
    layer = attention_layer()
    bos, a = torch.randn(2, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    x = torch.cat([bos[None], a.expand(31, 16)])[None]  # (1, 32, 16)
    out = layer(x)[0, 1:]
    gaps = torch.cdist(out, out) + torch.eye(31, dtype=torch.float64)
    assert gaps.min() > 1e-6, "every position must be distinguishable"
    unmasked = layer(x, mask=NO_MASK)[0, 1:]
    torch.testing.assert_close(
        unmasked, unmasked[:1].expand(31, 16), rtol=0, atol=1e-12
    )  # no mask: no counting


def encode_with_scheme(pos, tokens, layer, table):
    """One unmasked attention layer over embedded tokens, with the scheme's position signal injected where the
    model injects it, through its own hooks at random weights: embed (added to the input), rotation (q and k
    turned) and score_bias (added to the scores, without the causal mask)."""
    torch.manual_seed(8)
    scheme = POSITION_MODULES[pos](tiny_config(pos, n_head=layer.n_head)).double()
    positions = torch.arange(len(tokens))
    x = scheme.embed(table[tokens][None], positions)  # (1, T, C)
    bias = scheme.score_bias(positions, positions)
    return layer(x, scheme.rotation(positions), NO_MASK if bias is None else bias)[0]


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_dog_bites_man_differs_from_man_bites_dog_only_with_positions(pos):
    """Without positions the two sentences give the same outputs up to the swap;
    each scheme tells them apart."""
    dog, bites, man = 3, 5, 9
    layer = attention_layer()
    table = torch.randn(16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    out_dbm = encode_with_scheme(pos, torch.tensor([dog, bites, man]), layer, table)
    out_mbd = encode_with_scheme(pos, torch.tensor([man, bites, dog]), layer, table)
    same_up_to_swap = torch.allclose(out_mbd, out_dbm[[2, 1, 0]], rtol=0, atol=1e-12)
    assert same_up_to_swap == (
        not any(overrides(POSITION_MODULES[pos], h) for h in ("embed", "rotation", "score_bias"))
    )


# -----------------------------------------------------------------------------
# 4-5. RoPE: rotations, so scores depend only on the offset


def rotation_matrix(position, inv_freq):
    """RoFormer's R_m (Su et al. 2021, eq. 13): block-diagonal 2x2 rotations by m * theta_i, on the
    interleaved pairs (2i, 2i+1). Built from explicit matrices, as the reference for apply_rope."""
    d = 2 * inv_freq.numel()
    R = torch.zeros(d, d, dtype=torch.float64)
    for i, theta in enumerate(inv_freq.double().tolist()):
        c, s = math.cos(position * theta), math.sin(position * theta)
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    return R


def rope_at(x, position):
    """apply_rope on one vector at one position, float64."""
    cos, sin = rope_cos_sin_at([position], x.numel())
    return apply_rope(x[None], cos, sin)[0]


def test_rope_score_depends_only_on_offset():
    """<R_m q, R_n k> is unchanged when m and n are shifted by the same constant."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 32, dtype=torch.float64, generator=g)
    for m, n in [(0, 0), (3, 1), (1, 3), (17, 250), (1000, 7)]:
        score = rope_at(q, m) @ rope_at(k, n)
        for shift in [1, 5, 123, 4096, 100_000]:
            shifted = rope_at(q, m + shift) @ rope_at(k, n + shift)
            assert abs(shifted - score) < 1e-10, (m, n, shift)


def test_rope_rotation_preserves_norm():
    """Rotations are isometries: |R_m x| = |x| at every position."""
    x = torch.randn(32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for m in [0, 1, 7, 63, 10_000]:
        assert abs(rope_at(x, m).norm() - x.norm()) < 1e-12


def test_rope_rotation_algebra():
    """R_m^T R_n = R_(n-m), R_m R_n = R_(m+n), det R_m = 1: the group structure behind the offset property."""
    inv_freq, _ = rope_frequencies(8)
    eye = torch.eye(8, dtype=torch.float64)
    for m, n in [(0, 5), (3, 1), (12, 40), (511, 2)]:
        Rm, Rn = rotation_matrix(m, inv_freq), rotation_matrix(n, inv_freq)
        torch.testing.assert_close(Rm.T @ Rn, rotation_matrix(n - m, inv_freq), rtol=0, atol=1e-10)
        torch.testing.assert_close(Rm @ Rn, rotation_matrix(m + n, inv_freq), rtol=0, atol=1e-10)
        torch.testing.assert_close(Rm.T @ Rm, eye, rtol=0, atol=1e-12)
        assert abs(torch.linalg.det(Rm) - 1) < 1e-12


def test_rope_toy_trace():
    """The lesson's hand computation: theta = pi/4, m = 3, n = 1, q = k = [1, 0]
    gives R_3 q = [-sqrt(2)/2, sqrt(2)/2], R_1 k = [sqrt(2)/2, sqrt(2)/2] and score 0."""
    theta = torch.tensor([math.pi / 4], dtype=torch.float64)
    q = k = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    rotated_q = apply_rope(q, *rope_cos_sin(torch.tensor([3]), theta))[0]
    rotated_k = apply_rope(k, *rope_cos_sin(torch.tensor([1]), theta))[0]
    h = math.sqrt(2) / 2
    torch.testing.assert_close(rotated_q, torch.tensor([-h, h], dtype=torch.float64), rtol=0, atol=1e-15)
    torch.testing.assert_close(rotated_k, torch.tensor([h, h], dtype=torch.float64), rtol=0, atol=1e-15)
    assert abs(rotated_q @ rotated_k) < 1e-15


def test_rope_rotate_half_equals_interleaved_under_a_fixed_permutation():
    """apply_rope pairs dimension i with i + d/2 (GPT-NeoX/Llama); RoFormer's R_m pairs 2i with 2i+1.
    With P sending coordinate 2i -> i and 2i+1 -> i + d/2, apply_rope(x) = P R_m P^T x for every m."""
    d = 16
    inv_freq, _ = rope_frequencies(d)
    interleaved_to_halves = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    P = torch.eye(d, dtype=torch.float64)[interleaved_to_halves]
    x = torch.randn(d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for m in [0, 1, 5, 300]:
        reference = P @ rotation_matrix(m, inv_freq) @ P.T @ x
        torch.testing.assert_close(rope_at(x, m), reference, rtol=0, atol=1e-12)


# -----------------------------------------------------------------------------
# 6. Sinusoidal: a shift is a linear map; the wavelengths span 2*pi to ~2*pi*10000


def shift_matrix(k, dim, base=10000.0):
    """M_k for the interleaved (sin, cos) pairs: sin(a + b) = cos(b) sin(a) + sin(b) cos(a) and
    cos(a + b) = -sin(b) sin(a) + cos(b) cos(a), with b = k * w_i. It depends on k, never on p."""
    M = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        b = k * base ** (-2 * i / dim)
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]], dtype=torch.float64
        )
    return M


def test_sinusoidal_shift_is_one_linear_map_for_all_positions():
    """For each offset k one fixed matrix M_k gives PE(p + k) = M_k PE(p) for every position p
    (Vaswani et al. 3.5: 'PE_pos+k can be represented as a linear function of PE_pos')."""
    dim, n_pos = 16, 2000
    pe = sinusoidal_embedding(n_pos + 600, dim, dtype=torch.float64)
    for k in [1, 2, 7, 50, 600]:
        M_k = shift_matrix(k, dim)
        torch.testing.assert_close(pe[:n_pos] @ M_k.T, pe[k : n_pos + k], rtol=0, atol=1e-10)
    # and no single matrix does this for two different offsets: the map encodes k itself
    assert not torch.allclose(pe[:n_pos] @ shift_matrix(1, dim).T, pe[2 : n_pos + 2])


def test_sinusoidal_wavelengths_for_gpt2_width():
    """d = 768: wavelength 2*pi*10000^(2i/d) is 6.28 (i=0), 13.54 (i=32), 135.37 (i=128),
    61,342.7 (i=383) tokens."""
    d = 768
    pe = sinusoidal_embedding(1, d, dtype=torch.float64)
    assert torch.equal(pe[0, 0::2], torch.zeros(d // 2, dtype=torch.float64))  # sin(0)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    wavelengths = 2 * math.pi / inv_freq
    expected = {0: 6.28, 32: 13.54, 128: 135.37, 383: 61342.7}
    for i, wavelength in expected.items():
        assert round(wavelengths[i].item(), 2 if i < 383 else 1) == wavelength
    # and the embedding really turns at that rate: one wavelength later, pair i is back where it started
    for i in (0, 32):
        p = wavelengths[i].item()
        angle = p * inv_freq[i].item()
        assert abs(math.sin(angle)) < 1e-12 and abs(math.cos(angle) - 1) < 1e-12


# -----------------------------------------------------------------------------
# 7-9. The schemes inside the full model


def test_position_parameters_are_learneds_table_t5s_buckets_and_fires_mlp():
    """Every scheme's GPT holds the same parameters but the scheme's own: learned's (block_size, n_embd)
    table, t5's bias per bucket and head (32 x n_head), fire's MLP 1 -> 32 -> n_head and its c and L."""
    own = {
        pos: sum(p.numel() for p in GPT(tiny_config(pos)).transformer.wpe.parameters()) for pos in POS_SCHEMES
    }
    rest = {GPT(tiny_config(pos)).num_params() - own[pos] for pos in POS_SCHEMES}
    assert len(rest) == 1
    n_head = 2
    fire = (1 * 32 + 32) + (32 * n_head + n_head) + 2
    assert (own["learned"], own["t5"], own["fire"]) == (16 * 16, 32 * n_head, fire)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_changing_a_future_token_never_changes_an_earlier_logit(pos):
    """Causality: logits at positions < t do not depend on the token at t."""
    torch.manual_seed(0)
    model = GPT(tiny_config(pos)).double().eval()
    idx = torch.randint(0, 32, (2, 16))
    logits, _ = model(idx)
    for t in [1, 8, 15]:
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 32
        changed_logits, _ = model(changed)
        torch.testing.assert_close(changed_logits[:, :t], logits[:, :t], rtol=0, atol=1e-12)
        assert not torch.allclose(changed_logits[:, t], logits[:, t])


def test_learned_refuses_context_longer_than_block_size():
    """The learned table has no row past block_size:
    a clear error names block_size and the schemes that run longer."""
    model = GPT(tiny_config("learned"))
    *others, last = [pos for pos in POS_SCHEMES if pos != "learned"]
    with pytest.raises(ValueError, match=rf"block_size=16.*{', '.join(others)} and {last} run longer"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_other_schemes_run_at_four_times_block_size(pos):
    """Each scheme without a length_limit (all but learned) extends to any length: a forward pass at 4 x
    block_size works, and its first block_size logits equal those of the shorter pass (the caches extend, they
    do not change). One with a limit refuses the longer pass."""
    torch.manual_seed(0)
    model = GPT(tiny_config(pos)).eval()
    idx = torch.randint(0, 32, (1, 64))
    if model.length_limit is not None:
        with pytest.raises(ValueError, match=f"exceeds block_size={model.length_limit}"):
            model(idx)
        return
    short_logits, _ = model(idx[:, :16])
    long_logits, _ = model(idx)
    assert long_logits.shape == (1, 64, 32) and torch.isfinite(long_logits).all()
    torch.testing.assert_close(long_logits[:, :16], short_logits, rtol=1e-5, atol=1e-5)


# -----------------------------------------------------------------------------
# 10. ALiBi slopes


def test_alibi_slopes_follow_press_et_al():
    """8 heads: 1/2 ... 1/256. Non powers of two (the paper's rule): the closest power of two's slopes,
    then every other slope of twice that power."""
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    sixteen = [2.0 ** (-k / 2) for k in range(1, 17)]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(alibi_slopes(8).tolist() + sixteen[0::2][:4]))
    torch.testing.assert_close(alibi_slopes(12)[8:], torch.tensor([2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]))


def test_alibi_bias_is_minus_slope_times_distance():
    """The score of query i on key j gets -m_h * (i - j): zero on the diagonal, more negative further back."""
    bias = alibi_bias(torch.tensor([0.5, 0.25], dtype=torch.float64), 4, 4)
    assert bias[0, 3, 0] == -1.5 and bias[1, 3, 1] == -0.5 and bias[0, 2, 2] == 0
    # queries that are the last 2 of 6 positions (as when decoding after a prefix)
    assert alibi_bias(torch.tensor([1.0]), 2, 6)[0].tolist() == [
        [-4, -3, -2, -1, 0, 1],
        [-5, -4, -3, -2, -1, 0],
    ]
