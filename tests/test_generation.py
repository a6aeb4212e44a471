"""Generation past the training length: the KV cache against the reference, sampling, RoPE extension."""

import math

import pytest
import torch

from model import GPT, POS_SCHEMES, ROPE_SCALINGS, GPTConfig, KVCache, rope_frequencies, sample_next


BLOCK = 16


def tiny_model(pos, seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, pos=pos)
    fields.update(overrides)
    return GPT(GPTConfig(**fields)).eval()


def decode_step_by_step(model, idx, n_prompt, window=None):
    """Logits from prefilling n_prompt tokens, then feeding the rest one at a time through a KVCache."""
    cache = KVCache(model.config.n_layer, window)
    logits = [model(idx[:, :n_prompt], cache=cache)[0]]
    for t in range(n_prompt, idx.size(1)):
        logits.append(model(idx[:, t : t + 1], cache=cache)[0])
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_cached_decoding_matches_full_forward_at_every_step(pos):
    """Prefill + one-token decode steps give the full forward's logits at every position, to 1e-5 in float32,
    up to 4 x block_size (up to block_size for learned, which has no positions past it)."""
    model = tiny_model(pos)
    length = BLOCK if pos == "learned" else 4 * BLOCK
    idx = torch.randint(0, 32, (2, length), generator=torch.Generator().manual_seed(1))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=3), full_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_sliding_window_decoding_matches_windowed_prefill(pos):
    """With max_context W each token sees only the W latest: decoding step by step equals running the whole
    sequence at once under the same banded mask."""
    model = tiny_model(pos)
    length, window = (BLOCK, 5) if pos == "learned" else (3 * BLOCK, 7)
    idx = torch.randint(0, 32, (1, length), generator=torch.Generator().manual_seed(2))
    windowed_full, _ = model(idx, cache=KVCache(model.config.n_layer, window))
    unwindowed, _ = model(idx)
    assert not torch.allclose(windowed_full[:, window:], unwindowed[:, window:], atol=1e-4), "the window must matter"
    stepped = decode_step_by_step(model, idx, n_prompt=2, window=window)
    torch.testing.assert_close(stepped, windowed_full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_greedy_tokens_identical_with_and_without_cache(pos):
    """temperature=0 generates the same 4 x block_size tokens from the reference and the cached sampler
    (for learned, both slide a block_size window once the table is full)."""
    model = tiny_model(pos)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(3))
    reference = model.generate(prompt, 4 * BLOCK, temperature=0)
    cached = model.generate_cached(prompt, 4 * BLOCK, temperature=0)
    assert torch.equal(cached, reference)


def test_learned_max_context_crops_the_same_way_in_both_samplers():
    """For learned, --max_context below block_size crops the context (positions restart) with or without the cache."""
    model = tiny_model("learned")
    prompt = torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(4))
    reference = model.generate(prompt, 40, temperature=0, max_context=6)
    cached = model.generate_cached(prompt, 40, temperature=0, max_context=6)
    assert torch.equal(cached, reference)


def test_same_seed_same_sample_and_streaming_sees_every_token():
    """Sampling is reproducible from the seed, and on_token receives each new token in order."""
    model = tiny_model("rope")
    prompt = torch.zeros(3, 1, dtype=torch.long)
    streamed = []
    torch.manual_seed(5)
    first = model.generate_cached(prompt, 30, temperature=1.0, top_k=10, on_token=streamed.append)
    torch.manual_seed(5)
    second = model.generate_cached(prompt, 30, temperature=1.0, top_k=10)
    assert torch.equal(first, second)
    assert torch.equal(torch.cat(streamed, dim=1), first[:, 1:])


def test_top_p_keeps_the_smallest_set_reaching_p():
    """Nucleus sampling with p = 0.6 over probabilities (0.5, 0.3, 0.15, 0.05) can only pick the first two."""
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(2000, 1)
    torch.manual_seed(0)
    picks = sample_next(logits, temperature=1.0, top_p=0.6).flatten()
    assert set(picks.tolist()) == {0, 1}
    assert abs((picks == 0).float().mean().item() - 0.5 / 0.8) < 0.05  # renormalised among the kept
    assert sample_next(logits[:1], temperature=1.0, top_p=0.01).item() == 0  # the top token always stays


def test_temperature_zero_is_argmax():
    """temperature=0 is greedy, with no division by zero."""
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    assert sample_next(logits, temperature=0).flatten().tolist() == [1, 0]


# -----------------------------------------------------------------------------
# RoPE context extension


def plain_inv_freq(d, base=10000.0):
    return torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)


@pytest.mark.parametrize("scaling", ROPE_SCALINGS)
def test_every_rope_scaling_with_factor_one_is_plain_rope(scaling):
    """s = 1 changes nothing: the same frequencies and an attention scale of 1."""
    plain, _ = rope_frequencies(32)
    inv_freq, scale = rope_frequencies(32, scaling=scaling, factor=1.0, original_len=64, seq_len=64)
    torch.testing.assert_close(inv_freq, plain, rtol=0, atol=0)
    assert scale == 1.0


def test_linear_scaling_divides_frequencies_by_factor():
    """Position interpolation: theta_i / s, so position m at scale s turns like m / s did."""
    inv_freq, scale = rope_frequencies(16, scaling="linear", factor=4.0, original_len=64)
    torch.testing.assert_close(inv_freq.double(), plain_inv_freq(16) / 4, rtol=1e-6, atol=0)
    assert scale == 1.0


def test_ntk_scaling_changes_the_base():
    """NTK-aware: base' = base * s^(d/(d-2)); d=16, s=4: base' = 10000 * 4^(16/14). The highest frequency
    stays 1, the lowest is divided by exactly s."""
    inv_freq, _ = rope_frequencies(16, scaling="ntk", factor=4.0, original_len=64)
    base = 10000.0 * 4.0 ** (16 / 14)
    torch.testing.assert_close(inv_freq.double(), plain_inv_freq(16, base), rtol=1e-6, atol=0)
    assert inv_freq[0] == 1.0
    assert abs(inv_freq[-1].item() / plain_inv_freq(16)[-1].item() - 1 / 4 ** (14 / 14)) < 1e-6


def test_dynamic_ntk_follows_the_current_length():
    """Dynamic NTK: plain RoPE while L <= T; at L = 3T with s = 2, base' = base * (2*3 - 1)^(d/(d-2))."""
    plain, _ = rope_frequencies(16)
    for L in (1, 32, 64):
        same, _ = rope_frequencies(16, scaling="dynamic", factor=2.0, original_len=64, seq_len=L)
        torch.testing.assert_close(same, plain, rtol=0, atol=0)
    grown, _ = rope_frequencies(16, scaling="dynamic", factor=2.0, original_len=64, seq_len=192)
    torch.testing.assert_close(grown.double(), plain_inv_freq(16, 10000.0 * 5.0 ** (16 / 14)), rtol=1e-6, atol=0)


def test_yarn_interpolates_only_slow_dimensions_and_sets_temperature():
    """YaRN worked in float64 from the paper: with T = 64, d = 8, s = 4, theta = (1, 0.1, 0.01, 0.001) make
    r = T*theta/2pi = (10.186, 1.0186, 0.1019, 0.0102) rotations; the ramp (r - 1)/31 gives
    g = (0.29632, 0.0006, 0, 0); theta' = (1 - g) theta / s + g theta; temperature 0.1 ln 4 + 1 = 1.1386."""
    inv_freq, scale = rope_frequencies(8, scaling="yarn", factor=4.0, original_len=64)
    theta = plain_inv_freq(8)
    r = 64 * theta / (2 * math.pi)
    g = ((r - 1) / 31).clamp(0, 1)
    torch.testing.assert_close(inv_freq.double(), (1 - g) * theta / 4 + g * theta, rtol=1e-6, atol=0)
    assert abs(inv_freq[0].item() - (0.70368 * 0.25 + 0.29632)) < 1e-5  # fastest pair: mostly kept
    torch.testing.assert_close(inv_freq[2:].double(), theta[2:] / 4, rtol=1e-6, atol=0)  # slow pairs: interpolated
    assert abs(scale - 1.1386294361) < 1e-9


def test_rope_scaling_on_another_scheme_is_an_error():
    """A context-extension method for RoPE makes no sense for other schemes: say so."""
    with pytest.raises(ValueError, match="extends RoPE only"):
        GPTConfig(pos="alibi", rope_scaling="yarn", rope_factor=4.0)
    with pytest.raises(ValueError, match="linear, ntk, dynamic, yarn"):
        GPTConfig(pos="rope", rope_scaling="cubic")


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn"])
def test_scaled_rope_cache_matches_full_forward(scaling):
    """The KV cache stays exact under a static RoPE extension, at 4 x block_size."""
    model = tiny_model("rope", rope_scaling=scaling, rope_factor=4.0)
    idx = torch.randint(0, 32, (1, 4 * BLOCK), generator=torch.Generator().manual_seed(6))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=4), full_logits, rtol=0, atol=1e-5)
