"""Generation past the training length: the KV cache against the reference, sampling, RoPE extension."""

import math

import pytest
import torch

import generation
from generation import generate_cached
from model import GPT, GPTConfig, NonFiniteLogits, cached_key_positions, sample_next
from positions import POS_SCHEMES, ROPE_SCALINGS, apply_rope, rope_cos_sin, rope_frequencies

BLOCK = 16


def tiny_model(pos, seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, pos=pos)
    fields.update(overrides)
    return GPT(GPTConfig.from_flat(**fields)).eval()


def decode_step_by_step(model, idx, n_prompt, window=None):
    """Logits from prefilling n_prompt tokens, then feeding the rest one at a time through the KV caches."""
    model.setup_cache(idx.size(0), idx.size(1), window, chunk=n_prompt)
    logits = [model(idx[:, :n_prompt], input_pos=torch.arange(n_prompt))[0]]
    for t in range(n_prompt, idx.size(1)):
        logits.append(model(idx[:, t : t + 1], input_pos=torch.tensor([t]))[0])
    return torch.cat(logits, dim=1)


def layer_caches(model):
    return [block.attn.kv_cache for block in model.transformer.h]


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_cached_decoding_matches_full_forward_at_every_step(pos):
    """Prefill + one-token decode steps give the full forward's logits at every position, to 1e-5 in float32,
    up to 4 x block_size (up to its length_limit for a scheme with one: learned has no positions past it)."""
    model = tiny_model(pos)
    length = model.length_limit or 4 * BLOCK
    idx = torch.randint(0, 32, (2, length), generator=torch.Generator().manual_seed(1))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=3), full_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_sliding_window_decoding_matches_windowed_prefill(pos):
    """With max_context W each token sees only the W latest: decoding step by step equals running the whole
    sequence at once under the same banded mask."""
    model = tiny_model(pos)
    length, window = (model.length_limit, 5) if model.length_limit else (3 * BLOCK, 7)
    idx = torch.randint(0, 32, (1, length), generator=torch.Generator().manual_seed(2))
    model.setup_cache(1, length, window, chunk=length)
    windowed_full, _ = model(idx, input_pos=torch.arange(length))
    unwindowed, _ = model(idx)
    assert not torch.allclose(windowed_full[:, window:], unwindowed[:, window:], atol=1e-4), (
        "the window must matter"
    )
    stepped = decode_step_by_step(model, idx, n_prompt=2, window=window)
    torch.testing.assert_close(stepped, windowed_full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_greedy_tokens_identical_with_and_without_cache(pos):
    """temperature=0 generates the same 4 x block_size tokens from the reference and the cached sampler
    (for learned, both slide a block_size window once the table is full)."""
    model = tiny_model(pos)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(3))
    reference = model.generate(prompt, 4 * BLOCK, temperature=0)
    cached = generate_cached(model, prompt, 4 * BLOCK, temperature=0)
    assert torch.equal(cached, reference)


def test_learned_max_context_crops_the_same_way_in_both_samplers():
    """For learned, --max_context below block_size crops the context (positions restart),
    with or without the cache."""
    model = tiny_model("learned")
    prompt = torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(4))
    reference = model.generate(prompt, 40, temperature=0, max_context=6)
    cached = generate_cached(model, prompt, 40, temperature=0, max_context=6)
    assert torch.equal(cached, reference)


def test_same_seed_same_sample_and_streaming_sees_every_token():
    """Sampling is reproducible from the seed, and on_token receives each new token in order."""
    model = tiny_model("rope")
    prompt = torch.zeros(3, 1, dtype=torch.long)
    streamed = []
    torch.manual_seed(5)
    first = generate_cached(model, prompt, 30, temperature=1.0, top_k=10, on_token=streamed.append)
    torch.manual_seed(5)
    second = generate_cached(model, prompt, 30, temperature=1.0, top_k=10)
    assert torch.equal(first, second)
    assert torch.equal(torch.cat(streamed, dim=1), first[:, 1:])


@pytest.mark.parametrize("pos", ["rope", "sinusoidal"])
def test_generating_past_the_tables_leaves_a_model_that_still_trains(pos):
    """generate_cached runs its steps under inference_mode, yet the tokens it returns and the position tables
    it grew past block_size are ordinary tensors: they train (embedding saves its indices for backward) and
    mutate."""
    model = tiny_model(pos)
    tokens = generate_cached(model, torch.zeros(2, 1, dtype=torch.long), 3 * BLOCK, temperature=0)
    assert not tokens.is_inference()
    assert not any(buffer.is_inference() for buffer in model.buffers())
    model.train()
    _, loss = model(tokens[:, :-1], targets=tokens[:, 1:])
    loss.backward()
    assert model.lm_head.weight.grad.abs().sum() > 0
    tokens[:, 0] = 1  # in place, outside inference mode


class SDPAMasks(torch.overrides.TorchFunctionMode):
    """Records the number of dimensions of every attn_mask that reaches scaled_dot_product_attention."""

    def __init__(self):
        super().__init__()
        self.dims = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            self.dims.append(None if mask is None else mask.dim())
        return func(*args, **kwargs)


@pytest.mark.parametrize("pos", ["alibi", "rope"])
def test_every_mask_reaches_sdpa_four_dimensional(pos):
    """SDPA's fused CPU kernel takes an attn_mask only as a 4-D tensor; a 3-D one silently falls back to the
    unfused math path, 3-4x slower (docs/perf.md). Training, a windowed prefill and cached decoding all pass
    4-D masks."""
    model = tiny_model(pos)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(12))
    with SDPAMasks() as seen:
        model(idx)
        model.setup_cache(2, 12, window=5, chunk=8)
        model(idx[:, :8], input_pos=torch.arange(8))
        model(idx[:, 8:9], input_pos=torch.tensor([8]))
    masks = [d for d in seen.dims if d is not None]
    assert masks and set(masks) == {4}, seen.dims


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
    torch.testing.assert_close(
        grown.double(), plain_inv_freq(16, 10000.0 * 5.0 ** (16 / 14)), rtol=1e-6, atol=0
    )


def test_yarn_ramps_in_the_pair_index_as_released():
    """YaRN as the authors' code and transformers compute it, worked by hand for d = 8, T = 64, s = 4,
    theta = (1, 0.1, 0.01, 0.001): the pair index turning r times over T is
    i(r) = d ln(T / 2 pi r) / (2 ln base), i(32) = -0.4971 and i(1) = 1.0080, so low = max(floor, 0) = 0 and
    high = ceil = 2; the ramp (i - low) / 2 is (0, 0.5, 1, 1) and
    theta' = theta / s * ramp + theta * (1 - ramp) = (1, 0.0625, 0.0025, 0.00025): the fastest pair is kept,
    the middle one half-interpolated, the slow ones divided by s. Temperature 0.1 ln 4 + 1 = 1.1386. (The
    paper's ramp in r would have interpolated pair 0 too: it turns 10.2 < 32 times.)"""
    i_of = lambda r: 8 * math.log(64 / (2 * math.pi * r)) / (2 * math.log(10000.0))
    assert abs(i_of(32) - -0.4971499) < 1e-6 and abs(i_of(1) - 1.0080001) < 1e-6
    inv_freq, scale = rope_frequencies(8, scaling="yarn", factor=4.0, original_len=64)
    expected = torch.tensor([1.0, 0.0625, 0.0025, 0.00025], dtype=torch.float64)
    torch.testing.assert_close(inv_freq.double(), expected, rtol=1e-6, atol=0)
    assert abs(scale - 1.1386294361) < 1e-9


def test_yarn_keeps_pairs_that_turn_often_and_interpolates_the_rest():
    """d = 16, T = 64, s = 4: i(32) = -0.994 and i(1) = 2.016 give low = 0, high = 3, so the ramp is
    (0, 1/3, 2/3, 1, 1, 1, 1, 1): pair 0 keeps theta_0 and pairs 3 to 7 are exactly theta_i / 4."""
    inv_freq, _ = rope_frequencies(16, scaling="yarn", factor=4.0, original_len=64)
    theta = plain_inv_freq(16)
    ramp = torch.tensor([0, 1 / 3, 2 / 3, 1, 1, 1, 1, 1], dtype=torch.float64)
    torch.testing.assert_close(inv_freq.double(), theta / 4 * ramp + theta * (1 - ramp), rtol=1e-6, atol=0)
    assert inv_freq[0] == 1.0
    torch.testing.assert_close(inv_freq[3:].double(), theta[3:] / 4, rtol=1e-6, atol=0)


def test_rope_scaling_on_another_scheme_is_an_error():
    """A context-extension method for RoPE makes no sense for other schemes: say so."""
    with pytest.raises(
        ValueError, match="rope_scaling=.yarn. is a setting of pos=rope; this model has pos=alibi"
    ):
        GPTConfig.from_flat(pos="alibi", rope_scaling="yarn", rope_factor=4.0)
    with pytest.raises(ValueError, match="linear, ntk, dynamic, yarn"):
        GPTConfig.from_flat(pos="rope", rope_scaling="cubic")


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn", "llama3"])
def test_scaled_rope_cache_matches_full_forward(scaling):
    """The KV cache stays exact under a static RoPE extension, at 4 x block_size."""
    model = tiny_model("rope", rope_scaling=scaling, rope_factor=4.0)
    idx = torch.randint(0, 32, (1, 4 * BLOCK), generator=torch.Generator().manual_seed(6))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=4), full_logits, rtol=0, atol=1e-5)


def test_dynamic_ntk_cache_keeps_each_key_rotated_for_the_length_it_was_cached_at():
    """README's claim: with the KV cache, dynamic NTK leaves each key rotated as it was when cached (as
    transformers does); only the new token's query and key use the frequencies of the current length. So the
    first layer's cached key at position p equals the unrotated key turned by the frequencies of the length at
    which p entered: the prompt's length for prompt tokens, p + 1 for each decoded one; and once past T these
    differ from the current length's (what generate(), without a cache, uses for every key)."""
    torch.set_default_dtype(torch.float64)
    try:
        model = tiny_model("rope", rope_scaling="dynamic", rope_factor=4.0)
        cfg, n_prompt = model.config, BLOCK + 4
        idx = torch.randint(0, 32, (1, 3 * BLOCK), generator=torch.Generator().manual_seed(7))
        model.setup_cache(1, idx.size(1), chunk=n_prompt)
        model(idx[:, :n_prompt], input_pos=torch.arange(n_prompt))
        for t in range(n_prompt, idx.size(1)):
            model(idx[:, t : t + 1], input_pos=torch.tensor([t]))
        block = model.transformer.h[0]
        raw = block.attn.c_attn(block.ln_1(model.transformer.wte(idx))).split(cfg.n_embd, dim=-1)[1]
        raw = raw.view(1, -1, cfg.n_head, cfg.head_dim).transpose(1, 2)  # (1, nh, L, hs), not rotated

        def rotated(p, length):
            inv_freq, scale = rope_frequencies(
                cfg.head_dim,
                cfg.pos_settings.rope_base,
                "dynamic",
                cfg.pos_settings.rope_factor,
                BLOCK,
                length,
            )
            cos, sin = rope_cos_sin(torch.tensor([p]), inv_freq, scale)  # float32 tables, as the model's
            return apply_rope(raw[:, :, p : p + 1], cos, sin)

        for p in range(idx.size(1)):
            entered_at = n_prompt if p < n_prompt else p + 1
            cached = block.attn.kv_cache.k[:, :, p : p + 1]
            torch.testing.assert_close(cached, rotated(p, entered_at), rtol=0, atol=1e-12)
            if 0 < p and entered_at < idx.size(1):  # not the current length's (position 0 is never turned)
                assert not torch.allclose(cached, rotated(p, idx.size(1)), rtol=0, atol=1e-6)
    finally:
        torch.set_default_dtype(torch.float32)


# -----------------------------------------------------------------------------
# The preallocated cache and compiled decoding


def test_cache_is_written_in_place_and_each_slots_position_follows_from_the_count():
    """Decoding writes each new key and value into buffers allocated once (the same storage at every step: no
    concatenation per token), and which absolute position each slot holds follows from how many were written
    (cached_key_positions), -1 while empty."""
    model = tiny_model("rope")
    idx = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(7))
    model.setup_cache(2, 8, chunk=3)
    model(idx[:, :3], input_pos=torch.arange(3))
    storage = [t.data_ptr() for cache in layer_caches(model) for t in (cache.k, cache.v)]
    for t in range(3, 6):
        model(idx[:, t : t + 1], input_pos=torch.tensor([t]))
    assert [t.data_ptr() for cache in layer_caches(model) for t in (cache.k, cache.v)] == storage
    assert layer_caches(model)[0].k.shape == (2, 2, 8, 8)
    assert cached_key_positions(torch.tensor([6]), 8).tolist() == [0, 1, 2, 3, 4, 5, -1, -1]


def test_sliding_window_cache_is_a_ring_of_window_slots():
    """With a window W and one token a call the cache has W slots and position p lives in slot p % W: after 11
    tokens with W = 4 the slots hold positions 8, 9, 10 and 7, the four latest; a chunk of c tokens a call
    needs W + c - 1 slots, so that its writes never overwrite a key its own queries see."""
    model = tiny_model("alibi")
    idx = torch.randint(0, 32, (1, 11), generator=torch.Generator().manual_seed(8))
    model.setup_cache(1, 11, window=4)
    for t in range(11):
        model(idx[:, t : t + 1], input_pos=torch.tensor([t]))
    assert layer_caches(model)[0].k.size(2) == 4
    assert cached_key_positions(torch.tensor([11]), 4).tolist() == [8, 9, 10, 7]
    assert model.cache_size(11, window=4, chunk=3) == 6


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_compiled_decoding_gives_the_same_greedy_tokens(pos):
    """compile=True runs every decode step through torch.compile, attending over the whole preallocated cache
    with a mask from its positions. With backend "eager" (TorchDynamo traces as for inductor but generates no
    code) the tokens equal the uncompiled cache's, with and without a sliding window; and one graph serves
    every step: the position is a tensor, so advancing it never recompiles."""
    torch.compiler.reset()
    model = tiny_model(pos)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(10))
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = generate_cached(model, prompt, 4 * BLOCK, temperature=0, compile=True, backend="eager")
    assert torch.equal(compiled, generate_cached(model, prompt, 4 * BLOCK, temperature=0))
    windowed = generate_cached(
        model, prompt, 3 * BLOCK, temperature=0, max_context=7, compile=True, backend="eager"
    )
    assert torch.equal(windowed, generate_cached(model, prompt, 3 * BLOCK, temperature=0, max_context=7))


@pytest.mark.parametrize("compile", [False, True])
def test_decoding_builds_no_autograd_graph(compile):
    """Neither the eager nor the compiled sampler records anything for backward, though the parameters require
    grad: no tensor is saved for a backward pass at any step (a step with grad on would save dozens each)."""
    torch.compiler.reset()
    model = tiny_model("rope")
    assert all(p.requires_grad for p in model.parameters())
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        generate_cached(
            model, torch.zeros(1, 2, dtype=torch.long), BLOCK, temperature=0, compile=compile, backend="eager"
        )
    assert saved == []


def test_compiled_decoding_with_inductor_matches():
    """One real inductor compile of the decode step (C++ generated and built on the CPU):
    the same greedy tokens."""
    torch.compiler.reset()
    model = tiny_model("rope")
    prompt = torch.randint(0, 32, (1, 3), generator=torch.Generator().manual_seed(11))
    compiled = generate_cached(model, prompt, 2 * BLOCK, temperature=0, compile=True)
    assert torch.equal(compiled, generate_cached(model, prompt, 2 * BLOCK, temperature=0))


def test_compiled_decoding_refuses_dynamic_ntk():
    """Dynamic NTK recomputes the frequencies from the length at every step, which a static graph cannot:
    say so."""
    model = tiny_model("rope", rope_scaling="dynamic", rope_factor=2.0)
    with pytest.raises(ValueError, match="dynamic.*compile=False"):
        generate_cached(
            model, torch.zeros(1, 1, dtype=torch.long), 4, temperature=0, compile=True, backend="eager"
        )


def overflowing(model, weight, scale):
    """model with the parameter named `weight` times scale: finite weights whose forward overflows."""
    with torch.no_grad():
        model.get_parameter(weight).mul_(scale)
    return model


OVERFLOWS = [("transformer.h.0.attn.c_attn.weight", 1e30), ("transformer.wte.weight", 1e36)]


@pytest.mark.parametrize("temperature", [0.8, 0.0], ids=["sampled", "greedy"])
@pytest.mark.parametrize("weight, scale", OVERFLOWS, ids=["attention", "embedding"])
@pytest.mark.parametrize("sampler", ["cached", "reference"])
def test_logits_that_overflow_are_named_not_sampled(sampler, weight, scale, temperature):
    """Finite weights whose forward overflows to inf or NaN: both samplers raise NonFiniteLogits (one line,
    exit status 1 through plumbing.errors), sampled or greedy: not torch.multinomial's traceback, nor tokens
    argmax picked from NaN."""
    model = overflowing(tiny_model("rope"), weight, scale)
    idx = torch.randint(0, 32, (2, 3), generator=torch.Generator().manual_seed(0))
    generate = generate_cached if sampler == "cached" else GPT.generate
    with pytest.raises(NonFiniteLogits, match=r"logits are not finite \(NaN or inf\)") as error:
        generate(model, idx, 8, temperature=temperature)
    assert error.value.status == 1


def test_cached_decoding_checks_the_logits_once_not_per_token(monkeypatch):
    """generate_cached reads the logits' finiteness once, after the prefill: a check per decoded token would
    be a host synchronisation per token, which its static, captured step avoids."""
    checked = []
    monkeypatch.setattr(generation, "check_finite_logits", lambda logits: checked.append(logits.shape))
    generate_cached(tiny_model("rope"), torch.zeros(2, 3, dtype=torch.long), 8)
    assert checked == [(2, 32)]


def test_sampling_non_finite_logits_draws_without_a_host_read():
    """sample_next on NaN or inf logits returns a token per row, on the device, raising nothing: the check is
    the samplers' flag, read once at the end (test_logits_that_overflow_are_named_not_sampled), not a sync
    per token as torch.multinomial's refusal was."""
    for bad in (float("nan"), float("inf")):
        logits = torch.zeros(2, 5).index_fill_(1, torch.tensor([1]), bad)
        assert sample_next(logits, temperature=1.0, top_k=None).shape == (2, 1)
