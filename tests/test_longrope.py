"""LongRoPE (rope_scaling=longrope): a factor per frequency pair, short ones up to the original length T and
long ones past it, an attention factor, and n-hat, the first positions left at plain RoPE. Parity with
Hugging Face transformers' Phi-3 code, the model's switch at T, the --rope_factors file and its checks."""

import json
import math
import random

import pytest
import torch

from model import GPT, GPTConfig
from plumbing.fields import changed_fields
from positions import RotaryPositions, longrope_scale, rope_cos_sin, rope_frequencies

BASE = 10000.0


def random_factors(rng, n_pairs, top):
    """n_pairs factors >= 1, non-decreasing from the fastest pair to the slowest, as LongRoPE's search keeps
    them."""
    return sorted(1.0 + rng.random() * (top - 1.0) for _ in range(n_pairs))


def tiny_config(**longrope):
    return GPTConfig.from_flat(
        block_size=16, vocab_size=13, n_layer=2, n_head=2, n_embd=16, pos="rope", **longrope
    )


def longrope_config(short, long, **more):
    return tiny_config(rope_scaling="longrope", rope_short_factor=short, rope_long_factor=long, **more)


# -----------------------------------------------------------------------------
# Parity with transformers (Phi-3's rope_scaling block)


def hf_longrope(head_dim, T, s, seq_len, **rope_scaling):
    transformers = pytest.importorskip(
        "transformers", reason="the parity tests need Hugging Face transformers: pip install transformers"
    )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Phi3Config(
        hidden_size=head_dim,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=int(s * T),
        original_max_position_embeddings=T,
        rope_scaling={"type": "longrope", **rope_scaling},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
    return inv_freq.double(), float(scale)


@pytest.mark.parametrize("attention_factor", [None, 1.3])
@pytest.mark.parametrize("head_dim,T,s", [(8, 64, 4.0), (32, 256, 8.0), (96, 4096, 32.0)])
def test_longrope_matches_transformers_short_and_long_with_the_attention_factor(
    head_dim, T, s, attention_factor
):
    """The short factors up to T, the long ones past it (transformers switches on seq_len > T), and the
    attention factor: Phi-3's default sqrt(1 + ln s / ln T) (s = max_position_embeddings / T), or as given."""
    rng = random.Random(head_dim)
    short, long = random_factors(rng, head_dim // 2, 1.5), random_factors(rng, head_dim // 2, 2 * s)
    given = {} if attention_factor is None else {"attention_factor": attention_factor}
    for seq_len in (None, 1, T, T + 1, int(s * T)):
        hf, hf_scale = hf_longrope(head_dim, T, s, seq_len, short_factor=short, long_factor=long, **given)
        ours, scale = rope_frequencies(
            head_dim, BASE, "longrope", s, T, seq_len, short_factor=short, long_factor=long, **given
        )
        torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0, msg=f"seq_len={seq_len}")
        assert abs(scale - hf_scale) < 1e-12
    assert math.isclose(longrope_scale(32.0, 4096), 1.1902, abs_tol=1e-4)  # Phi-3-mini-128k's


def test_the_model_switches_to_the_long_factors_past_the_original_length_as_transformers():
    """Inside the model, a forward of L <= T tokens turns every position with the short factors, one of L > T
    with the long ones, the first ones too (transformers' longrope_frequency_update)."""
    rng = random.Random(0)
    short, long = random_factors(rng, 4, 1.5), random_factors(rng, 4, 8.0)
    wpe = GPT(longrope_config(short, long, rope_factor=4.0)).transformer.wpe
    for L, factors in ((16, short), (17, long), (40, long)):
        wpe.grow(L)
        positions = torch.arange(L)
        inv_freq = rope_frequencies(8, BASE)[0].double() / torch.tensor(factors, dtype=torch.float64)
        expected = rope_cos_sin(positions, inv_freq.float(), longrope_scale(4.0, 16))
        for got, want in zip(wpe.rotation(positions), expected):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


# -----------------------------------------------------------------------------
# Special cases: all ones is plain RoPE, n-hat's positions are plain RoPE's


def test_longrope_with_every_factor_one_is_plain_rope():
    """lambda_i = 1 for every pair, at s = 1 (attention factor 1): the same logits as plain RoPE's model, at
    lengths below and past T."""
    torch.manual_seed(0)
    plain = GPT(tiny_config())
    ones = GPT(longrope_config([1.0] * 4, [1.0] * 4))
    ones.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 13, (2, 40))
    for L in (16, 40):
        torch.testing.assert_close(ones(idx[:, :L])[0], plain(idx[:, :L])[0], rtol=0, atol=0)


@pytest.mark.parametrize("keep_first", [1, 4, 16])
def test_positions_below_n_hat_rotate_as_plain_rope(keep_first):
    """rope_keep_first = n-hat: positions below it get plain RoPE's cos and sin (no factor, no attention
    scale), short or long; the rest are LongRoPE's."""
    rng = random.Random(keep_first)
    short, long = random_factors(rng, 4, 2.0), random_factors(rng, 4, 8.0)
    wpe = GPT(longrope_config(short, long, rope_factor=4.0, rope_keep_first=keep_first)).transformer.wpe
    without = GPT(longrope_config(short, long, rope_factor=4.0)).transformer.wpe
    plain = GPT(tiny_config()).transformer.wpe
    for L in (16, 48):
        for module in (wpe, without, plain):
            module.grow(L)
        positions = torch.arange(L)
        ours, theirs, plains = wpe.rotation(positions), without.rotation(positions), plain.rotation(positions)
        first = min(keep_first, L)
        for got, want, other in zip(ours, plains, theirs):
            torch.testing.assert_close(got[:first], want[:first], rtol=0, atol=0)
            torch.testing.assert_close(got[first:], other[first:], rtol=0, atol=0)
        assert any(not torch.equal(got[:first], other[:first]) for got, other in zip(ours, theirs))


# -----------------------------------------------------------------------------
# The factors file


def read_rope_factors(path):
    """The settings a factors file gives, as RoPE's Settings read it (those not at their default)."""
    return changed_fields(RotaryPositions.Settings(rope_factors=str(path)))


def write_json(tmp_path, table):
    path = tmp_path / "factors.json"
    path.write_text(json.dumps(table) if not isinstance(table, str) else table)
    return path


def test_a_phi3_rope_scaling_block_reads_as_the_model_fields(tmp_path):
    """A Phi-3 config's rope_scaling block (type, short_factor, long_factor) pastes in; the other keys map to
    GPTConfig's fields."""
    block = {"type": "longrope", "short_factor": [1, 1.5], "long_factor": [2, 3.5], "attention_factor": 1.2}
    block |= {"original_max_position_embeddings": 64, "keep_first": 4, "factor": 8}
    assert read_rope_factors(write_json(tmp_path, block)) == dict(
        rope_scaling="longrope",
        rope_short_factor=[1, 1.5],
        rope_long_factor=[2, 3.5],
        rope_attention_factor=1.2,
        rope_original_len=64,
        rope_keep_first=4,
        rope_factor=8,
    )


BAD_FILES = [
    (
        "not json",
        "{short_factor: [1]",
        r"factors.json: not a usable LongRoPE factors file \(JSONDecodeError: ",
    ),
    ("not an object", "[1, 2]", "factors.json: not a usable LongRoPE factors file .*a JSON object"),
    ("repeated key", '{"factor": 2, "factor": 3}', "factors.json: .*'factor'.* given more than once"),
    ("missing keys", {"short_factor": [1, 1, 1, 1]}, "needs rope_long_factor"),
    (
        "unknown key",
        {"short_factor": [1] * 4, "long_factor": [1] * 4, "long_mscale": 1.2},
        "factors.json: unknown key",
    ),
    (
        "not numbers",
        {"short_factor": [1, "2", 3, 4], "long_factor": [1] * 4},
        "rope_short_factor must be a list",
    ),
    (
        "a boolean",
        {"short_factor": [1, True, 3, 4], "long_factor": [1] * 4},
        "rope_short_factor must be a list",
    ),
    (
        "not finite",
        {"short_factor": [1] * 4, "long_factor": [1, math.nan, 1, 1]},
        "rope_long_factor must be a list of numbers",
    ),
    ("another type", {"type": "yarn", "short_factor": [1] * 4, "long_factor": [1] * 4}, "is not longrope"),
    (
        "keep_first not whole",
        {"short_factor": [1] * 4, "long_factor": [1] * 4, "keep_first": 2.5},
        "an integer",
    ),
    ("no such file", None, "factors.json: not a usable LongRoPE factors file \\(FileNotFoundError"),
]


@pytest.mark.parametrize("case,table,message", BAD_FILES, ids=[case for case, _, _ in BAD_FILES])
def test_a_bad_factors_file_is_a_one_line_error(tmp_path, case, table, message):
    """Any file RoPE's Settings cannot take (unreadable, not JSON, a key unknown or twice, a value of the
    wrong type or out of its rule): one line, naming the file or the setting."""
    path = tmp_path / "factors.json" if table is None else write_json(tmp_path, table)
    with pytest.raises(ValueError, match=message) as error:
        read_rope_factors(path)
    assert "\n" not in str(error.value)


BAD_VALUES = [
    (
        "wrong length",
        dict(rope_short_factor=[1.0] * 3, rope_long_factor=[1.0] * 4),
        "has 3 factors: .* 4 pairs",
    ),
    (
        "below 1",
        dict(rope_short_factor=[1.0] * 4, rope_long_factor=[1.0, 0.5, 2, 2]),
        r"long_factor must be in \[1, inf\)",
    ),
    (
        "not finite",
        dict(rope_short_factor=[1.0] * 4, rope_long_factor=[1.0, math.inf, 2, 2]),
        r"in \[1, inf\)",
    ),
    ("missing", dict(rope_short_factor=[1.0] * 4), "needs rope_long_factor"),
    (
        "negative n-hat",
        dict(rope_short_factor=[1.0] * 4, rope_long_factor=[1.0] * 4, rope_keep_first=-1),
        ">= 0",
    ),
]


@pytest.mark.parametrize("case,fields,message", BAD_VALUES, ids=[case for case, _, _ in BAD_VALUES])
def test_bad_factors_are_a_one_line_error_naming_the_field(case, fields, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(rope_scaling="longrope", **fields)


def test_longrope_settings_without_longrope_are_refused():
    with pytest.raises(ValueError, match="LongRoPE's settings, and this model has rope_scaling='yarn'"):
        tiny_config(rope_scaling="yarn", rope_short_factor=[1.0] * 4)


# -----------------------------------------------------------------------------
# The KV cache across the switch


@pytest.mark.parametrize("n_prompt", [5, 16, 20])
def test_cached_decoding_equals_the_full_forward_across_the_switch(monkeypatch, n_prompt):
    """Generation re-rotates its cached keys when the sequence passes T (it runs the tokens so far again,
    as transformers does): every step's logits equal the full forward of the sequence so far, short factors
    up to T tokens and long ones past it, whether the prompt is shorter than T, T long, or longer."""
    import generation

    rng = random.Random(7)
    model = GPT(longrope_config(random_factors(rng, 4, 1.5), random_factors(rng, 4, 8.0), rope_keep_first=2))
    model.eval()
    seen = []
    monkeypatch.setattr(
        generation, "sample_next", lambda logits, *a: seen.append(logits) or logits.argmax(-1, True)
    )
    prompt = torch.randint(0, 13, (2, n_prompt), generator=torch.Generator().manual_seed(0))
    out = generation.generate_cached(model, prompt, 30, temperature=0)
    with torch.no_grad():
        for t, logits in zip(range(n_prompt, n_prompt + 30), seen):
            torch.testing.assert_close(logits, model(out[:, :t])[0][:, -1], rtol=0, atol=1e-5, msg=f"t={t}")
    assert len(seen) == 30


def test_generation_stopped_past_the_switch_leaves_the_model_short():
    """A generation that stops early (Ctrl-C in sample.py, a callback that raises) after passing T leaves no
    state behind (the scheme decides short or long from the positions it is given): the next forward of the
    same model uses the short factors up to T, as a fresh copy's."""
    import generation

    rng = random.Random(11)
    model = GPT(longrope_config(random_factors(rng, 4, 1.5), random_factors(rng, 4, 8.0)))
    model.eval()
    prompt = torch.randint(0, 13, (1, 20), generator=torch.Generator().manual_seed(0))  # past T = 16

    def stop(ids):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generation.generate_cached(model, prompt, 5, temperature=0, on_token=stop)
    fresh = GPT(model.config)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(prompt[:, :8])[0], fresh(prompt[:, :8])[0], rtol=0, atol=0)


@pytest.mark.parametrize("n_prompt", [5, 20])
def test_compiled_decoding_across_the_switch_gives_the_eager_tokens(n_prompt):
    """The switch is a tensor condition on the positions a step is given, so one compiled graph serves the
    steps on both sides of T (no recompile), and its greedy tokens equal the eager cache's."""
    import generation

    rng = random.Random(7)
    model = GPT(longrope_config(random_factors(rng, 4, 1.5), random_factors(rng, 4, 8.0), rope_keep_first=2))
    model.eval()
    prompt = torch.randint(0, 13, (2, n_prompt), generator=torch.Generator().manual_seed(0))
    torch.compiler.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled = generation.generate_cached(model, prompt, 30, temperature=0, compile=True, backend="eager")
    assert torch.equal(compiled, generation.generate_cached(model, prompt, 30, temperature=0))
