"""
A GPT-2 style language model whose position scheme is one switch.

Read it top to bottom, like a lesson:
  1. GPTConfig: the hyperparameters, `pos` among them.
  2. Position encodings: each scheme is a small pure function plus a module that
     applies it in exactly one place:
       learned     a trained (block_size, n_embd) table added to the tokens (GPT-2)
       sinusoidal  a fixed sin/cos table added to the tokens (Vaswani et al. 2017)
       rope        queries and keys rotated by their positions (Su et al. 2021)
       alibi       a linear distance penalty added to the attention scores (Press et al. 2022)
       none        nothing at all (NoPE): order is only visible through the causal mask
  3. Attention, MLP, Block: GPT-2's pre-LayerNorm transformer (ALiBi through FlexAttention when training on CUDA).
  4. GPT: embeddings, the stack, the tied output head, one documented init; OpenAI's GPT-2 weights.
  5. Generation: the simple reference sampler (recomputes the whole context per token), and the
     KV-cached one, which must produce the same tokens (tests/test_generation.py): a preallocated
     cache written in place, and a decode step that torch.compile can turn into one graph.

With pos="learned" this is exactly GPT-2 (same parameter names and shapes): GPT.from_pretrained("gpt2").
"""

import contextlib
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # FlexAttention (torch >= 2.5): attention with a score_mod fused into one compiled kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:
    create_block_mask = flex_attention = None

POS_SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn")
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

    def __post_init__(self):
        if self.pos not in POS_SCHEMES:
            raise ValueError(f"pos={self.pos!r} is not a position scheme; choose one of {', '.join(POS_SCHEMES)}")
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.pos == "rope" and (self.n_embd // self.n_head) % 2:
            raise ValueError(f"rope rotates pairs of dimensions: head size {self.n_embd // self.n_head} must be even")
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

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


# -----------------------------------------------------------------------------
# Position encodings: the pure functions (the course and the tests call these)


def sinusoidal_embedding(n_pos, dim, base=10000.0, dtype=torch.float32):
    """Vaswani et al. 2017, section 3.5: PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(same).

    Pair i turns at angular frequency w_i = base^(-2i/dim), i.e. wavelength 2*pi*base^(2i/dim) tokens,
    from 2*pi up to ~2*pi*base. Because sin/cos of (p + k) are a rotation of sin/cos of p, PE(p + k)
    is a fixed linear map of PE(p) for every offset k. Any length, no parameters. -> (n_pos, dim)
    """
    position = torch.arange(n_pos, dtype=torch.float64)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angle = position[:, None] * inv_freq[None, :]  # (n_pos, dim/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # interleave: sin, cos, sin, cos...
    return pe.to(dtype)


def rope_frequencies(head_dim, base=10000.0, scaling=None, factor=1.0, original_len=None, seq_len=None):
    """RoPE's inverse frequencies theta_i = base^(-2i/head_dim), i = 0 .. head_dim/2 - 1 (Su et al. 2021, eq. 15),
    optionally rescaled to run a model trained on original_len tokens at factor s times that length,
    without retraining. Returns (inv_freq float32, attention_scale); the scale multiplies cos and sin.

    scaling=None     plain RoPE.
    "linear"         position interpolation (Chen et al. 2023): positions divided by s, i.e. theta_i / s.
    "ntk"            NTK-aware: base' = base * s^(d / (d - 2)); high frequencies barely move, the lowest
                     is interpolated by s (bloc97, 2023).
    "dynamic"        dynamic NTK: the NTK base computed from the current length L = seq_len,
                     base' = base * (s * L / T - (s - 1))^(d / (d - 2)); plain RoPE while L <= T.
    "yarn"           YaRN (Peng et al. 2023): NTK-by-parts plus an attention temperature. Pairs that turn
                     many times over the trained length T keep theta_i, pairs that turn less than once are
                     interpolated (theta_i / s), a linear ramp in between; and cos, sin are multiplied by
                     0.1 ln(s) + 1 (so q.k by its square: the paper's sqrt(1/t) on each side).

    YaRN as the released models compute it. The paper (eq. 17-18) writes the ramp in the number of rotations
    r_i = T theta_i / 2pi, linear from beta_slow = 1 to beta_fast = 32 rotations. The authors' code, and so every
    released YaRN model and Hugging Face transformers (`_compute_yarn_parameters`), ramps linearly in the pair
    INDEX instead, between integer bounds:
        i(r)  = d ln(T / (2 pi r)) / (2 ln base)       the fractional pair index that turns r times over T
        low   = max(floor(i(beta_fast)), 0),  high = min(ceil(i(beta_slow)), d - 1)   (high += 0.001 if equal)
        ramp_i = clamp((i - low) / (high - low), 0, 1),  theta_i' = theta_i / s * ramp_i + theta_i * (1 - ramp_i)
    Worked example, d = 8, T = 64, s = 4, base = 10^4, so theta = (1, 0.1, 0.01, 0.001):
        i(32) = 8 ln(64 / 201.06) / (2 ln 10^4) = -0.4971 -> low = max(-1, 0) = 0
        i(1)  = 8 ln(64 / 6.2832) / (2 ln 10^4) =  1.0080 -> high = min(2, 7) = 2
        ramp = (0, 0.5, 1, 1), theta' = (1, 0.0625, 0.0025, 0.00025), attention scale 0.1 ln 4 + 1 = 1.1386.
    (The paper's r-ramp would interpolate all four pairs here: even pair 0 turns only 10.2 < 32 times.)
    """

    def plain(b):
        return b ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    if scaling not in (None, *ROPE_SCALINGS):
        raise ValueError(f"rope scaling {scaling!r} is not one of {', '.join(ROPE_SCALINGS)}")
    if factor < 1.0:
        raise ValueError(f"rope factor must be >= 1 (it extends the context), got {factor}")
    d, s = head_dim, factor
    attention_scale = 1.0
    if scaling is None:
        inv_freq = plain(base)
    elif scaling == "linear":
        inv_freq = plain(base) / s
    elif scaling == "ntk":
        inv_freq = plain(base * s ** (d / (d - 2)))
    elif scaling == "dynamic":
        if original_len is None or seq_len is None:
            raise ValueError("dynamic rope scaling needs original_len and seq_len")
        grown = max(1.0, s * seq_len / original_len - (s - 1))
        inv_freq = plain(base * grown ** (d / (d - 2)))
    else:  # yarn
        if original_len is None:
            raise ValueError("yarn rope scaling needs original_len")
        beta_fast, beta_slow = 32, 1

        def pair_index(rotations):  # i(r), transformers' find_correction_dim
            return d * math.log(original_len / (2 * math.pi * rotations)) / (2 * math.log(base))

        low = max(math.floor(pair_index(beta_fast)), 0)
        high = min(math.ceil(pair_index(beta_slow)), d - 1)
        if low == high:
            high += 0.001  # as released: avoids dividing by zero
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
        theta = plain(base)
        inv_freq = theta / s * ramp + theta * (1 - ramp)  # small i (fast pairs) keep theta_i
        attention_scale = 0.1 * math.log(s) + 1.0
    return inv_freq.float(), attention_scale


def rope_cos_sin(positions, inv_freq, attention_scale=1.0):
    """cos and sin of the rotation angles position * theta_i, in inv_freq's dtype. -> two (T, head_dim/2)"""
    angle = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]
    return angle.cos() * attention_scale, angle.sin() * attention_scale


def apply_rope(x, cos, sin):
    """Rotate each pair of coordinates of x by its position's angle. x: (..., T, head_dim); cos, sin: (T, head_dim/2).

    Pair convention: halves, as GPT-NeoX and Llama ("rotate half"): coordinate i pairs with i + head_dim/2.
    RoFormer interleaves (2i, 2i+1) instead; the two are the same rotation up to a fixed permutation of
    the head dimensions (tests/test_positions.py proves it), so attention scores are identical.
    The product is computed in cos's dtype (float32 under bf16 autocast) and cast back.
    """
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return rotated.to(x.dtype)


def alibi_slopes(n_head):
    """ALiBi head slopes m_h (Press et al. 2022, section 3).

    For n a power of two: the geometric sequence starting at 2^(-8/n) with that same ratio,
    e.g. 8 heads: 1/2, 1/4, ..., 1/256. Otherwise (the paper's rule, from its reference code): take the
    slopes of the closest power of two below n, then every other slope of twice that power for the rest.
    """

    def power_of_two_slopes(n):
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if math.log2(n_head).is_integer():
        return torch.tensor(power_of_two_slopes(n_head))
    closest = 2 ** math.floor(math.log2(n_head))
    extra = power_of_two_slopes(2 * closest)[0::2][: n_head - closest]
    return torch.tensor(power_of_two_slopes(closest) + extra)


def alibi_bias(slopes, n_query, n_key):
    """The linear penalty -m_h * (i - j) for query position i and key position j. -> (n_head, n_query, n_key)

    Queries are the last n_query of the n_key positions. The causal mask is added separately.
    """
    query_pos = torch.arange(n_key - n_query, n_key, device=slopes.device)
    return alibi_bias_at(slopes, query_pos, torch.arange(n_key, device=slopes.device))


def alibi_bias_at(slopes, query_pos, key_pos):
    """alibi_bias between any absolute positions, query_pos (T,) and key_pos (n_key,), as a KV cache holds them."""
    distance = (query_pos[:, None] - key_pos[None, :]).to(slopes.dtype)  # i - j
    return -slopes[:, None, None] * distance[None]


def causal_mask(query_pos, key_pos, window=None):
    """Which keys each query may see, from absolute positions: query i sees key j if j <= i (causal) and, with a
    window, i - j < window (sliding-window attention: itself and the window - 1 before it). A key position of -1
    marks an empty KV-cache slot, never seen. -> (n_query, n_key) bool"""
    distance = query_pos[:, None] - key_pos[None, :]  # i - j
    visible = (distance >= 0) & (key_pos >= 0)[None, :]
    if window is not None:
        visible = visible & (distance < window)
    return visible


def causal_block_mask(n, device):
    """The causal mask as FlexAttention's BlockMask: the blocks above the diagonal are skipped, not computed."""
    return create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, n, n, device=device)


# -----------------------------------------------------------------------------
# Position encodings: the modules. Each scheme acts in one of three places, through the same hooks, which GPT
# calls once per forward. Positions are absolute, as (T,) tensors: 0 .. T-1 for a plain forward; with a KV cache
# the queries continue where the cache stopped and the keys are the positions the cache holds.
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
        if n_pos > self.max_len:
            raise ValueError(
                f"sequence length {n_pos} exceeds block_size={self.max_len}: pos=learned has no embedding past "
                f"position {self.max_len - 1}; sinusoidal, rope, alibi and none run longer"
            )

    def embed(self, tok_emb, positions):
        return tok_emb + super().forward(positions)  # the rows of the table at these positions

    def rotation(self, query_pos, seq_len=None):
        return None

    def score_bias(self, query_pos, key_pos):
        return None


class SinusoidalPositions(NoPositions):
    """Vaswani et al.: a fixed sin/cos table added to the token embedding, extended on demand.

    Scale: the table has unit amplitude while GPT-2 initialises token embeddings with std 0.02, so
    added as is it drowns the tokens. As in Vaswani et al. (section 3.4) the token embeddings are
    multiplied by sqrt(n_embd) first, which brings them to the table's order of magnitude.
    """

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
    """RoPE: rotate queries and keys so that q_m . k_n depends only on m - n. No additive embedding.
    cos/sin are float32, tabulated for block_size positions and extended on demand. With a context
    extension (config.rope_scaling) the frequencies are rescaled against the length the model was first trained
    on: rope_original_len after a context-extension fine-tune at a longer block_size (Hugging Face's
    original_max_position_embeddings), else block_size."""

    def __init__(self, config):
        super().__init__(config)
        self.head_dim, self.base = config.head_dim, config.rope_base
        self.scaling, self.factor = config.rope_scaling, config.rope_factor
        self.original_len = config.rope_original_len or config.block_size
        self._tabulate(config.block_size)

    def _cos_sin(self, positions, seq_len):
        inv_freq, scale = rope_frequencies(
            self.head_dim, self.base, self.scaling, self.factor, self.original_len, seq_len
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
        # (1, n_head, n_query, n_key): SDPA's fused CPU kernel takes a 4-D mask; a 3-D one sends it down the
        # unfused math path, 3-4x slower (docs/perf.md)
        return alibi_bias_at(self.slopes, query_pos, key_pos)[None]

    def score_mod(self, score, batch, head, q_idx, kv_idx):
        """The same bias for FlexAttention, added to each score inside its fused kernel: no (n_head, T, T)
        tensor is ever built."""
        return score - self.slopes[head] * (q_idx - kv_idx)


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
        self.layer_idx = layer_idx  # which slot of a KVCache is ours
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rope=None, score_bias=None, causal=True, cache=None, slots=None, flex=None):
        """x: (B, T, C). rope: (cos, sin) to rotate q and k. score_bias: an additive (..., T, n_key) mask that
        already holds the causal -inf; None means plain causal attention. cache, slots: a KVCache and where in it
        this step's keys and values go; attention then runs over the keys and values it returns. flex:
        (score_mod, block_mask) to run FlexAttention instead of SDPA. causal=False drops the mask (lessons only)."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        if rope is not None:  # RoPE acts here, on queries and keys (rotated in one call), before the scores
            q, k = apply_rope(qkv[:2], *rope).unbind(0)
            v = qkv[2]
        else:
            q, k, v = qkv.unbind(0)
        if cache is not None:  # keys are cached already rotated: a key's position never changes
            k, v = cache.update(self.layer_idx, k, v, slots)
        dropout_p = self.dropout if self.training else 0.0
        if flex is not None:  # fused, never materialises the scores; no dropout (GPT only picks it without)
            y = compiled_flex_attention(q, k, v, score_mod=flex[0], block_mask=flex[1])
        elif score_bias is not None:
            # SDPA adds a float attn_mask to the scores; it must match q's dtype under autocast
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=score_bias.to(q.dtype), dropout_p=dropout_p)
        else:  # flash attention on CUDA. With a cache and no mask, the one query sees every key it returned
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal and cache is None)
        y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # re-assemble the heads side by side
        # dropout is the identity in eval mode: skip the call (decoding runs ~100 tiny ops per token, each shows)
        return self.resid_dropout(y) if self.training else y


def compiled_flex_attention(q, k, v, score_mod, block_mask):
    """flex_attention must be compiled to fuse (called as is, it materialises the scores). Inside a compiled
    model it is traced with the rest; otherwise it runs through one compiled copy."""
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

    def forward(self, x, rope=None, score_bias=None, cache=None, slots=None, flex=None):
        x = x + self.attn(self.ln_1(x), rope, score_bias, cache=cache, slots=slots, flex=flex)
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
        # how a score bias that has a score_mod (ALiBi) is applied: None decides per call (flex_attention_applies);
        # True / False force FlexAttention / SDPA with the bias materialised (the reference)
        self.use_flex_attention = None
        self.init_weights()

    def init_weights(self):
        """GPT-2 initialisation: every Linear and Embedding weight ~ N(0, 0.02), biases 0, LayerNorm 1/0;
        the two projections that write into the residual stream (attn.c_proj, mlp.c_proj) get
        std 0.02 / sqrt(2 * n_layer), since 2 * n_layer of them add up along the residual path."""
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
        """The one place that picks FlexAttention: only for a scheme whose bias is a score_mod (ALiBi), in a forward
        without a KV cache. By default for training on CUDA, where torch has it (>= 2.5) and no attention dropout
        is due (it has none): there the (n_head, T, T) bias is never built and the blocks above the diagonal are
        skipped. Not in eval mode: flex is compiled for static shapes, so each new length compiles it again and,
        past torch's recompile limit (8), it runs unfused; the reference sampler, one token longer at every step,
        then decoded at about 1% of SDPA's speed (docs/perf.md). Elsewhere SDPA with the materialised bias, the
        reference. self.use_flex_attention = True / False forces it."""
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
        With a KVCache, idx continues the tokens already cached: positions start at cache.seen."""
        T = idx.size(1)
        start = 0 if cache is None else cache.seen
        self.transformer.wpe.reserve(start + T)  # tables grow here, outside any step; learned refuses
        query_pos = torch.arange(start, start + T, device=idx.device)
        key_pos, slots = (query_pos, None) if cache is None else cache.begin(query_pos)
        logits = self.run(idx, query_pos, key_pos, cache, slots, seq_len=start + T)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def run(self, idx, query_pos, key_pos, cache=None, slots=None, seq_len=None):
        """The transformer on tokens idx (B, T) at absolute positions query_pos (T,), attending to keys at key_pos
        (themselves, or what the cache holds). forward() and decode_step() both come here. -> logits (B, T, V)"""
        pos = self.transformer.wpe
        x = self.transformer.drop(pos.embed(self.transformer.wte(idx), query_pos))
        rope = pos.rotation(query_pos, seq_len)
        score_bias, flex = None, None  # both None: plain causal attention, SDPA's is_causal (flash on CUDA)
        if cache is None and self.flex_attention_applies(idx.device):
            flex = (pos.score_mod, causal_block_mask(idx.size(1), idx.device))
        else:
            bias = pos.score_bias(query_pos, key_pos)
            if cache is not None and not cache.needs_mask:  # one query that sees every key the cache returned
                score_bias = bias
            elif cache is not None or bias is not None:  # the mask, from the positions, plus the scheme's bias
                visible = causal_mask(query_pos, key_pos, None if cache is None else cache.window)[None, None]
                # (1, n_head or 1, T, n_key): 4-D, as SDPA's fused CPU kernel takes a mask (see ALiBi's score_bias)
                score_bias = torch.where(visible, 0.0 if bias is None else bias, float("-inf"))
        for block in self.transformer.h:
            x = block(x, rope, score_bias, cache, slots, flex)
        return self.lm_head(self.transformer.ln_f(x))

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

    # -------------------------------------------------------------------------
    # OpenAI's GPT-2 weights (Radford et al. 2019), through Hugging Face transformers (an optional dependency)

    @classmethod
    def from_pretrained(cls, name):
        """GPT-2 as OpenAI released it: name is one of GPT2_MODELS (gpt2 = 124M ... gpt2-xl = 1.5B parameters).
        Downloads the weights with transformers' GPT2LMHeadModel.from_pretrained (or reads them from its cache)
        and converts them with from_hf_gpt2: pos="learned", bias=True, vocab 50257, block_size 1024, dropout 0."""
        return cls.from_hf_gpt2(download_gpt2(name))

    @classmethod
    def from_hf_gpt2(cls, hf_model):
        """This model with the weights of a transformers GPT2LMHeadModel, built or loaded already (so it also works
        offline): see gpt2_weights_from_hf."""
        config, state_dict = gpt2_weights_from_hf(hf_model)
        model = cls(config)
        model.load_state_dict(state_dict)
        return model.eval()

    # -------------------------------------------------------------------------
    # Generation

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None):
        """The reference sampler: append max_new_tokens tokens to idx (B, T), re-running the whole context
        for each one. Runs past block_size for every scheme but learned, which sees only the last
        block_size tokens. max_context crops the context further (positions restart inside it).
        temperature=0 picks the most likely token."""
        limits = [n for n in (self.max_len, max_context) if n is not None]
        crop = min(limits) if limits else None
        for _ in range(max_new_tokens):
            context = idx if crop is None else idx[:, -crop:]
            logits, _ = self(context)
            idx_next = sample_next(logits[:, -1, :], temperature, top_k, top_p)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

    @torch.no_grad()
    def generate_cached(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
                        on_token=None, compile=False, backend=None):
        """The same samples as generate(), in O(context) per token instead of O(context^2): the prompt is
        run once (prefill), then each new token attends to the cached keys and values (decode). Two settings
        differ from generate() by design, as README.md says: max_context, and rope_scaling="dynamic" (below).

        Positions keep counting past block_size. A scheme with a position table (learned) cannot: once the
        table is full the window of its last max_len tokens slides, positions restart inside it, and each
        new token needs the whole window recomputed (as generate() does). For the other schemes max_context is a
        sliding attention window over absolute positions (each token sees the max_context latest, so with several
        layers information still flows from further back), where generate() re-runs only the last max_context
        tokens with positions restarting at 0. With dynamic NTK scaling a key stays rotated by the frequencies of
        the length at which it was cached (as in Hugging Face transformers), where generate() rotates every key by
        those of the current length. on_token(next_ids (B, 1)) is called as each token is produced, for streaming.

        The cache is allocated once for the whole generation (a ring of max_context slots with a window). With
        compile=True every decode step runs through decode_step compiled once (see compile_decode_step; backend
        is torch.compile's, e.g. "eager" in tests): the first call pays for the compilation.
        """
        B, n_prompt = idx.shape
        crop = None if self.max_len is None else min(self.max_len, max_context or self.max_len)
        prompt = idx if crop is None else idx[:, -crop:]
        n_pos = prompt.size(1) + max_new_tokens - 1  # positions that get a key: the last token is never run
        n_pos = n_pos if crop is None else min(n_pos, crop)
        self.transformer.wpe.reserve(n_pos)  # every table sized once, before any step
        cache = KVCache(self.config.n_layer, window=max_context if crop is None else None, max_len=n_pos)
        out = torch.empty(B, n_prompt + max_new_tokens, dtype=idx.dtype, device=idx.device)
        out[:, :n_prompt] = idx
        # Eager steps run under inference_mode, which skips autograd's bookkeeping (version counters, view tracking)
        # that no_grad still does: ~10% of a decode step of this many tiny ops. `out` and the position tables were
        # made before it, so what is returned and what the model keeps are ordinary tensors (they can still train).
        # A compiled step has no such bookkeeping to skip and stays under plain no_grad, as gpt-fast runs CUDA graphs
        # (torch.compile from inside inference_mode has open CUDA-graph bugs, pytorch/pytorch#135892).
        with contextlib.nullcontext() if compile else torch.inference_mode():
            logits = self(prompt, cache=cache)[0][:, -1]  # prefill
            if compile:
                decode_step = self.compile_decode_step(backend)
                cache.mark_static()
                position = torch.full((1,), cache.seen, dtype=torch.long, device=idx.device)
            for t in range(n_prompt, n_prompt + max_new_tokens):
                idx_next = sample_next(logits, temperature, top_k, top_p)
                out[:, t : t + 1] = idx_next
                if on_token is not None:
                    on_token(idx_next)
                if t == n_prompt + max_new_tokens - 1:
                    break
                if crop is not None and t + 1 > crop:
                    # the table is full: the window slides and every position in it changes, nothing to reuse
                    logits = self(out[:, t + 1 - crop : t + 1])[0][:, -1]
                elif compile:
                    logits = decode_step(idx_next, position, cache)
                    cache.seen += 1  # Python state stays out of the compiled graph: the position advances here
                    position += 1
                else:
                    logits = self(idx_next, cache=cache)[0][:, -1]  # decode: one token against the cache
        return out

    def decode_step(self, idx, position, cache):
        """One new token per row, idx (B, 1), at the absolute position held in `position`, a (1,) long tensor,
        against a KVCache allocated for every position it will see. Shapes never change from one step to the
        next: the whole cache is attended to (empty and out-of-window slots masked), and the position is a
        tensor, not a Python int, so one compiled graph serves every step. The tables must already cover the
        position (wpe.reserve) and cache.seen is left to the caller. -> logits (B, vocab_size)"""
        key_pos, slots = cache.begin_static(position)
        return self.run(idx, position, key_pos, cache, slots)[:, -1]

    def compile_decode_step(self, backend=None):
        """decode_step through torch.compile, with static shapes (dynamic=False) and in one graph. On CUDA
        mode="reduce-overhead" records it as a CUDA graph: one launch per token instead of one per kernel. On other
        devices torch.compile's default mode; backend: torch.compile's (default inductor, which needs a C++
        compiler on CPU; "eager" traces without generating code). Each new cache size compiles again."""
        if self.config.rope_scaling == "dynamic":
            raise ValueError("rope_scaling='dynamic' recomputes the frequencies from the length at every step, "
                             "which a static decode step cannot do: generate with compile=False")
        if backend is not None:
            return torch.compile(self.decode_step, backend=backend, fullgraph=True, dynamic=False)
        mode = "reduce-overhead" if self.lm_head.weight.is_cuda else None
        return torch.compile(self.decode_step, mode=mode, fullgraph=True, dynamic=False)


# -----------------------------------------------------------------------------
# OpenAI's GPT-2 weights, in this model's terms (GPT.from_pretrained and GPT.from_hf_gpt2 build a GPT from them)


def download_gpt2(name):
    """transformers' GPT2LMHeadModel of one of GPT2_MODELS: downloaded once, then read from its cache."""
    if name not in GPT2_MODELS:
        raise ValueError(f"{name!r} is not an OpenAI GPT-2 model; choose one of {', '.join(GPT2_MODELS)}")
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        raise ImportError("OpenAI's GPT-2 weights come through Hugging Face transformers: "
                          "pip install transformers") from None
    try:
        return GPT2LMHeadModel.from_pretrained(name)
    except OSError as error:
        raise RuntimeError(
            f"could not load {name!r} from the Hugging Face Hub (no internet, and not in the local cache): "
            f"{str(error).splitlines()[0]}"
        ) from error


def gpt2_weights_from_hf(hf_model):
    """(GPTConfig, state dict) of a transformers GPT2LMHeadModel in this model's terms, without building a GPT: a
    checkpoint's two parts, loadable as one (sample.py --init_from builds the model once, from them).
    The parameter names are GPT-2's on both sides; only HF's Conv1D layers store their weight as (in, out) where
    nn.Linear has (out, in), so those four are transposed, as nanoGPT does (views: loading copies them)."""
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


# -----------------------------------------------------------------------------
# Generation: the KV cache and the sampling rule


class KVCache:
    """Each layer's keys and values of the tokens seen so far, so that decoding a token attends to them instead
    of recomputing the prefix (as gpt-fast and nanochat's engine do). Keys are stored after RoPE.

    The buffers are allocated once and written in place at each step (no concatenation per token), and every
    slot remembers the absolute position of the key it holds (`positions`, -1 while empty): the causal mask,
    a sliding window and ALiBi's distances all come from comparing a query's position with that buffer.

    window: each token sees only the `window` latest (sliding-window attention); positions keep counting. The
            buffer is then a ring of `window` slots: position p lives in slot p % window.
    max_len: how many positions it will hold, allocated at the first step; None: as many as that step needs,
            doubled whenever more are needed.
    """

    def __init__(self, n_layer, window=None, max_len=None):
        if window is not None and window < 1:
            raise ValueError(f"window must be a positive number of tokens, got {window}")
        self.window = window
        limits = [n for n in (window, max_len) if n is not None]
        self.size = min(limits) if limits else None  # slots per layer
        self.seen = 0  # tokens run through the model so far = the position of the next token
        self.k = [None] * n_layer  # per layer: (B, n_head, size, head_dim), allocated at the first step
        self.v = [None] * n_layer
        self.positions = None  # (size,): the absolute position of the key in each slot, -1 while empty
        self.n_read = None  # this step attends to slots [0, n_read) ...
        self.n_old = None  # ... or, when not None, to the n_old old keys plus this step's new ones (see begin)
        self.needs_mask = True  # False: every key this step attends to is visible to its one query

    def begin(self, query_pos):
        """Plan a step of T new tokens at query_pos = seen .. seen + T - 1. -> (key positions to attend to, slots to
        write). Slots fill from 0 in order, so those in use are always [0, min(seen, size))."""
        T, end = query_pos.numel(), self.seen + query_pos.numel()
        needed = end if self.window is None else min(end, self.window)
        if self.size is None or needed > self.size:  # room for every key a query of this step may see
            size = max(needed, 2 * (self.size or 0))
            self._resize(size if self.window is None else min(size, self.window), query_pos.device)
        elif self.positions is None:
            self._resize(self.size, query_pos.device)
        slots = query_pos % self.size
        if self.window is not None and T > 1:
            # several tokens into a ring: writing first would overwrite keys the earlier ones still see, so
            # they attend to the old keys plus all the new ones, and only the latest `size` are kept
            self.n_old, keep = min(self.seen, self.size), min(T, self.size)
            key_pos = torch.cat([self.positions[: self.n_old], query_pos])
            self.positions.index_copy_(0, slots[-keep:], query_pos[-keep:])
        else:
            self.n_old, self.n_read = None, min(end, self.size)
            self.positions.index_copy_(0, slots, query_pos)
            key_pos = self.positions[: self.n_read]
        self.needs_mask = T > 1  # one token sees all it gets: the keys before it, within the window
        self.seen = end
        return key_pos, slots

    def begin_static(self, position):
        """begin() for decode_step: one token at `position`, a (1,) tensor, written at slot position % size;
        it attends over every slot, so shapes never change. -> (key positions, slots)"""
        slots = position % self.size
        self.positions.index_copy_(0, slots, position)
        self.n_old, self.n_read, self.needs_mask = None, self.size, True
        return self.positions, slots

    def update(self, layer_idx, k, v, slots):
        """Write this step's (B, nh, T, hs) keys and values at slots, in place; return the keys and values to
        attend to."""
        if self.k[layer_idx] is None:
            B, n_head, _, head_dim = k.shape
            self.k[layer_idx] = k.new_zeros(B, n_head, self.size, head_dim)
            self.v[layer_idx] = v.new_zeros(B, n_head, self.size, head_dim)
        cached_k, cached_v = self.k[layer_idx], self.v[layer_idx]
        if self.n_old is not None:  # several tokens into a ring (see begin)
            k_all = torch.cat([cached_k[:, :, : self.n_old], k], dim=2)
            v_all = torch.cat([cached_v[:, :, : self.n_old], v], dim=2)
            keep = min(k.size(2), self.size)
            cached_k.index_copy_(2, slots[-keep:], k[:, :, -keep:])
            cached_v.index_copy_(2, slots[-keep:], v[:, :, -keep:])
            return k_all, v_all
        cached_k.index_copy_(2, slots, k)
        cached_v.index_copy_(2, slots, v)
        return cached_k[:, :, : self.n_read], cached_v[:, :, : self.n_read]

    def mark_static(self):
        """Tell torch.compile that the buffers keep their addresses from step to step, so that a CUDA graph
        writes into them where they are instead of copying them in and out at every token. (torch has no public
        name for this; transformers' StaticCache calls the same function.)"""
        for buffer in (*self.k, *self.v, self.positions):
            if buffer is not None:
                torch._dynamo.mark_static_address(buffer)

    def _resize(self, size, device):
        """(Re)allocate `size` slots per layer, keeping what the old ones held (they are a prefix)."""
        positions = torch.full((size,), -1, dtype=torch.long, device=device)
        if self.positions is not None:
            positions[: self.positions.size(0)] = self.positions
        self.positions = positions
        for buffers in (self.k, self.v):
            for i, old in enumerate(buffers):
                if old is not None:
                    buffers[i] = old.new_zeros(*old.shape[:2], size, old.size(3))
                    buffers[i][:, :, : old.size(2)] = old
        self.size = size


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """One token per row from the last position's logits (B, V) -> (B, 1).

    temperature=0: the most likely token (no division by zero). top_k: only the k most likely tokens.
    top_p: nucleus sampling (Holtzman et al. 2020), the smallest set whose probability reaches top_p.
    """
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
