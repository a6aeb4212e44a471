"""A GPT-2 style language model whose position scheme is one switch, `GPTConfig.pos`. Top to bottom: the config;
the position encodings (learned, sinusoidal, rope, alibi, none), each a pure function plus a module applying it in
one place; attention, MLP, block; GPT, OpenAI's GPT-2 weights and the reference sampler (cached generation:
generation.py). With pos="learned" this is exactly GPT-2."""

import functools
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # FlexAttention (torch >= 2.5): attention with a score_mod fused into one compiled kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    create_block_mask = flex_attention = None

POS_SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")
# The RoPE variants' settings at plain RoPE: GPTConfig's defaults, and what a checkpoint older than them meant
ROPE_VARIANTS = MappingProxyType(dict(rope_low_freq_factor=1.0, rope_high_freq_factor=4.0, rope_fraction=1.0,
                                      nope_interval=0, nope_layers=None))
# OpenAI's released GPT-2 models, for GPT.from_pretrained: 124M, 355M, 774M and 1.5B parameters
GPT2_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


@dataclass
class GPTConfig:
    block_size: int = 1024  # training context length T; only `learned` cannot run past it
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2; False is a bit faster
    pos: str = "rope"  # one of POS_SCHEMES
    rope_base: float = 10000.0  # RoPE's base b in theta_i = b^(-2i/head_dim)
    rope_scaling: str | None = None  # None, or a context extension of ROPE_SCALINGS (set at inference)
    rope_factor: float = 1.0  # the extension factor s: target context / the original length
    rope_original_len: int | None = None  # the length rope_scaling extends (None: block_size); set by fine-tuning
    rope_low_freq_factor: float = 1.0  # llama3: pairs turning fewer times than this over T get theta/s
    rope_high_freq_factor: float = 4.0  # llama3: pairs turning more times keep theta, those between are blended
    rope_fraction: float = 1.0  # share of each head's dims RoPE rotates, the first ones (partial_rotary_factor)
    nope_interval: int = 0  # every k-th layer (k-1, 2k-1, ...) skips RoPE, as Llama 4's no_rope_layer_interval; 0: none
    nope_layers: str | None = None  # or the layers that skip RoPE, 0-based and comma-separated, e.g. 3,7

    def __post_init__(self):
        if self.pos not in POS_SCHEMES:
            raise ValueError(f"pos={self.pos!r} is not a position scheme; choose one of {', '.join(POS_SCHEMES)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.pos == "rope" and self.rope_fraction == 1.0 and self.head_dim % 2:
            raise ValueError(f"rope rotates pairs of dimensions: head size {self.head_dim} must be even")
        if self.pos == "sinusoidal" and self.n_embd % 2:
            raise ValueError(f"sinusoidal pairs sin and cos: n_embd={self.n_embd} must be even")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.rope_base <= 1.0:
            raise ValueError(f"rope_base must be > 1, got {self.rope_base}")
        if self.rope_scaling is not None and self.pos != "rope":
            raise ValueError(f"rope_scaling={self.rope_scaling!r} extends RoPE only; this model has pos={self.pos!r}")
        if self.rope_scaling not in (None, *ROPE_SCALINGS):
            raise ValueError(f"rope_scaling={self.rope_scaling!r} is not one of {', '.join(ROPE_SCALINGS)}")
        if self.rope_factor < 1.0:
            raise ValueError(f"rope_factor must be >= 1, got {self.rope_factor}")
        if self.rope_original_len is not None and self.rope_original_len < 1:
            raise ValueError(f"rope_original_len must be a positive integer, got {self.rope_original_len}")
        self._check_rope_variants()

    def _check_rope_variants(self):
        """Llama 3's frequency factors, partial rotation and the layers without RoPE: RoPE's settings only."""
        changed = [name for name, plain in ROPE_VARIANTS.items() if getattr(self, name) != plain]
        if changed and self.pos != "rope":
            given = ", ".join(f"{name}={getattr(self, name)}" for name in changed)
            raise ValueError(f"only RoPE takes {given}, and this model has pos={self.pos!r}: use pos=rope")
        llama3 = [name for name in changed if name.endswith("_freq_factor")]
        if llama3 and self.rope_scaling != "llama3":
            given = ", ".join(f"{name}={getattr(self, name)}" for name in llama3)
            raise ValueError(f"{given}: llama3's frequency factors, and this model has rope_scaling="
                             f"{self.rope_scaling!r}; give rope_scaling=llama3, or leave them at 1 and 4")
        check_llama3_factors(self.rope_low_freq_factor, self.rope_high_freq_factor)
        if not 0.0 < self.rope_fraction <= 1.0:
            raise ValueError(f"rope_fraction must be in (0, 1] (the share of each head's dimensions RoPE rotates), "
                             f"got {self.rope_fraction}")
        if self.pos == "rope" and (self.rotary_dim < 2 or self.rotary_dim % 2):
            valid = ", ".join(f"{2 * k / self.head_dim:g}" for k in range(1, min(4, self.head_dim // 2) + 1))
            raise ValueError(f"rope_fraction={self.rope_fraction} rotates int({self.head_dim} x {self.rope_fraction}) "
                             f"= {self.rotary_dim} of the head's {self.head_dim} dimensions: RoPE turns pairs, so that "
                             f"must be even and >= 2; give a multiple of 2/{self.head_dim} ({valid}, ... 1)")
        if self.rope_scaling in ("ntk", "dynamic") and self.rotary_dim < 4:
            raise ValueError(f"rope_scaling={self.rope_scaling!r} raises the base to the power d/(d-2): it needs at "
                             f"least 4 rotated dimensions, this model rotates {self.rotary_dim}")
        nope_layer_indices(self.n_layer, self.nope_interval, self.nope_layers)

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    @property
    def rotary_dim(self):
        """The dimensions of each head RoPE rotates, the first ones: int(head_dim * rope_fraction), as transformers."""
        return int(self.head_dim * self.rope_fraction)

    @property
    def rope_layers(self):
        """(n_layer,) bools: whether each layer rotates q and k, False for the layers without RoPE."""
        skipped = nope_layer_indices(self.n_layer, self.nope_interval, self.nope_layers)
        return tuple(i not in skipped for i in range(self.n_layer))


def nope_layer_indices(n_layer, interval=0, layers=None):
    """The layers that skip RoPE (0-based): every interval-th, as Llama 4, or those listed in `layers` ("3,7").
    transformers' Llama4TextConfig derives no_rope_layers = [int((i + 1) % interval != 0) for i in range(n_layer)],
    where, despite the name, 1 marks a layer that USES RoPE (huggingface/transformers#43756: it was once inverted);
    interval 4 of 8 layers skips 3 and 7. Never all of them: a model without RoPE anywhere is pos=none."""
    if interval and layers is not None:
        raise ValueError(f"nope_interval={interval} and nope_layers={layers!r} both name the layers without RoPE: "
                         "give one of them")
    if layers is not None:
        items = [item.strip() for item in layers.split(",")]
        if not all(item.isdigit() and int(item) < n_layer for item in items) or len(set(items)) < len(items):
            raise ValueError(f"nope_layers={layers!r}: give layer indices from 0 to {n_layer - 1} (n_layer={n_layer}),"
                             " comma-separated and each once")
        skipped = [int(item) for item in items]
    elif interval:
        if not 2 <= interval <= n_layer:
            raise ValueError(f"nope_interval={interval}: give 0 (every layer rotates) or 2 to n_layer={n_layer} "
                             "(1 would skip RoPE in every layer: that is pos=none)")
        skipped = [i for i in range(n_layer) if (i + 1) % interval == 0]
    else:
        return []
    if len(skipped) == n_layer:
        raise ValueError(f"nope_layers={layers!r} skips RoPE in every layer: that is pos=none")
    return skipped


# -----------------------------------------------------------------------------
# Position encodings: the pure functions (the course and the tests call these)


def sinusoidal_embedding(n_pos, dim, base=10000.0, dtype=torch.float32):
    """Vaswani et al. 2017, 3.5: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i), w_i = base^(-2i/dim): wavelengths
    2 pi to ~2 pi base. sin/cos of p + k rotate those of p, so PE(p + k) = M_k PE(p) for all p. -> (n_pos, dim)"""
    position = torch.arange(n_pos, dtype=torch.float64)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angle = position[:, None] * inv_freq[None, :]  # (n_pos, dim/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # interleave: sin, cos, sin, cos...
    return pe.to(dtype)


def rope_inv_freq(dim, base=10000.0):
    """RoPE's inverse frequencies theta_i = base^(-2i/dim), i < dim/2 (Su et al. 2021, eq. 15), in float64: pair i
    turns by m theta_i at position m, a wavelength of 2 pi / theta_i tokens. -> (dim/2,)"""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def yarn_ramp(dim, base, original_len, beta_fast=32, beta_slow=1):
    """YaRN's ramp over the dim/2 pairs (Peng et al. 2023): 0 for the pairs that turn beta_fast times or more over
    original_len = T (kept), 1 for those turning fewer than beta_slow times (interpolated), linear between. As the
    released code computes it (transformers' _compute_yarn_parameters, truncate=True): linear in the pair INDEX,
    where the paper (eq. 17-18) ramps the rotations T theta_i / 2 pi. -> (dim/2,) float64
        i(r) = d ln(T / (2 pi r)) / (2 ln base), the pair that turns r times over T; low = max(floor(i(beta_fast)), 0),
        high = min(ceil(i(beta_slow)), d - 1) (+0.001 if equal); ramp_i = clamp((i - low) / (high - low), 0, 1)
    Worked: d = 8, T = 64, theta = (1, 0.1, 0.01, 0.001): i(32) = -0.497 -> low 0, i(1) = 1.008 -> high 2,
    ramp = (0, 0.5, 1, 1) (the paper's ramp would move all 4: pair 0 turns 10.2 < 32 times)."""

    def pair_index(rotations):  # i(r), transformers' find_correction_dim
        return dim * math.log(original_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # as released: avoids dividing by zero
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)


def check_llama3_factors(low_freq_factor, high_freq_factor):
    if not 0.0 < low_freq_factor < high_freq_factor:
        raise ValueError(f"llama3's frequency factors need 0 < low < high (Llama 3.1: 1 and 4), got low_freq_factor="
                         f"{low_freq_factor} and high_freq_factor={high_freq_factor}")


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_len):
    """Llama 3.1's rescaling of RoPE's theta_i (Meta's released code; transformers' _compute_llama3_parameters), by
    the rotations r_i = T theta_i / 2 pi each pair makes over original_len = T: pairs with r_i > high_freq_factor
    keep theta_i, those with r_i < low_freq_factor get theta_i / s, and between them theta_i / s is blended towards
    theta_i by smooth_i = (r_i - low) / (high - low). A ramp in the rotations, as the YaRN paper's (eq. 17-18), not
    in the pair index as the released YaRN's (yarn_ramp); no attention scale. -> like inv_freq (float64)
    Worked: d = 32, T = 64, s = 4, low 1, high 4, base 10^4: the wavelengths 2 pi / theta_i = 2 pi 10^(i/4) are
    6.28, 11.2, 19.9, 35.3, 62.8, 112, ...: r = 10.2, 5.73, 3.22, 1.81, 1.019, 0.573, ... So pairs 0 and 1 are kept
    (r > 4), pairs 5 to 15 divided by 4 (r < 1), and pairs 2, 3, 4 blended, smooth = 0.740, 0.270, 0.006:
    theta' / theta = 1/s + smooth (1 - 1/s) = 0.805, 0.453, 0.255 (pair 4 barely blended: r = 1.019, low = 1)."""
    check_llama3_factors(low_freq_factor, high_freq_factor)
    rotations = original_len * inv_freq / (2 * math.pi)  # r_i = T / wavelength_i
    smooth = (rotations - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    # the same three cases as released, bounds included in the blend (where it equals its neighbours anyway)
    divided = torch.where(rotations < low_freq_factor, inv_freq / factor, blended)
    return torch.where(rotations > high_freq_factor, inv_freq, divided)


def rope_frequencies(head_dim, base=10000.0, scaling=None, factor=1.0, original_len=None, seq_len=None,
                     low_freq_factor=1.0, high_freq_factor=4.0):
    """RoPE's inverse frequencies rope_inv_freq(d, base) over the d = head_dim dimensions it rotates (with partial
    rotation, int(head_dim * rope_fraction), as transformers), optionally rescaled to run a model trained on
    original_len = T tokens at s = factor times that. -> (inv_freq float32, attention_scale)
    "linear": position interpolation (Chen et al. 2023), theta_i / s. "ntk": NTK-aware (bloc97, 2023), base' = base
    s^(d/(d-2)). "dynamic": NTK at the current length L = seq_len > T, base' = base (s L / T - (s - 1))^(d/(d-2)).
    "yarn": YaRN (Peng et al. 2023): theta_i / s * ramp_i + theta_i (1 - ramp_i) (yarn_ramp: fast pairs keep theta_i,
    slow ones get theta_i / s), cos and sin times 0.1 ln(s) + 1 (q.k times its square). Worked: d = 8, T = 64, s = 4,
    theta' = (1, 0.0625, 0.0025, 0.00025), scale 1.1386. "llama3": Llama 3.1's llama3_inv_freq, low_freq_factor
    and high_freq_factor bounding its blend (Llama 3.1: 1 and 4, T = 8192, s = 8), scale 1.
    """
    if scaling not in (None, *ROPE_SCALINGS):
        raise ValueError(f"rope scaling {scaling!r} is not one of {', '.join(ROPE_SCALINGS)}")
    if factor < 1.0:
        raise ValueError(f"rope factor must be >= 1 (it extends the context), got {factor}")
    if scaling in ("dynamic", "yarn", "llama3") and original_len is None:
        needs = "original_len and seq_len" if scaling == "dynamic" else "original_len"
        raise ValueError(f"{scaling} rope scaling needs {needs}")
    d, s = head_dim, factor
    theta = rope_inv_freq(d, base)
    attention_scale = 1.0
    if scaling == "linear":
        theta = theta / s
    elif scaling == "ntk":
        theta = rope_inv_freq(d, base * s ** (d / (d - 2)))
    elif scaling == "dynamic":
        if seq_len is None:
            raise ValueError("dynamic rope scaling needs original_len and seq_len")
        grown = max(1.0, s * seq_len / original_len - (s - 1))
        theta = rope_inv_freq(d, base * grown ** (d / (d - 2)))
    elif scaling == "yarn":
        ramp = yarn_ramp(d, base, original_len)
        theta = theta / s * ramp + theta * (1 - ramp)  # small i (fast pairs) keep theta_i
        attention_scale = 0.1 * math.log(s) + 1.0
    elif scaling == "llama3":
        theta = llama3_inv_freq(theta, s, low_freq_factor, high_freq_factor, original_len)
    return theta.float(), attention_scale


def default_rope_factor(length, original_len):
    """The extension factor s a RoPE scaling gets when none is given: the length to reach over the length trained
    on, never below 1 (s = 1 leaves every frequency as trained)."""
    return max(1.0, length / original_len)


def position_limit(pos, block_size):
    """The longest input a scheme encodes: block_size for learned (no trained row past it), None (unbounded) for
    the others. Past it, learned is run on the window of its last block_size tokens, positions from 0."""
    return block_size if pos == "learned" else None


def rope_cos_sin(positions, inv_freq, attention_scale=1.0):
    """cos and sin of the rotation angles position * theta_i, in inv_freq's dtype. -> two (T, head_dim/2)"""
    angle = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return angle.cos() * attention_scale, angle.sin() * attention_scale


def apply_rope(x, cos, sin):
    """Rotate each pair of x (..., T, head_dim) by its position's angle; cos, sin: (T, d/2), d the rotated dimensions.
    Pairs are halves (i, i + d/2), as GPT-NeoX and Llama; RoFormer's interleaved (2i, 2i+1) is the same rotation up to
    a fixed permutation of the head dimensions (tests/test_positions.py). Computed in cos's dtype, cast back.
    Partial rotation (d < head_dim, GPT-NeoX's rotary_pct, transformers' partial_rotary_factor): the first d
    dimensions turn, halves within them, and the rest pass unchanged, carrying no position."""
    d = 2 * cos.size(-1)
    if d < x.size(-1):
        return torch.cat([apply_rope(x[..., :d], cos, sin), x[..., d:]], dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.to(x.dtype)


def alibi_slopes(n_head):
    """ALiBi's head slopes m_h (Press et al. 2022, section 3): for n a power of two the geometric sequence from
    2^(-8/n) with that ratio (8 heads: 1/2 ... 1/256); otherwise, as the paper's code does, the slopes of the
    power of two below n, then every other slope of twice that power for the rest."""

    def power_of_two_slopes(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(power_of_two_slopes(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra)


def alibi_bias(slopes, n_query, n_key):
    """-m_h (i - j) for query i and key j, the queries being the last n_query of n_key positions; the causal mask
    is added separately. -> (n_head, n_query, n_key)"""
    query_pos = torch.arange(n_key - n_query, n_key, device=slopes.device)
    return alibi_bias_at(slopes, query_pos, torch.arange(n_key, device=slopes.device))


def alibi_bias_at(slopes, query_pos, key_pos):
    """alibi_bias between any absolute positions, query_pos (T,) and key_pos (n_key,), as a KV cache holds them."""
    distance = (query_pos[:, None] - key_pos[None, :]).to(slopes.dtype)  # i - j
    return -slopes[:, None, None] * distance[None]


def causal_mask(query_pos, key_pos, window=None):
    """Query i sees key j if j <= i and, with a window, i - j < window (itself and the window - 1 before it).
    A key position of -1 is an empty KV-cache slot, never seen. -> (n_query, n_key) bool"""
    distance = query_pos[:, None] - key_pos[None, :]  # i - j
    visible = (distance >= 0) & (key_pos >= 0)[None, :]
    if window is not None:
        visible = visible & (distance < window)
    return visible


def causal_block_mask(n, device):
    """The causal mask as FlexAttention's BlockMask: the blocks above the diagonal are skipped, not computed."""
    return create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, n, n, device=device)


class FlexMask(NamedTuple):
    """A score bias for FlexAttention: score_mod adds it inside the fused kernel, so no (n_head, T, T) tensor is
    built, and block_mask skips the blocks above the diagonal."""

    score_mod: object
    block_mask: object


# -----------------------------------------------------------------------------
# Position encodings: the modules. Each acts in one of three places, through the same hooks, called once per
# forward with absolute positions as (T,) tensors (0 .. T-1, or where a KV cache left off; keys: what it holds):
#   max_len                          the longest sequence it can encode (None: unbounded)
#   reserve(n_pos)                   make its tables cover positions 0 .. n_pos - 1 (learned refuses past its own)
#   embed(tok_emb, positions)        -> what enters the first block (learned, sinusoidal add here)
#   rotation(query_pos, seq_len)     -> RoPE's (cos, sin) for q and k, or None
#   score_bias(query_pos, key_pos)   -> an additive (1, n_head, T, n_key) score bias (ALiBi), or None
#   score_mod                        the same bias as a FlexAttention score_mod (ALiBi), or None


class NoPositions(nn.Module):
    """NoPE: no position signal. Attention is then permutation equivariant; only the causal mask
    reveals order (Haviv et al. 2022; Kazemnejad et al. 2023)."""

    max_len = None
    score_mod = None

    def __init__(self, config):
        super().__init__()

    def reserve(self, n_pos):
        pass

    def embed(self, tok_emb, positions):
        return tok_emb

    def rotation(self, query_pos, seq_len=None):
        return None

    def score_bias(self, query_pos, key_pos):
        return None


class LearnedPositions(nn.Embedding):
    """GPT-2: a trained vector per position 0..block_size-1, added to the token embedding.
    Nothing was trained past block_size, so longer inputs are refused."""

    score_mod = None

    def __init__(self, config):
        super().__init__(config.block_size, config.n_embd)
        self.max_len = config.block_size

    def reserve(self, n_pos):
        """Called with the length about to be reached (positions 0 .. n_pos - 1) before any layer runs: GPT.forward,
        and generate_cached once for all its steps. Nothing was trained past row block_size - 1, so a longer n_pos is
        refused here, in a ValueError naming block_size and the schemes that run longer ('sequence length N exceeds
        block_size=T: pos=learned has no embedding past position T-1; sinusoidal, rope, alibi and none run longer',
        the line the README quotes), not as an index error mid-forward (on a GPU, a device-side assert)."""
        if n_pos > self.max_len:
            raise ValueError(
                f"sequence length {n_pos} exceeds block_size={self.max_len}: pos=learned has no embedding past "
                f"position {self.max_len - 1}; sinusoidal, rope, alibi and none run longer"
            )

    def embed(self, tok_emb, positions):
        """tok_emb plus the table's rows at `positions`, looked up (nn.Embedding's forward) rather than the first T
        rows sliced: positions are absolute, and with a KV cache they start at cache.seen, not 0."""
        return tok_emb + super().forward(positions)  # the rows of the table at these positions

    def rotation(self, query_pos, seq_len=None):
        return None

    def score_bias(self, query_pos, key_pos):
        return None


class SinusoidalPositions(NoPositions):
    """Vaswani et al.: a fixed sin/cos table added to the tokens, extended on demand. The table has unit amplitude,
    GPT-2's token embeddings std 0.02: as in Vaswani et al. (3.4) the tokens are scaled by sqrt(n_embd) first."""

    def __init__(self, config):
        super().__init__(config)
        self.token_scale = math.sqrt(config.n_embd)
        self.register_buffer("table", sinusoidal_embedding(config.block_size, config.n_embd), persistent=False)

    def reserve(self, n_pos):
        if n_pos > self.table.size(0):  # past the cached length: only when generating beyond block_size
            n_rows = max(n_pos, 2 * self.table.size(0))
            self.table = sinusoidal_embedding(n_rows, self.table.size(1)).to(self.table.device)

    def embed(self, tok_emb, positions):
        return tok_emb * self.token_scale + self.table[positions].to(tok_emb.dtype)


class RotaryPositions(NoPositions):
    """RoPE: rotate queries and keys so that q_m . k_n depends only on m - n. float32 cos/sin, tabulated for
    block_size positions, extended on demand. A context extension rescales against the length first trained on:
    rope_original_len after a fine-tune (transformers' original_max_position_embeddings), else block_size. With
    rope_fraction < 1 the tables cover the rotary_dim dimensions that turn, their frequencies spread over those
    alone (transformers' _compute_default_rope_parameters with partial_rotary_factor), so apply_rope leaves the
    rest of each head as it is."""

    def __init__(self, config):
        super().__init__(config)
        self.dim, self.base = config.rotary_dim, config.rope_base
        self.scaling, self.factor = config.rope_scaling, config.rope_factor
        self.original_len = config.rope_original_len or config.block_size
        self.llama3_factors = config.rope_low_freq_factor, config.rope_high_freq_factor
        self._tabulate(config.block_size)

    def _cos_sin(self, positions, seq_len):
        inv_freq, scale = rope_frequencies(
            self.dim, self.base, self.scaling, self.factor, self.original_len, seq_len, *self.llama3_factors
        )
        return rope_cos_sin(positions, inv_freq.to(positions.device), scale)

    def _tabulate(self, n_pos, device=None):
        cos, sin = self._cos_sin(torch.arange(n_pos, device=device), seq_len=self.original_len)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reserve(self, n_pos):
        if n_pos > self.cos.size(0):  # past the cached length: only when generating beyond block_size
            self._tabulate(max(n_pos, 2 * self.cos.size(0)), device=self.cos.device)

    def rotation(self, query_pos, seq_len=None):
        if self.scaling == "dynamic" and seq_len > self.original_len:
            # dynamic NTK: the frequencies follow the current length, so they are recomputed as it grows
            return self._cos_sin(query_pos, seq_len)
        return self.cos[query_pos], self.sin[query_pos]


class ALiBiPositions(NoPositions):
    """ALiBi: no embedding; each head h adds -m_h * (i - j) to the score of query i on key j,
    a recency bias that needs no table and so extends to any length."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def score_bias(self, query_pos, key_pos):
        # 4-D (1, n_head, n_query, n_key): SDPA's fused CPU kernel takes no 3-D mask (docs/perf.md)
        return alibi_bias_at(self.slopes, query_pos, key_pos)[None]

    def score_mod(self, score, batch, head, q_idx, kv_idx):
        return score - self.slopes[head] * (q_idx - kv_idx)  # the same bias, inside FlexAttention's kernel


# The one place where a scheme is chosen.
POSITION_MODULES = {
    "learned": LearnedPositions,
    "sinusoidal": SinusoidalPositions,
    "rope": RotaryPositions,
    "alibi": ALiBiPositions,
    "none": NoPositions,
}


# -----------------------------------------------------------------------------
# The transformer: GPT-2's blocks


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.layer_idx = layer_idx  # which layer of a KV cache is ours
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rope=None, mask=None, cache=None, causal=True):
        """x: (B, T, C); rope: (cos, sin) for q and k; mask: None (causal), an additive bias holding the causal -inf,
        or a FlexMask; cache: a KV cache to attend to; causal=False drops the mask (the lessons' equivariance)."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        if rope is not None:  # RoPE acts here, on queries and keys (rotated in one call), before the scores
            q, k = apply_rope(qkv[:2], *rope).unbind(0)
            v = qkv[2]
        else:
            q, k, v = qkv.unbind(0)
        if cache is not None:  # keys are cached already rotated: a key's position never changes
            k, v = cache.update(self.layer_idx, k, v)
        dropout_p = self.dropout if self.training else 0.0
        if isinstance(mask, FlexMask):  # no dropout: GPT picks FlexAttention only without it
            y = compiled_flex_attention(q, k, v, score_mod=mask.score_mod, block_mask=mask.block_mask)
        elif mask is not None:  # SDPA adds a float attn_mask to the scores, in q's dtype under autocast
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)
        else:  # flash attention on CUDA; with a cache and no mask, the one query sees every key returned
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal and cache is None)
        y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # re-assemble the heads side by side
        return self.resid_dropout(y) if self.training else y  # eval: skip the identity's call (decoding is per op)


def compiled_flex_attention(q, k, v, score_mod, block_mask):
    """flex_attention fuses only when compiled (called as is, it materialises the scores): traced with the rest
    inside a compiled model, else through one compiled copy."""
    if torch.compiler.is_compiling():
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)
    return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask)


@functools.cache
def _compiled_flex():
    return torch.compile(flex_attention, dynamic=False)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU is the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_proj(self.gelu(self.c_fc(x)))
        return self.dropout(x) if self.training else x  # as in attention: no call in eval mode


class Block(nn.Module):
    """Pre-LayerNorm residual block (GPT-2): x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, mask=None, cache=None):
        x = x + self.attn(self.ln_1(x), rope, mask, cache)
        return x + self.mlp(self.ln_2(x))


# -----------------------------------------------------------------------------
# GPT


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                # the position scheme lives under GPT-2's name; only `learned` has parameters here
                wpe=POSITION_MODULES[config.pos](config),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying (Press & Wolf 2017), as GPT-2: the output head reuses the token embedding
        self.transformer.wte.weight = self.lm_head.weight
        # a score_mod bias (ALiBi) through FlexAttention: None decides per call (flex_attention_applies),
        # True / False force FlexAttention / SDPA with the bias materialised (the reference)
        self.use_flex_attention = None
        self.rope_layers = config.rope_layers  # whether each block rotates q and k: all but nope_layers / nope_interval
        self.init_weights()

    def init_weights(self):
        """GPT-2's: Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorm 1/0; the 2 n_layer projections
        adding into the residual stream (attn.c_proj, mlp.c_proj) 0.02 / sqrt(2 n_layer): variance flat in depth."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        for block in self.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    @property
    def max_len(self):
        """The longest input the position scheme encodes (block_size for learned), None if unbounded."""
        return self.transformer.wpe.max_len

    def num_params(self):
        """Trainable parameters, the tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def flex_attention_applies(self, device):
        """FlexAttention for a score_mod bias (ALiBi) by default when training on CUDA without dropout; not in eval,
        where each new length compiles it again (docs/perf.md). Elsewhere SDPA with the bias materialised."""
        if self.transformer.wpe.score_mod is None:
            return False
        dropout_due = self.training and self.config.dropout > 0
        if self.use_flex_attention is None:
            on_cuda = torch.device(device).type == "cuda" and flex_attention is not None
            return on_cuda and self.training and not dropout_due
        if self.use_flex_attention and dropout_due:
            raise ValueError("FlexAttention has no attention dropout: set dropout=0 or use_flex_attention=False")
        return self.use_flex_attention

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids -> logits (B, T, vocab_size), and the mean cross-entropy if targets are given.
        With a KV cache (generation.KVCache), idx continues the tokens it holds: positions start at cache.seen."""
        T = idx.size(1)
        start = 0 if cache is None else cache.seen
        self.transformer.wpe.reserve(start + T)  # tables grow here, outside any step; learned refuses
        query_pos = torch.arange(start, start + T, device=idx.device)
        key_pos = query_pos if cache is None else cache.begin(query_pos)
        logits = self.run(idx, query_pos, key_pos, cache, seq_len=start + T)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def run(self, idx, query_pos, key_pos, cache=None, seq_len=None):
        """The transformer on tokens idx (B, T) at absolute positions query_pos (T,), attending to keys at key_pos
        (themselves, or what the cache holds). -> logits (B, T, V)"""
        pos = self.transformer.wpe
        x = self.transformer.drop(pos.embed(self.transformer.wte(idx), query_pos))
        rope = pos.rotation(query_pos, seq_len)
        mask = self.attention_mask(query_pos, key_pos, cache, idx.device)
        for block, rotates in zip(self.transformer.h, self.rope_layers):
            x = block(x, rope if rotates else None, mask, cache)  # a layer without RoPE (nope_layers) gets none
        return self.lm_head(self.transformer.ln_f(x))

    def attention_mask(self, query_pos, key_pos, cache, device):
        """What attention gets as its mask: None (SDPA's is_causal, flash on CUDA; or one query that sees every
        key the cache returned), a FlexMask, or the causal mask from the positions plus the scheme's bias."""
        pos = self.transformer.wpe
        if cache is None and self.flex_attention_applies(device):
            return FlexMask(pos.score_mod, causal_block_mask(query_pos.numel(), device))
        bias = pos.score_bias(query_pos, key_pos)
        if cache is not None and not cache.needs_mask:
            return bias
        if cache is None and bias is None:
            return None
        visible = causal_mask(query_pos, key_pos, None if cache is None else cache.window)[None, None]
        return torch.where(visible, 0.0 if bias is None else bias, float("-inf"))  # (1, n_head or 1, T, n_key)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with decoupled weight decay on matrices only (embeddings included), none on biases and
        LayerNorm gains, which only shift or scale and gain nothing from being pulled to zero."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = device_type == "cuda"  # one kernel for the whole update
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused)

    @classmethod
    def from_pretrained(cls, name):
        """OpenAI's GPT-2 (Radford et al. 2019), name one of GPT2_MODELS, through transformers (downloaded once):
        pos="learned", bias=True, vocab 50257, block_size 1024, dropout 0."""
        return cls.from_hf_gpt2(download_gpt2(name))

    @classmethod
    def from_hf_gpt2(cls, hf_model):
        """This model with the weights of a transformers GPT2LMHeadModel already built or loaded (works offline)."""
        config, state_dict = gpt2_weights_from_hf(hf_model)
        model = cls(config)
        model.load_state_dict(state_dict)
        return model.eval()

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None):
        """The reference sampler: append max_new_tokens to idx (B, T), rerunning the whole context for each. Learned
        sees the last block_size tokens; max_context crops further, positions restarting at 0. temperature=0: argmax."""
        limits = [n for n in (self.max_len, max_context) if n is not None]
        crop = min(limits) if limits else None
        for _ in range(max_new_tokens):
            context = idx if crop is None else idx[:, -crop:]
            logits, _ = self(context)
            idx_next = sample_next(logits[:, -1, :], temperature, top_k, top_p)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """One token per row from the last position's logits (B, V) -> (B, 1). temperature=0: the most likely token.
    top_k: only the k most likely. top_p: nucleus sampling (Holtzman et al. 2020), the smallest set reaching top_p."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))  # the top token always stays
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)


# -----------------------------------------------------------------------------
# OpenAI's GPT-2 weights, in this model's terms


def download_gpt2(name):
    """transformers' GPT2LMHeadModel of one of GPT2_MODELS: downloaded once, then read from its cache."""
    if name not in GPT2_MODELS:
        raise ValueError(f"{name!r} is not an OpenAI GPT-2 model; choose one of {', '.join(GPT2_MODELS)}")
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        raise ImportError("OpenAI's GPT-2 weights (GPT.from_pretrained, sample.py --init_from) come through "
                          "Hugging Face transformers: pip install transformers") from None
    try:
        return GPT2LMHeadModel.from_pretrained(name)
    except OSError as error:
        raise RuntimeError(
            f"could not load {name!r} from the Hugging Face Hub (no internet, and not in the local cache): "
            f"{str(error).splitlines()[0]}"
        ) from error


def gpt2_weights_from_hf(hf_model):
    """(GPTConfig, state dict) of a transformers GPT2LMHeadModel, without building a GPT. The names are GPT-2's on
    both sides; HF's Conv1D stores (in, out) where nn.Linear has (out, in), so those four are transposed (views)."""
    c = hf_model.config
    if c.activation_function != "gelu_new" or c.layer_norm_epsilon != 1e-5 or c.n_inner not in (None, 4 * c.n_embd):
        raise ValueError(
            "only GPT-2's own architecture converts: activation_function='gelu_new' (tanh GELU), layer_norm_epsilon"
            f"=1e-5, n_inner=None; got {c.activation_function!r}, {c.layer_norm_epsilon}, {c.n_inner}"
        )
    config = GPTConfig(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                       n_embd=c.n_embd, dropout=0.0, bias=True, pos="learned")
    with torch.device("meta"):  # names and shapes only: nothing allocated, nothing initialised
        expected = GPT(config).state_dict()
    hf_state = hf_model.state_dict()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state_dict = {}
    for name, tensor in expected.items():  # lm_head.weight is wte.weight (tied) on both sides
        source = hf_state[name].t() if name.endswith(conv1d) else hf_state[name]
        if source.shape != tensor.shape:
            raise ValueError(f"{name}: {tuple(source.shape)} in transformers, {tuple(tensor.shape)} here")
        state_dict[name] = source
    return config, state_dict
