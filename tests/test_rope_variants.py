"""The RoPE variants released models ship, each against Hugging Face transformers where it has one (the parity
tests skip without it): Llama 3's frequency scaling (rope_scaling="llama3", its parity test in
tests/test_rope_scaling.py), partial rotation (rope_fraction, transformers' partial_rotary_factor) and layers
without RoPE (nope_interval as Llama 4, or nope_layers). The rest run on the model's own functions, float64
where the point is exactness, tiny shapes and fixed seeds.
"""

import math
from pathlib import Path

import pytest
import torch
from helpers import error_line

import sample
import train
from generation import generate_cached
from model import GPT, GPTConfig
from plumbing.checkpoint import load_checkpoint
from positions import (
    ROPE_SCALINGS,
    RotaryPositions,
    apply_rope,
    llama3_inv_freq,
    nope_layer_indices,
    rope_cos_sin,
    rope_frequencies,
    rope_inv_freq,
    rotary_dim,
)

BLOCK = 16


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, pos="rope")
    return GPT(GPTConfig.from_flat(**fields | overrides)).eval()


def transformers_or_skip():
    return pytest.importorskip(
        "transformers", reason="the parity tests need Hugging Face transformers: pip install transformers"
    )


@torch.no_grad()
def attention_arguments(model, idx):
    """What GPT.forward hands each block's attention, running model(idx): per layer (x, rope, mask,
    input_pos), rope being (cos, sin) or None."""
    seen = {}
    hooks = [
        block.attn.register_forward_pre_hook(lambda module, args, i=i: seen.__setitem__(i, args))
        for i, block in enumerate(model.transformer.h)
    ]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return [seen[i] for i in range(len(model.transformer.h))]


def uniform(low, high, generator):
    return float(torch.empty(()).uniform_(low, high, generator=generator))


def decode_step_by_step(model, idx, n_prompt):
    """Logits from prefilling n_prompt tokens, then feeding the rest one at a time through the KV caches."""
    model.setup_cache(idx.size(0), idx.size(1), chunk=n_prompt)
    logits = [model(idx[:, :n_prompt], input_pos=torch.arange(n_prompt))[0]]
    for t in range(n_prompt, idx.size(1)):
        logits.append(model(idx[:, t : t + 1], input_pos=torch.tensor([t]))[0])
    return torch.cat(logits, dim=1)


# -----------------------------------------------------------------------------
# Llama 3's frequencies (rope_inv_freq and yarn_ramp: tests/test_exercise_properties.py)


@pytest.mark.parametrize("seed", range(5))
def test_llama3_keeps_fast_pairs_divides_slow_ones_and_blends_between(seed):
    """Each theta'_i lies between theta_i / s and theta_i; exactly theta_i where the pair turns more than
    high_freq_factor times over T, exactly theta_i / s where it turns fewer than low_freq_factor times; theta'
    still falls with i (no pair overtakes a faster one); and s = 1 changes nothing."""
    g = torch.Generator().manual_seed(seed)
    dim, T = 2 * int(torch.randint(2, 65, (), generator=g)), int(torch.randint(16, 8193, (), generator=g))
    s, low = uniform(1.5, 32.0, g), uniform(0.25, 2.0, g)
    high = low + uniform(0.5, 16.0, g)
    theta = rope_inv_freq(dim, 10000.0)
    scaled = llama3_inv_freq(theta, s, low, high, T)
    turns = T * theta / (2 * math.pi)
    assert (scaled <= theta * (1 + 1e-12)).all() and (scaled >= theta / s * (1 - 1e-12)).all()
    assert torch.equal(scaled[turns > high], theta[turns > high])
    assert torch.equal(scaled[turns < low], theta[turns < low] / s)
    assert (scaled[1:] < scaled[:-1]).all()
    torch.testing.assert_close(llama3_inv_freq(theta, 1.0, low, high, T), theta, rtol=1e-15, atol=0)


def test_llama3_worked_case_d32_t64():
    """rope_frequencies' worked case, by hand: d = 32, T = 64, s = 4, low 1, high 4, base 10^4. Pair i has
    wavelength 2 pi 10^(i/4) and turns r_i = 64 / (2 pi 10^(i/4)) times over T: 10.19, 5.73, 3.22, 1.81,
    1.019, 0.573, ... So pairs 0, 1 are kept (r > 4), pairs 2, 3, 4 blended with
    smooth = (r - 1) / 3 = 0.7404, 0.2704, 0.0062, theta' / theta = 1/4 + 3/4 smooth = 0.8053, 0.4528,
    0.2546, and pairs 5 to 15 divided by 4 (r < 1)."""
    turns = [64 / (2 * math.pi * 10 ** (i / 4)) for i in range(16)]
    assert [round(r, 3) for r in turns[:6]] == [10.186, 5.728, 3.221, 1.811, 1.019, 0.573]
    kept, blended, divided = [0, 1], [2, 3, 4], list(range(5, 16))
    assert [i for i, r in enumerate(turns) if r > 4] == kept and [
        i for i, r in enumerate(turns) if r < 1
    ] == divided
    smooth = [(turns[i] - 1) / 3 for i in blended]
    assert [round(x, 4) for x in smooth] == [0.7404, 0.2704, 0.0062]
    ratio = [1.0, 1.0] + [0.25 + 0.75 * x for x in smooth] + [0.25] * 11
    assert [round(x, 4) for x in ratio[2:5]] == [0.8053, 0.4528, 0.2546]
    theta = rope_inv_freq(32)
    inv_freq, scale = rope_frequencies(32, scaling="llama3", factor=4.0, original_len=64)
    torch.testing.assert_close(
        inv_freq.double(), theta * torch.tensor(ratio, dtype=torch.float64), rtol=1e-6, atol=0
    )
    assert scale == 1.0
    assert torch.equal(inv_freq[kept], theta[kept].float())
    assert torch.equal(inv_freq[divided], (theta[divided] / 4).float())


# -----------------------------------------------------------------------------
# Partial rotation: the first int(head_dim * rope_fraction) dims of each head turn, the rest carry no position


def test_fraction_one_rotates_the_whole_head_bit_for_bit(monkeypatch):
    """rope_fraction=1 is RoPE over the whole head: the tables are those of the formula (theta over the whole
    head) and the logits equal, bit for bit, those of the model run through apply_rope without partial
    rotation (the whole head turning, halves paired, by +angle), and the checkpoint's defaults are plain
    RoPE."""

    def apply_rope_whole_head(x, cos, sin):
        """apply_rope without partial rotation, in Llama's rotate-half form x cos + rotate_half(x) sin, with
        apply_rope's rounding, so the logits can be compared bit for bit: negating is exact, a + (-b) is
        a - b in IEEE arithmetic, and sums and products commute. (A complex product,
        (x_i + j x_(i+d/2)) e^(j angle), is the same rotation but torch's complex kernel fuses a multiply-add
        on some lengths: 1 ulp apart, so no equality.)"""
        half = x.size(-1) // 2
        rotated_half = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # pair (a, b) -> (-b, a)
        unsigned_sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # transformers' (sin a, sin a)
        return (x * cos + rotated_half * unsigned_sin).to(x.dtype)

    model = tiny_model(rope_fraction=1.0)
    theta = (10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)).float()
    cos, sin = rope_cos_sin(torch.arange(BLOCK), theta)
    assert torch.equal(model.transformer.wpe.cos, cos) and torch.equal(model.transformer.wpe.sin, sin)
    idx = torch.randint(0, 32, (2, 3 * BLOCK), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    monkeypatch.setattr("model.apply_rope", apply_rope_whole_head)
    assert torch.equal(model(idx)[0], logits)


@pytest.mark.parametrize(
    "head_dim,fraction", [(16, 0.25), (32, 0.5), (64, 0.25), (24, 0.5), (20, 0.4), (16, 1.0)]
)
def test_partial_rotation_matches_transformers_gpt_neox(head_dim, fraction):
    """GPT-NeoX's partial rotary embedding in transformers (rotary_pct, the config's partial_rotary_factor):
    its inverse frequencies over int(head_dim * fraction) dimensions equal ours to float32 rounding (rtol
    1e-6); its apply_rotary_pos_emb given our cos and sin (the sign of the sin's first half undone: its
    rotate_half carries it) rotates q and k exactly as apply_rope does, bit for bit (rotate-half within the
    slice, the rest passed through); and with its own cos and sin they differ only
    by float32's rounding of the angles m theta_i (theta rounded on one side, not the other), at most ~1e-5
    here at positions up to 255."""
    transformers_or_skip()
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    n_head, T = 2, 256
    hf_config = GPTNeoXConfig(
        hidden_size=head_dim * n_head,
        num_attention_heads=n_head,
        rotary_pct=fraction,
        rotary_emb_base=10000.0,
        max_position_embeddings=T,
    )
    hf_rotary = GPTNeoXRotaryEmbedding(hf_config)
    ours = RotaryPositions(
        GPTConfig.from_flat(block_size=T, n_head=n_head, n_embd=head_dim * n_head, rope_fraction=fraction)
    )
    rotary_dim = int(head_dim * fraction)
    assert ours.cos.shape == (T, rotary_dim) and hf_rotary.inv_freq.shape == (rotary_dim // 2,)
    inv_freq, _ = rope_frequencies(rotary_dim)
    torch.testing.assert_close(inv_freq.double(), hf_rotary.inv_freq.double(), rtol=1e-6, atol=0)

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, n_head, T, head_dim, generator=g), torch.randn(2, n_head, T, head_dim, generator=g)
    positions = torch.arange(T)
    cos, sin = ours.rotation(positions)
    unsigned_sin = torch.cat([-sin[:, : rotary_dim // 2], sin[:, rotary_dim // 2 :]], -1)  # (sin a, sin a)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos[None], unsigned_sin[None])
    assert torch.equal(apply_rope(q, cos, sin), hf_q) and torch.equal(apply_rope(k, cos, sin), hf_k)
    assert torch.equal(apply_rope(q, cos, sin)[..., rotary_dim:], q[..., rotary_dim:])

    hf_cos, hf_sin = hf_rotary(q, positions[None])
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos, hf_sin)
    torch.testing.assert_close(apply_rope(q, cos, sin), hf_q, rtol=0, atol=2e-5)
    torch.testing.assert_close(apply_rope(k, cos, sin), hf_k, rtol=0, atol=2e-5)


def test_the_unrotated_dimensions_share_of_every_score_is_the_same_at_every_offset():
    """q_m . k_n = (rotated slice) + (the rest). With a quarter of each head rotating, the rest's share is the
    same q_pass . k_pass whatever m and n: it carries no position. The rotated share depends on m - n only,
    and does change with it."""
    head_dim, rotary_dim = 16, 4
    rope = RotaryPositions(GPTConfig.from_flat(block_size=64, n_head=1, n_embd=head_dim, rope_fraction=0.25))
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, head_dim, generator=g, dtype=torch.float64)
    assert rope.cos.shape == (64, rotary_dim)
    cos, sin = rope_cos_sin(
        torch.arange(64), rope_frequencies(rotary_dim)[0].double()
    )  # float64 angles: exact
    rq, rk = (
        apply_rope(q.expand(64, -1), cos, sin),
        apply_rope(k.expand(64, -1), cos, sin),
    )  # q, k at every position
    assert torch.equal(rq[:, rotary_dim:], q[rotary_dim:].expand(64, -1))  # passed through, bit for bit
    unrotated = (rq[:, None, rotary_dim:] * rk[None, :, rotary_dim:]).sum(-1)  # (m, n): the same everywhere
    assert torch.equal(unrotated, unrotated[0, 0].expand(64, 64))
    rotated = (rq[:, None, :rotary_dim] * rk[None, :, :rotary_dim]).sum(-1)  # (m, n)
    for offset in (0, 5, 40):
        torch.testing.assert_close(
            rotated.diagonal(-offset), rotated.diagonal(-offset)[:1].expand(64 - offset), rtol=0, atol=1e-12
        )
    assert rotated.diagonal(-1)[0] != rotated.diagonal(-5)[0]


@pytest.mark.parametrize("scaling", [None, *ROPE_SCALINGS])
def test_partial_rotation_cached_logits_equal_the_full_forward_with_every_scaling(scaling):
    """The KV cache holds keys already rotated, partly here: prefill + one-token steps give the full forward's
    logits at every position up to 4 x block_size, to 1e-5, with and without each context extension. Dynamic
    NTK up to block_size only: past it a cached key keeps the frequencies of the length it entered at, by
    design (tests/test_generation.py shows that per key), where the full forward turns every key for the whole
    length."""
    extension = {} if scaling is None else dict(rope_scaling=scaling, rope_factor=4.0)
    model = tiny_model(rope_fraction=0.25, **extension)
    length = BLOCK if scaling == "dynamic" else 4 * BLOCK
    idx = torch.randint(0, 32, (2, length), generator=torch.Generator().manual_seed(4))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=3), full_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(rope_fraction=0.5, rope_scaling="llama3", rope_factor=4.0),
        dict(nope_interval=2),
        dict(nope_layers="0"),
    ],
    ids=["fraction-llama3", "interval", "list"],
)
def test_compiled_decoding_gives_the_cached_tokens(overrides):
    """compile_decode_step (fullgraph, static shapes) traces partial rotation and the layers without RoPE:
    the same greedy tokens as the eager cache, with one graph for every step."""
    torch.compiler.reset()
    model = tiny_model(**overrides)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(5))
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = generate_cached(model, prompt, 4 * BLOCK, temperature=0, compile=True, backend="eager")
    assert torch.equal(compiled, generate_cached(model, prompt, 4 * BLOCK, temperature=0))
    assert torch.equal(compiled, model.generate(prompt, 4 * BLOCK, temperature=0))


# -----------------------------------------------------------------------------
# Layers without RoPE


def test_interval_4_of_8_layers_skips_layers_3_and_7_as_llama4():
    """Llama 4's no_rope_layer_interval = 4 over 8 layers: layers 3 and 7 (0-based) have no RoPE.
    transformers' Llama4TextConfig derives no_rope_layers = [int((i + 1) % 4 != 0)], 1 marking a layer that
    uses RoPE (the flag shipped inverted once, huggingface/transformers#43756); the model hands those two
    layers no rotation."""
    config = GPTConfig.from_flat(
        block_size=BLOCK, vocab_size=32, n_layer=8, n_head=2, n_embd=16, nope_interval=4
    )
    assert nope_layer_indices(8, interval=4) == [3, 7]
    assert GPT(config).rope_layers == (True, True, True, False, True, True, True, False)
    assert (
        GPT(GPTConfig.from_flat(**{**config.flat(), "nope_interval": 0, "nope_layers": "3,7"})).rope_layers
        == GPT(config).rope_layers
    )
    given = attention_arguments(GPT(config).eval(), torch.zeros(1, 4, dtype=torch.long))
    assert [i for i, (x, rope, *_) in enumerate(given) if rope is None] == [3, 7]
    try:
        from transformers import Llama4TextConfig
    except ImportError:
        return  # transformers' derivation is reproduced above; compared when it is installed
    hf = Llama4TextConfig(num_hidden_layers=8, no_rope_layer_interval=4)
    assert (
        hf.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0] == [int(rotates) for rotates in GPT(config).rope_layers]
    )


def test_a_nope_layers_scores_ignore_the_distance_while_a_rope_layers_do_not():
    """The same token repeated: with pos=rope nothing else varies along the sequence, so every layer's input
    is the same at every position (each attention averages equal values). A layer without RoPE then scores
    every key alike, whatever its distance to the query; a layer with RoPE scores them by distance."""
    model = tiny_model(n_layer=2, nope_layers="1")
    for layer, (x, rope, *_) in enumerate(attention_arguments(model, torch.full((1, 12), 7))):
        rotates, attn = model.rope_layers[layer], model.transformer.h[layer].attn
        q, k, _ = attn.c_attn(x).view(1, 12, 3, 2, 16).permute(2, 0, 3, 1, 4)  # (B, nh, T, hs) each
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        scores = (q @ k.transpose(-2, -1))[0]  # (nh, T, T): query i, key j
        last_row = scores[:, -1]  # the last query against keys at distances 11 .. 0
        spread = (last_row.max(-1).values - last_row.min(-1).values).max().item()
        assert (spread > 1e-3) if rotates else (spread < 1e-5), (layer, rotates, spread)
    assert model.rope_layers == (True, False)


@pytest.mark.parametrize("overrides", [dict(nope_interval=2, n_layer=4), dict(nope_layers="0,2", n_layer=3)])
def test_nope_layers_cached_logits_equal_the_full_forward(overrides):
    """The KV cache of a layer without RoPE holds its keys as computed: prefill + steps = the full forward."""
    model = tiny_model(**overrides)
    idx = torch.randint(0, 32, (2, 3 * BLOCK), generator=torch.Generator().manual_seed(6))
    full_logits, _ = model(idx)
    torch.testing.assert_close(decode_step_by_step(model, idx, n_prompt=4), full_logits, rtol=0, atol=1e-5)


# -----------------------------------------------------------------------------
# Flags, errors and checkpoints

TINY = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    f"--block_size={BLOCK}",
    "--batch_size=4",
    "--max_iters=2",
    "--eval_interval=2",
    "--eval_iters=1",
    "--log_interval=1",
    "--device=cpu",
    "--compile=false",
]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--rope_fraction=0"], ["rope_fraction must be in (0, 1]"]),
        (["--rope_fraction=1.5"], ["rope_fraction must be in (0, 1]"]),
        (
            ["--rope_fraction=0.2"],
            ["int(16 x 0.2) = 3", "must be even and >= 2", "multiple of 2/16 (0.125, 0.25"],
        ),
        (["--rope_fraction=0.1"], ["int(16 x 0.1) = 1", "must be even and >= 2"]),
        (
            ["--nope_layers=0,2"],
            ["nope_layers='0,2': give layer indices from 0 to 1", "comma-separated and each once"],
        ),
        (["--nope_layers=1,1"], ["each once"]),
        (["--nope_layers=0,1"], ["skips RoPE in every layer: that is pos=none"]),
        (["--nope_interval=3"], ["give 0 (every layer rotates) or 2 to n_layer=2"]),
        (["--nope_interval=2", "--nope_layers=1"], ["give one of them"]),
        (["--rope_low_freq_factor=2"], ["llama3's frequency factors", "give rope_scaling=llama3"]),
        (["--rope_scaling=llama3", "--rope_low_freq_factor=4"], ["need 0 < low < high"]),
        (["--pos=alibi", "--rope_fraction=0.5"], ["rope_fraction=0.5 is a setting of pos=rope", "pos=alibi"]),
        (
            ["--pos=learned", "--nope_interval=2"],
            ["nope_interval=2 is a setting of pos=rope; this model has pos=learned"],
        ),
        (
            ["--pos=sinusoidal", "--rope_high_freq_factor=8"],
            ["rope_high_freq_factor=8.0 is a setting of pos=rope"],
        ),
        (["--rope_fraction=abc"], ["expected a number"]),
    ],
)
def test_bad_rope_variant_flags_are_one_line_errors(capsys, argv, words):
    """train.py refuses each bad value before any work, in one line naming what is valid."""
    err = error_line(capsys, train, [*TINY, *argv], 2)
    assert all(w in err for w in words), err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--rope_low_freq_factor=2"], ["llama3's frequency factors", "give rope_scaling=llama3"]),
        (["--rope_scaling=yarn", "--rope_high_freq_factor=8"], ["give rope_scaling=llama3"]),
        (["--rope_scaling=cubic"], ["'yarn', 'llama3'"]),
    ],
)
def test_bad_sample_flags_are_one_line_errors(capsys, argv, words):
    err = error_line(capsys, sample, argv, 2)
    assert all(w in err for w in words), err


@pytest.fixture(scope="module")
def variant_run(tmp_path_factory):
    """A two-step run with a quarter of each head rotating and layer 1 of 2 without RoPE."""
    out_dir = tmp_path_factory.mktemp("variants") / "run"
    train.main([*TINY, "--rope_fraction=0.25", "--nope_interval=2", f"--out_dir={out_dir}"])
    return out_dir


def test_the_checkpoint_records_the_variants_and_samples_with_llama3_past_t(variant_run, capsys):
    """asdict(GPTConfig) puts every variant field in model_config; sample.py rebuilds that model and runs
    Llama 3 scaling on it at inference, its factors from the flags, 4 x block_size tokens, the cache and the
    reference sampler agreeing."""
    config = load_checkpoint(variant_run / "ckpt.pt")["model_config"]["pos_settings"]
    assert {
        k: config[k]
        for k in (
            "rope_fraction",
            "nope_interval",
            "nope_layers",
            "rope_low_freq_factor",
            "rope_high_freq_factor",
        )
    } == dict(
        rope_fraction=0.25,
        nope_interval=2,
        nope_layers=None,
        rope_low_freq_factor=1.0,
        rope_high_freq_factor=4.0,
    )
    flags = [
        f"--out_dir={variant_run}",
        "--rope_scaling=llama3",
        "--rope_factor=4",
        "--rope_low_freq_factor=0.5",
        "--rope_high_freq_factor=8",
        "--temperature=0",
        "--stream=off",
        f"--max_new_tokens={4 * BLOCK}",
    ]
    loaded, cached, _ = sample.main(flags)
    out = capsys.readouterr().out
    c = loaded.model.config.pos_settings
    assert (c.rope_scaling, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor) == (
        "llama3",
        4,
        0.5,
        8,
    )
    assert (
        "pos=rope on 4 of each head's 16 dims (none in layer 1), trained length 16 tokens, "
        "rope scaling llama3 x4 (frequency factors 0.5 and 8)" in out
    )
    _, reference, _ = sample.main([*flags, "--kv_cache=off"])
    assert cached == reference and len(cached[0]) == 1 + 4 * BLOCK


def test_a_llama3_fine_tune_records_its_factors_and_scales_against_the_first_length(variant_run, tmp_path):
    """train.py --init_from with --rope_scaling=llama3: the factors and rope_original_len = the source's T are
    recorded, and the model rebuilt from the checkpoint has llama3's frequencies for them."""
    out_dir = tmp_path / "llama3"
    train.main(
        [
            "--init_from",
            str(variant_run),
            f"--block_size={2 * BLOCK}",
            "--rope_scaling=llama3",
            "--rope_factor=2",
            "--rope_high_freq_factor=8",
            "--max_iters=2",
            "--eval_interval=2",
            "--eval_iters=1",
            "--batch_size=2",
            "--device=cpu",
            "--compile=false",
            f"--out_dir={out_dir}",
        ]
    )
    config = load_checkpoint(out_dir / "ckpt.pt")["model_config"]["pos_settings"]
    assert (config["rope_scaling"], config["rope_original_len"], config["rope_high_freq_factor"]) == (
        "llama3",
        16,
        8.0,
    )
    assert (config["rope_fraction"], config["nope_interval"]) == (0.25, 2)  # the source's, kept
    loaded = sample.load(out_dir, "cpu")
    inv_freq, _ = rope_frequencies(4, scaling="llama3", factor=2.0, original_len=16, high_freq_factor=8.0)
    cos, _ = rope_cos_sin(torch.arange(2 * BLOCK), inv_freq)
    assert torch.equal(loaded.model.transformer.wpe.cos, cos)


def test_a_fraction_rounding_to_an_even_number_of_dimensions_is_accepted():
    """transformers' rotary dim is int(head_dim * fraction): 0.3 of 16 is 4 dimensions, even, so valid."""
    _, model_config = train.parse_args([*TINY, "--rope_fraction=0.3"])
    assert rotary_dim(model_config.head_dim, model_config.pos_settings.rope_fraction) == 4


def test_a_model_config_without_the_variant_fields_loads_as_plain_rope():
    """A model_config without the variants' fields (tests/fixtures: written at 491106f) reads back with plain
    RoPE's values for them, so it builds the model it was and resuming compares like with like
    (tests/test_cli.py resumes it)."""
    fixture = Path(__file__).parent / "fixtures" / "ckpt_rope_without_finished.pt"
    raw = torch.load(fixture, weights_only=True)["model_config"]
    assert "rope_fraction" not in raw
    config = load_checkpoint(fixture)["model_config"]
    settings = {name: value for name, value in raw.items() if name.startswith("rope_")}
    assert config == {name: value for name, value in raw.items() if name not in settings} | dict(
        pos_settings=settings
        | dict(
            rope_low_freq_factor=1.0,
            rope_high_freq_factor=4.0,
            rope_fraction=1.0,
            nope_interval=0,
            nope_layers=None,
            rope_short_factor=None,
            rope_long_factor=None,
            rope_attention_factor=None,
            rope_keep_first=0,
            rope_factors=None,  # a factors file is recorded as its values
        )
    )
    model = GPT(GPTConfig(**config))
    assert model.rope_layers == (True,) and model.transformer.wpe.dim == 8
