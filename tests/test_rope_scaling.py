"""RoPE context extension against the reference implementation: Hugging Face transformers' own functions
(transformers/modeling_rope_utils.py, the code released models run), fed a small Llama config.

transformers computes its frequencies in float32 and rope_frequencies in float64 (then rounds to float32), so
they agree to float32's precision: rtol 1e-6. transformers has no static "ntk" type; its dynamic NTK at one
particular length is the static formula, which is how ntk is checked here.
"""

import pytest
import torch

from positions import rope_frequencies

transformers = pytest.importorskip(
    "transformers", reason="the parity tests need Hugging Face transformers: pip install transformers"
)
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

BASE = 10000.0
# (head_dim, trained length T, factor s): the worked example, a tiny model, and Llama-like shapes
SHAPES = [(8, 64, 4.0), (16, 64, 4.0), (32, 256, 2.5), (64, 2048, 8.0), (128, 4096, 16.0)]


def hf_frequencies(rope_type, head_dim, max_position_embeddings, seq_len=None, **rope_scaling):
    """transformers' (inv_freq, attention_scale) for a Llama config with one head of head_dim.

    `rope_scaling=` is the dict older versions read; newer ones (rope_parameters) convert it themselves."""
    config = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        rope_theta=BASE,
        max_position_embeddings=max_position_embeddings,
        rope_scaling={"rope_type": rope_type, **rope_scaling},
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)
    return inv_freq.double(), float(scale)


@pytest.mark.parametrize("head_dim,T,s", SHAPES)
def test_yarn_matches_transformers(head_dim, T, s):
    """YaRN: the same ramp in the pair index (floor/ceil bounds: transformers' default truncate=True) and the
    same attention factor 0.1 ln s + 1. transformers reads T from original_max_position_embeddings; the
    extended length max_position_embeddings = s T only matters there when factor is missing."""
    hf, hf_scale = hf_frequencies("yarn", head_dim, int(s * T), factor=s, original_max_position_embeddings=T)
    ours, scale = rope_frequencies(head_dim, BASE, "yarn", s, original_len=T)
    torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0)
    assert abs(scale - hf_scale) < 1e-12


@pytest.mark.parametrize("head_dim,T,s", SHAPES)
def test_linear_matches_transformers(head_dim, T, s):
    """Position interpolation: theta_i / s, attention factor 1."""
    hf, hf_scale = hf_frequencies("linear", head_dim, T, factor=s)
    ours, scale = rope_frequencies(head_dim, BASE, "linear", s, original_len=T)
    torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0)
    assert scale == hf_scale == 1.0


@pytest.mark.parametrize("head_dim,T,s", SHAPES)
def test_dynamic_matches_transformers_at_every_length(head_dim, T, s):
    """Dynamic NTK: base * ((s L / T) - (s - 1))^(d / (d - 2)) at the current length L, plain RoPE while
    L <= T. transformers reads T from max_position_embeddings (the trained length) and L from seq_len."""
    for L in (1, T // 2, T, T + 1, 3 * T, int(s * T), 5 * int(s * T)):
        hf, hf_scale = hf_frequencies("dynamic", head_dim, T, seq_len=L, factor=s)
        ours, scale = rope_frequencies(head_dim, BASE, "dynamic", s, original_len=T, seq_len=L)
        torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0, msg=f"L={L}")
        assert scale == hf_scale == 1.0


@pytest.mark.parametrize("head_dim,T,s", SHAPES)
def test_ntk_is_transformers_dynamic_ntk_at_its_fixed_point(head_dim, T, s):
    """transformers has no static NTK-aware type. Its dynamic base * (s L / T - (s - 1))^(d/(d-2)) equals the
    static base * s^(d/(d-2)) where s L / T - (s - 1) = s, i.e. at L = T (2s - 1) / s."""
    L = T * (2 * s - 1) / s
    hf, _ = hf_frequencies("dynamic", head_dim, T, seq_len=L, factor=s)
    ours, scale = rope_frequencies(head_dim, BASE, "ntk", s, original_len=T)
    torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0)
    assert scale == 1.0


@pytest.mark.parametrize("low,high", [(1.0, 4.0), (2.0, 8.0), (0.5, 32.0)])
@pytest.mark.parametrize("head_dim,T,s", SHAPES + [(128, 8192, 8.0)])
def test_llama3_matches_transformers(head_dim, T, s, low, high):
    """Llama 3.1's frequencies (transformers' _compute_llama3_parameters): kept, divided by s or blended by
    the rotations each pair makes over T, with Llama 3.1's own factors (1, 4; T = 8192, s = 8) and two others;
    no attention scale. transformers reads T from original_max_position_embeddings."""
    hf, hf_scale = hf_frequencies(
        "llama3",
        head_dim,
        int(s * T),
        factor=s,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=T,
    )
    ours, scale = rope_frequencies(
        head_dim, BASE, "llama3", s, original_len=T, low_freq_factor=low, high_freq_factor=high
    )
    torch.testing.assert_close(ours.double(), hf, rtol=1e-6, atol=0)
    assert scale == hf_scale == 1.0
