"""
Position encodings: how a GPT knows where each token is. Every scheme and RoPE context extension lives here,
in the lesson's order (docs/lesson.md): the interface every scheme implements (PositionScheme), then each
scheme, its math (pure functions: tables, frequencies, the rotation, the biases) beside its class, then the
one mask attention adds a score bias to, and the registry.

    learned, sinusoidal   add a vector to the token embedding      (embed)
    rope                  rotates queries and keys                 (rotation, applied in CausalSelfAttention)
    alibi                 adds a bias to the attention scores      (score_bias, in attention_mask)
    t5, fire              add a learned bias to the scores         (score_bias: T5's buckets, FIRE's MLP)
    none                  nothing: only the causal mask reveals order

A scheme is one PositionScheme subclass, its Settings inside, named in POSITION_MODULES: the rest of the
repository asks it, never its name. It imports only plumbing/fields.py of this repository; the exercises point
here.
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn

from plumbing.fields import changed_fields, check_fields, read_settings_file, require, setting

# -----------------------------------------------------------------------------
# The interface: what a scheme is, and what model.py asks of it


class PositionScheme(nn.Module):
    """What every scheme is; each default means "nothing here". Positions are absolute, (T,) tensors. Its
    public names, each what the core asks and only a scheme can answer (tests/test_scheme_interface.py):
        embed(tok_emb, positions)       -> what enters the first block (learned, sinusoidal add here)
        rotation(positions, seq_len)    -> (cos, sin) turning q and k (apply_rope's tables), or None; seq_len:
                                        their sequence's length (a prefill chunk's), default the last + 1
        score_bias(query_pos, key_pos)  -> (1, n_head or 1, T, n_key) added to the scores at any positions
                                        (cache slots, a method's groups), shared by the layers, or None
        Settings                        its settings: a dataclass of setting()s, named uniquely (flags)
        check_config(config)            its settings' one-line ValueError against the GPT's (head size ...)
        grow(n_pos)                     ready it for positions 0 .. n_pos - 1, outside any step: its tables
                                        extended, or a length it cannot encode refused in one line (learned)
        init_weights()                  its parameters' initial values (after GPT.init_weights' N(0, 0.02))
        flops_per_token(seq_len, batch_size)  its own training FLOPs a token beyond 6 a weight, batch_size
                                        sequences sharing what a forward builds once; None: unknown
        adapt_state(state, prefix)      -> (a checkpoint's entries fitted to it, a note): --init_from
        length_limit                    the longest sequence it encodes (None: any; past it, window_length)
        rope_layers                     whether each layer takes rotation's (cos, sin) (None: all)
        recode_past                     a length past which it encodes every position anew (a KV cache reruns)
        step_varies                     why its decode step's work depends on the length in Python (dynamic
                                        NTK), or None: one static step (a CUDA graph) serves every position
    What follows from these is read off them, not declared: overrides(scheme, "score_bias") (a bias, so the
    forward builds a mask), takes(scheme, "rope_scaling") (RoPE's settings apply)."""

    length_limit = recode_past = step_varies = rope_layers = None

    @dataclass
    class Settings:  # none; a scheme's own: @dataclass class Settings(PositionScheme.Settings)
        def __post_init__(self):
            check_fields(self)

    def __init__(self, config):
        super().__init__()

    # fmt: off
    def embed(self, tok_emb, positions): return tok_emb
    def rotation(self, positions, seq_len=None): return None
    def score_bias(self, query_pos, key_pos): return None
    @classmethod
    def check_config(cls, config): pass
    def grow(self, n_pos): pass
    def init_weights(self): pass
    def flops_per_token(self, seq_len, batch_size): return None  # unknown: GPT.flops_per_token says so
    def adapt_state(self, state, prefix): return state, None
    # fmt: on


def overrides(scheme, hook):
    """Whether a scheme (its class or an instance) overrides PositionScheme's method `hook`: a score bias
    overrides score_bias (GPT.attention_mask then builds the mask), a signal embed, rotation or score_bias."""
    cls = scheme if isinstance(scheme, type) else type(scheme)
    return getattr(cls, hook) is not getattr(PositionScheme, hook)


def takes(scheme, name):
    """Whether a scheme (class or instance) declares the setting `name` (rope_scaling: RoPE's flags apply)."""
    return any(f.name == name for f in fields(scheme.Settings))


def elementwise_flops(scheme, seq_len, batch_size):
    """flops_per_token of a scheme whose own compute is elementwise or a lookup (a table added, a rotation, a
    bias by distance): 0, as 6N leaves out LayerNorm, GELU and the residual additions (PaLM appendix B)."""
    return 0


# -----------------------------------------------------------------------------
# 1-2. No position: the causal mask alone reveals order (none)


def causal_mask(query_pos, key_pos, window=None):
    """Query i sees key j if j <= i and, with a window, i - j < window (itself and the window - 1 before it).
    A key position of -1 is an empty KV-cache slot, never seen. -> (n_query, n_key) bool"""
    distance = query_pos[:, None] - key_pos[None, :]  # i - j
    visible = (distance >= 0) & (key_pos >= 0)[None, :]
    if window is not None:
        visible = visible & (distance < window)
    return visible


class NoPositions(PositionScheme):
    """NoPE: no signal, the causal mask alone reveals order (Haviv et al. 2022; Kazemnejad et al. 2023)."""

    flops_per_token = elementwise_flops


# -----------------------------------------------------------------------------
# 3. Additive schemes: learned and sinusoidal, a vector added to each token


class LearnedPositions(PositionScheme):
    """GPT-2: a trained vector per position 0..block_size-1 (transformer.wpe.weight), added to the tokens.
    None was trained past block_size: a longer input is refused, a longer sequence runs on windows of it."""

    flops_per_token = elementwise_flops

    def __init__(self, config):
        super().__init__(config)
        self.length_limit = config.block_size
        self.weight = nn.Parameter(torch.empty(config.block_size, config.n_embd))
        self.init_weights()

    def init_weights(self):
        nn.init.normal_(self.weight, mean=0.0, std=0.02)

    def grow(self, n_pos):
        """No row was trained past block_size - 1: a longer length is refused in one line, not an index error
        mid-forward, naming the schemes that run longer (every other of POSITION_MODULES)."""
        *others, last = (name for name, scheme in POSITION_MODULES.items() if scheme is not type(self))
        past = f"pos=learned has no embedding past position {(T := self.length_limit) - 1}"
        require(n_pos <= T, f"sequence length {n_pos} exceeds block_size={T}: {past}; {', '.join(others)} "
                f"and {last} run longer")  # fmt: skip

    def embed(self, tok_emb, positions):
        # the rows at these absolute positions, not the first T: with a KV cache they go on where it left off
        return tok_emb + self.weight[positions]

    def adapt_state(self, state, prefix):
        """A (T, C) table of another block_size resized to this one's n_pos rows by linear interpolation, as
        vision transformers resize theirs (Dosovitskiy et al. 2021, 3.2) and position interpolation does for
        RoPE (Chen et al. 2023): new row p is the old table at fractional position p * T / n_pos (the last row
        past the end), so every trained row is kept when n_pos / T is whole."""
        name, n_pos = f"{prefix}weight", self.length_limit
        if name not in state or (T := state[name].size(0)) == n_pos:
            return state, None
        table, where = state[name], torch.arange(n_pos, dtype=torch.float64) * T / n_pos
        below = where.floor().long().clamp(max=T - 1)
        above, weight = (below + 1).clamp(max=T - 1), (where - below)[:, None]
        resized = ((1 - weight) * table[below].double() + weight * table[above].double()).to(table.dtype)
        note = f"the learned position table was resized from {T} to {n_pos} rows by linear interpolation"
        return state | {name: resized}, note


def sinusoidal_embedding(n_pos, dim, base=10000.0, dtype=torch.float32):
    """Vaswani et al. 2017, 3.5: PE[p, 2i] = sin(p w_i), PE[p, 2i+1] = cos(p w_i), w_i = base^(-2i/dim),
    wavelengths 2 pi to ~2 pi base; PE(p + k) = M_k PE(p), a rotation of the pairs at p. -> (n_pos, dim)"""
    position = torch.arange(n_pos, dtype=torch.float64)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angle = position[:, None] * inv_freq[None, :]  # (n_pos, dim/2)
    pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # interleave: sin, cos, sin, cos...
    return pe.to(dtype)


class SinusoidalPositions(PositionScheme):
    """Vaswani et al.: a fixed sin/cos table added to the tokens, extended on demand. The table has unit
    amplitude, GPT-2's token embeddings std 0.02: tokens are scaled by sqrt(n_embd) (Vaswani et al. 3.4)."""

    flops_per_token = elementwise_flops

    @classmethod
    def check_config(cls, c):
        require(c.n_embd % 2 == 0, f"sinusoidal pairs sin and cos: n_embd={c.n_embd} must be even")

    def __init__(self, config):
        super().__init__(config)
        self.token_scale = math.sqrt(config.n_embd)
        table = sinusoidal_embedding(config.block_size, config.n_embd)
        self.register_buffer("table", table, persistent=False)

    def grow(self, n_pos):
        if n_pos > (rows := self.table.size(0)):  # past the cached length: generating beyond block_size
            self.table = sinusoidal_embedding(max(n_pos, 2 * rows), self.table.size(1)).to(self.table.device)

    def embed(self, tok_emb, positions):
        return tok_emb * self.token_scale + self.table[positions].to(tok_emb.dtype)


# -----------------------------------------------------------------------------
# 4. RoPE: queries and keys rotated, scores depending on the offset; 4b-4c its context extensions


ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn", "llama3")  # each computed from the factor s alone
LONGROPE = "longrope"  # a factor per frequency pair, from a Phi-3 config or searched
ROPE_SCALING_CHOICES = (*ROPE_SCALINGS, LONGROPE)
LONGROPE_FIELDS = ("rope_short_factor", "rope_long_factor", "rope_attention_factor", "rope_keep_first")
LLAMA3_FACTORS = ("rope_low_freq_factor", "rope_high_freq_factor")  # llama3's blend
ROPE_FACTORS_KEYS = dict(  # a factors file's keys (Phi-3's rope_scaling block; n-hat): the setting each sets
    type=None, rope_type=None, factor="rope_factor", short_factor="rope_short_factor",
    long_factor="rope_long_factor", original_max_position_embeddings="rope_original_len",
    attention_factor="rope_attention_factor", keep_first="rope_keep_first")  # fmt: skip


def rope_inv_freq(dim, base=10000.0):
    """RoPE's inverse frequencies theta_i = base^(-2i/dim), i < dim/2 (Su et al. 2021, eq. 15), float64:
    pair i turns by m theta_i at position m, a wavelength of 2 pi / theta_i tokens. -> (dim/2,)"""
    return base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def rotary_dim(head_dim, fraction=1.0):
    """The dimensions of each head RoPE rotates, the first ones: int(head_dim * fraction), as transformers."""
    return int(head_dim * fraction)


def nope_layer_indices(n_layer, interval=0, layers=None):
    """The layers that skip RoPE (0-based): every interval-th as Llama 4 (transformers' no_rope_layers marks a
    layer that USES RoPE, (i + 1) % interval != 0: interval 4 of 8 skips 3 and 7), or those in `layers`
    ("3,7"). Never all of them: a model without RoPE anywhere is pos=none."""
    items = [item.strip() for item in layers.split(",")] if layers is not None else []
    valid = len(set(items)) == len(items) and all(item.isdigit() and int(item) < n_layer for item in items)
    indices = f"give layer indices from 0 to {n_layer - 1} (n_layer={n_layer}), comma-separated and each once"
    require(valid, f"nope_layers={layers!r}: {indices}")
    every = f"give 0 (every layer rotates) or 2 to n_layer={n_layer} (1 skips RoPE everywhere: pos=none)"
    require(interval in (0, *range(2, n_layer + 1)), f"nope_interval={interval}: {every}")
    every_kth = [i for i in range(n_layer) if interval and (i + 1) % interval == 0]
    skipped = [int(item) for item in items] or every_kth
    require(len(skipped) < n_layer, f"nope_layers={layers!r} skips RoPE in every layer: that is pos=none")
    return skipped


def rope_cos_sin(positions, inv_freq, attention_scale=1.0):
    """The tables apply_rope multiplies by, times the attention scale, in inv_freq's dtype: each angle
    position * theta_i twice, as transformers' cat((freqs, freqs)) (pair i is dimensions i and i + d/2), the
    sin's first half negated so that turning a pair is two products and a sum (apply_rope). Built when the
    table is, not per layer. -> cos (T, d) = (cos a, cos a), sin (T, d) = (-sin a, sin a)"""
    angle = positions.to(inv_freq.dtype)[:, None] * inv_freq[None, :]  # (T, d/2)
    cos, sin = angle.cos() * attention_scale, angle.sin() * attention_scale
    return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)


def apply_rope(x, cos, sin):
    """Rotate each pair of x (..., T, head_dim) by its position's angle; cos, sin: rope_cos_sin's (T, d), d
    the dimensions rotated (d < head_dim: the rest pass unchanged, transformers' partial_rotary_factor). Pairs
    are halves (i, i + d/2), as GPT-NeoX and Llama; RoFormer's interleaved (2i, 2i+1) is the same rotation up
    to a fixed permutation of the head dimensions (tests/test_positions.py). transformers' x cos +
    rotate_half(x) sin with rotate_half's sign in the sin table: x cos + roll(x, d/2) sin, four kernels a call
    (full-width products: faster than half-width ones on the strided q and k), in cos's dtype, cast back."""
    d = cos.size(-1)
    if d < x.size(-1):
        return torch.cat([apply_rope(x[..., :d], cos, sin), x[..., d:]], dim=-1)
    swapped = x.roll(d // 2, dims=-1)  # (x2, x1): rotate_half(x) = (-x2, x1), its sign in sin
    return (x * cos + swapped * sin).to(x.dtype)


def yarn_ramp(dim, base, original_len, beta_fast=32, beta_slow=1):
    """YaRN's ramp over the dim/2 pairs (Peng et al. 2023): 0 for pairs turning beta_fast times or more over
    original_len = T (kept), 1 for those turning fewer than beta_slow times (interpolated), linear between. As
    released (transformers' _compute_yarn_parameters, truncate=True): linear in the pair INDEX, where the
    paper (eq. 17-18) ramps the rotations T theta_i / 2 pi. -> (dim/2,) float64
        i(r) = d ln(T / (2 pi r)) / (2 ln base), the pair turning r times over T;
        low = max(floor(i(beta_fast)), 0), high = min(ceil(i(beta_slow)), d - 1) (+0.001 if equal)
        ramp_i = clamp((i - low) / (high - low), 0, 1)
    Worked: d = 8, T = 64, theta = (1, 0.1, 0.01, 0.001): i(32) = -0.497 -> low 0, i(1) = 1.008 -> high 2,
    ramp = (0, 0.5, 1, 1) (the paper's ramp would move all 4: pair 0 turns 10.2 < 32 times)."""

    def pair_index(rotations):  # i(r), transformers' find_correction_dim
        return dim * math.log(original_len / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(pair_index(beta_fast)), 0)
    high = min(math.ceil(pair_index(beta_slow)), dim - 1)
    high += 0.001 if low == high else 0  # as released: avoids dividing by zero
    return ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, original_len):
    """Llama 3.1's rescaling of theta_i (Meta's released code; transformers' _compute_llama3_parameters), by
    the rotations r_i = T theta_i / 2 pi each pair makes over original_len = T: pairs with r_i > high keep
    theta_i, those with r_i < low get theta_i / s, and between them theta_i / s is blended towards theta_i by
    smooth_i = (r_i - low) / (high - low). A ramp in the rotations, as the YaRN paper's (eq. 17-18), not in
    the pair index as the released YaRN's (yarn_ramp); no attention scale. -> like inv_freq (float64)
    Worked: d = 32, T = 64, s = 4, low 1, high 4: wavelengths 2 pi 10^(i/4) = 6.28, 11.2, 19.9, 35.3, 62.8,
    ... give r = 10.2, 5.73, 3.22, 1.81, 1.019, ...: pairs 0 and 1 kept (r > 4), 5 to 15 divided by 4 (r < 1),
    2, 3, 4 blended (smooth 0.740, 0.270, 0.006): theta' / theta = 1/s + smooth (1 - 1/s) = 0.805, 0.453,
    0.255."""
    rotations = original_len * inv_freq / (2 * math.pi)  # r_i = T / wavelength_i
    smooth = (rotations - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    # the same three cases as released, bounds included in the blend (where it equals its neighbours anyway)
    divided = torch.where(rotations < low_freq_factor, inv_freq / factor, blended)
    return torch.where(rotations > high_freq_factor, inv_freq, divided)


def rope_frequencies(head_dim, base=10000.0, scaling=None, factor=1.0, original_len=None, seq_len=None,
                     low_freq_factor=1.0, high_freq_factor=4.0, short_factor=None, long_factor=None,
                     attention_factor=None):  # fmt: skip
    """RoPE's rope_inv_freq(d, base) over the d dimensions it rotates (int(head_dim * rope_fraction)),
    optionally rescaled to run a model trained on original_len = T tokens at s = factor times that.
    -> (inv_freq float32, attention_scale)
        linear   position interpolation (Chen et al. 2023): theta_i / s
        ntk      NTK-aware (bloc97, 2023): base' = base s^(d/(d-2))
        dynamic  NTK at the current length L = seq_len > T: base' = base (s L / T - (s - 1))^(d/(d-2))
        yarn     YaRN (Peng et al. 2023): theta_i / s * ramp_i + theta_i (1 - ramp_i) (yarn_ramp: fast pairs
                 keep theta_i), cos and sin times 0.1 ln(s) + 1 (q.k times its square). Worked: d = 8, T = 64,
                 s = 4: theta' = (1, 0.0625, 0.0025, 0.00025), scale 1.1386
        llama3   Llama 3.1's llama3_inv_freq, its blend bounded by low_freq_factor and high_freq_factor
                 (Llama 3.1: 1 and 4, T = 8192, s = 8), scale 1
        longrope LongRoPE (Ding et al. 2024; Phi-3): theta_i / lambda_i, a factor per pair, short_factor while
                 seq_len <= T, long_factor past it; scale attention_factor, by default longrope_scale(s, T).
                 As transformers' _compute_longrope_parameters. Its settings' rules checked, as a model's."""
    RotaryPositions.Settings(rope_scaling=scaling, rope_factor=factor, rope_low_freq_factor=low_freq_factor,
        rope_high_freq_factor=high_freq_factor, rope_short_factor=short_factor, rope_long_factor=long_factor,
        rope_attention_factor=attention_factor)  # fmt: skip
    if scaling in ("dynamic", "yarn", "llama3", LONGROPE) and original_len is None:
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
        require(seq_len is not None, "dynamic rope scaling needs original_len and seq_len")
        grown = max(1.0, s * seq_len / original_len - (s - 1))
        theta = rope_inv_freq(d, base * grown ** (d / (d - 2)))
    elif scaling == "yarn":
        ramp = yarn_ramp(d, base, original_len)
        theta = theta / s * ramp + theta * (1 - ramp)  # small i (fast pairs) keep theta_i
        attention_scale = 0.1 * math.log(s) + 1.0
    elif scaling == "llama3":
        theta = llama3_inv_freq(theta, s, low_freq_factor, high_freq_factor, original_len)
    elif scaling == LONGROPE:
        long = seq_len is not None and seq_len > original_len
        theta = theta / torch.tensor(long_factor if long else short_factor, dtype=torch.float64)
        attention_scale = longrope_scale(s, original_len) if attention_factor is None else attention_factor
    return theta.float(), attention_scale


def longrope_scale(factor, original_len):
    """LongRoPE's default attention factor (Phi-3's "su" scaling): sqrt(1 + ln s / ln T) for s > 1, else 1.
    Worked: Phi-3-mini-128k, s = 131072 / 4096 = 32, T = 4096: sqrt(1 + 3.466 / 8.318) = 1.1902."""
    return math.sqrt(1 + math.log(factor) / math.log(original_len)) if factor > 1 else 1.0


def default_rope_factor(length, original_len):
    """The factor s a RoPE scaling gets when none is given: the length to reach over the length trained on,
    never below 1 (s = 1 leaves every frequency as trained)."""
    return max(1.0, length / original_len)


class RotaryPositions(PositionScheme):
    """RoPE: rotate queries and keys so that q_m . k_n depends only on m - n. cos/sin tabulated for block_size
    positions, extended on demand, over the rotary_dim dimensions that turn. A context extension rescales
    against the length first trained on: rope_original_len after a fine-tune, else block_size. LongRoPE turns
    every position of a sequence longer than that with its long factors (as transformers), the first
    rope_keep_first (n-hat) with plain RoPE's (the authors' MixedLongRoPEScaledRotaryEmbedding)."""

    flops_per_token = elementwise_flops

    # fmt: off
    @dataclass
    class Settings(PositionScheme.Settings):
        rope_base: float = setting(10000.0, above=1)  # RoPE's base b in theta_i = b^(-2i/head_dim)
        rope_scaling: str | None = setting(None, choices=ROPE_SCALING_CHOICES)  # an extension (at inference)
        rope_factor: float = setting(1.0, at_least=1)  # the extension factor s: target / original length
        rope_original_len: int | None = setting(None, at_least=1)  # the length it extends; None: block_size
        rope_low_freq_factor: float = 1.0  # llama3: pairs turning fewer times over T get theta/s
        rope_high_freq_factor: float = 4.0  # llama3: pairs turning more keep theta; between: blended
        rope_fraction: float = setting(1.0, above=0, at_most=1)  # share of a head's dims rotated, the first
        nope_interval: int = setting(0, at_least=0)  # every k-th layer (k-1, 2k-1, ...) skips RoPE (Llama 4)
        nope_layers: str | None = None  # or the layers that skip RoPE, 0-based, comma-separated: 3,7
        rope_short_factor: list[float] | None = setting(None, at_least=1, below=math.inf)  # to original_len
        rope_long_factor: list[float] | None = setting(None, at_least=1, below=math.inf)  # past it
        rope_attention_factor: float | None = setting(None, above=0)  # cos/sin scale; None: sqrt(1+ln s/ln T)
        rope_keep_first: int = setting(0, at_least=0)  # longrope's n-hat: positions below turn as RoPE
        rope_factors: str | None = None  # longrope's from a JSON file (ROPE_FACTORS_KEYS), kept as values
        at_sampling = ("rope_scaling", "rope_factor", *LLAMA3_FACTORS, "rope_factors")  # sample.py may change
        at_init_from = (*at_sampling, "rope_original_len", *LONGROPE_FIELDS)  # and train.py --init_from

        def __post_init__(self):
            """A factors file read into its settings (longrope); then: a factor or an original length with an
            extension; llama3's factors with llama3 only; LongRoPE's with longrope, which needs them."""
            if (path := self.rope_factors) is not None:  # its type: longrope, or "su" (Phi-3's first name)
                kind = read_settings_file(self, "rope_factors", ROPE_FACTORS_KEYS, "LongRoPE factors file")
                kind = kind.get("type", kind.get("rope_type", LONGROPE))
                require(kind in (LONGROPE, "su"), f"{path}: type {kind!r} is not longrope")
                drop = f"rope_factors={path} is longrope's factors: drop rope_scaling={self.rope_scaling}"
                require(self.rope_scaling in (None, LONGROPE), drop)
                self.rope_scaling = LONGROPE
            super().__post_init__()
            changed, extension = changed_fields(self), ("rope_factor", "rope_original_len")
            scales = " and ".join(f"{n}={changed[n]}" for n in extension if n in changed)
            require(self.rope_scaling or not scales, f"{scales} needs rope_scaling, the extension it sets "
                    "(without one RoPE is not scaled): give one, or drop it")
            llama3 = ", ".join(f"{n}={getattr(self, n)}" for n in changed if n in LLAMA3_FACTORS)
            has = f"this model has rope_scaling={self.rope_scaling!r}"
            require(not llama3 or self.rope_scaling == "llama3", f"{llama3}: llama3's frequency factors, and "
                    f"{has}; give rope_scaling=llama3, or leave them at 1 and 4")
            low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
            require(0 < low < high, "llama3's frequency factors need 0 < low < high (Llama 3.1: 1 and 4), "
                    f"got low_freq_factor={low} and high_freq_factor={high}")
            both = f"nope_interval={self.nope_interval} and nope_layers={self.nope_layers!r} both name"
            require(not (self.nope_interval and self.nope_layers is not None),
                    f"{both} the layers without RoPE: give one of them")
            longrope = ", ".join(n for n in LONGROPE_FIELDS if n in changed)
            if self.rope_scaling != LONGROPE:
                return require(not longrope, f"{longrope}: LongRoPE's settings, and {has}")
            missing = " and ".join(n for n in LONGROPE_FIELDS[:2] if getattr(self, n) is None)
            require(not missing, f"rope_scaling=longrope needs {missing}: give rope_factors=FILE")
    # fmt: on

    def __init__(self, config):
        super().__init__(config)
        s = config.pos_settings
        self.dim, self.base = rotary_dim(config.head_dim, s.rope_fraction), s.rope_base
        self.scaling, self.factor, self.keep_first = s.rope_scaling, s.rope_factor, s.rope_keep_first
        self.original_len = s.rope_original_len or config.block_size
        self.llama3_factors = s.rope_low_freq_factor, s.rope_high_freq_factor
        self.longrope = s.rope_short_factor, s.rope_long_factor, s.rope_attention_factor
        skipped = nope_layer_indices(config.n_layer, s.nope_interval, s.nope_layers)
        self.rope_layers = tuple(i not in skipped for i in range(config.n_layer))
        self.recode_past = self.original_len if self.scaling == LONGROPE else None
        if self.scaling == "dynamic":
            self.step_varies = "rope_scaling='dynamic' recomputes the frequencies from the length each step"
        self._tabulate(config.block_size)

    @classmethod
    def check_config(cls, c):
        """Against the model: an even count >= 2 rotated (ntk: 4), a LongRoPE factor a pair, nope layers."""
        s, head_dim = c.pos_settings, c.n_embd // c.n_head
        odd = s.rope_fraction == 1.0 and head_dim % 2
        require(not odd, f"rope rotates pairs of dimensions: head size {head_dim} must be even")
        rotary = rotary_dim(head_dim, s.rope_fraction)
        if rotary < 2 or rotary % 2:
            valid = ", ".join(f"{2 * k / head_dim:g}" for k in range(1, min(4, head_dim // 2) + 1))
            turns = f"int({head_dim} x {s.rope_fraction}) = {rotary} of the head's {head_dim} dimensions"
            even = f"RoPE turns pairs, so that must be even and >= 2; give a multiple of 2/{head_dim}"
            raise ValueError(f"rope_fraction={s.rope_fraction} rotates {turns}: {even} ({valid}, ... 1)")
        power = f"rope_scaling={s.rope_scaling!r} raises the base to the power d/(d-2): it needs at least 4"
        few = s.rope_scaling in ("ntk", "dynamic") and rotary < 4
        require(not few, f"{power} rotated dimensions, this model rotates {rotary}")
        for name in LONGROPE_FIELDS[:2] if s.rope_scaling == LONGROPE else ():
            count = f"{len(getattr(s, name))} factors: this model rotates {rotary // 2} pairs, one each"
            require(len(getattr(s, name)) == rotary // 2, f"{name} has {count}")
        nope_layer_indices(c.n_layer, s.nope_interval, s.nope_layers)

    def _cos_sin(self, positions, seq_len):
        scaling = self.scaling, self.factor, self.original_len, seq_len, *self.llama3_factors, *self.longrope
        inv_freq, scale = rope_frequencies(self.dim, self.base, *scaling)
        return rope_cos_sin(positions, inv_freq.to(positions.device), scale)

    def _tabulate(self, n_pos, device=None):
        positions = torch.arange(n_pos, device=device)
        tables = dict(zip(("cos", "sin"), self._cos_sin(positions, seq_len=self.original_len)))
        if self.scaling == LONGROPE:  # the long factors: those of any sequence longer than original_len
            tables |= zip(("long_cos", "long_sin"), self._cos_sin(positions, seq_len=math.inf))
            first = positions[: self.keep_first]
            plain = rope_cos_sin(first, rope_frequencies(self.dim, self.base)[0].to(device))
            for name, table in tables.items():
                table[: len(first)] = plain[name.endswith("sin")]
        for name, table in tables.items():
            self.register_buffer(name, table, persistent=False)

    def grow(self, n_pos):
        if n_pos > self.cos.size(0):  # past the cached length: only when generating beyond block_size
            self._tabulate(max(n_pos, 2 * self.cos.size(0)), device=self.cos.device)

    def rotation(self, positions, seq_len=None):
        if self.scaling == "dynamic":  # NTK at the length reached (last position + 1), recomputed
            reached = int(positions[-1]) + 1
            if reached > self.original_len:
                return self._cos_sin(positions, reached)
        if self.scaling == LONGROPE:  # a tensor condition, so that a compiled decode step holds both
            end = positions[-1] + 1 if seq_len is None else seq_len
            long = torch.as_tensor(end > self.original_len, device=positions.device)
            cos = torch.where(long, self.long_cos[positions], self.cos[positions])
            return cos, torch.where(long, self.long_sin[positions], self.sin[positions])
        return self.cos[positions], self.sin[positions]


# -----------------------------------------------------------------------------
# 5. ALiBi: a distance penalty on the scores


def alibi_slopes(n_head):
    """ALiBi's head slopes m_h (Press et al. 2022, section 3): for n a power of two the geometric sequence
    from 2^(-8/n) with that ratio (8 heads: 1/2 ... 1/256); otherwise, as the paper's code, the slopes of the
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
    """-m_h (i - j) for query i and key j, the queries the last n_query of n_key positions; the causal mask is
    added separately. -> (n_head, n_query, n_key)"""
    query_pos = torch.arange(n_key - n_query, n_key, device=slopes.device)
    return alibi_bias_at(slopes, query_pos, torch.arange(n_key, device=slopes.device))


def alibi_bias_at(slopes, query_pos, key_pos):
    """alibi_bias between any positions, query_pos (T,) and key_pos (n_key,), as a KV cache holds them."""
    distance = (query_pos[:, None] - key_pos[None, :]).to(slopes.dtype)  # i - j
    return -slopes[:, None, None] * distance[None]


class ALiBiPositions(PositionScheme):
    """ALiBi: no embedding; each head h adds -m_h * (i - j) to the score of query i on key j,
    a recency bias that needs no table and so extends to any length."""

    flops_per_token = elementwise_flops

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def score_bias(self, query_pos, key_pos):
        # 4-D (1, n_head, n_query, n_key): SDPA's fused CPU kernel takes no 3-D mask (docs/perf.md)
        return alibi_bias_at(self.slopes, query_pos, key_pos)[None]


# -----------------------------------------------------------------------------
# 5b. Relative biases the model learns: T5's buckets and FIRE, each a pure function, then its module. Both
# act as ALiBi does, through score_bias, built once per forward (GPT.attention_mask), shared by every layer.


def t5_bucket(distance, num_buckets=32, max_distance=128):
    """T5's bucket of each distance d = i - j of query i to key j, causal (Raffel et al. 2020, 2.1; Mesh
    TensorFlow's _relative_position_bucket with bidirectional=False, as transformers' T5Attention): with
    n = num_buckets / 2, a bucket each for d < n, then n + floor(ln(d / n) / ln(max_distance / n) (num_buckets
    - n)), log-spaced, computed in float32 as T5, capped at num_buckets - 1: every d >= max_distance shares
    the last. A later key (d < 0, masked) counts as d = 0. -> long, distance's shape
    Worked: 32 buckets to 128: d = 0 .. 15 -> 0 .. 15, 16 -> 16, 20 -> 17, 32 -> 21, 64 -> 26, 112 -> 30, and
    from 113 on 31."""
    distance = distance.clamp(min=0)
    exact = num_buckets // 2
    ratio = distance.clamp(min=exact).float() / exact  # >= 1: the log of a small d is never taken
    far = exact + (ratio.log() / math.log(max_distance / exact) * (num_buckets - exact)).long()
    return torch.where(distance < exact, distance, far.clamp(max=num_buckets - 1))


class T5Positions(PositionScheme):
    """T5's relative attention bias (Raffel et al. 2020, 2.1): a learned scalar per head for each bucket of
    i - j (t5_bucket), computed once and shared by every layer as T5's. Past max_distance keys share the last
    bucket's bias, no longer told apart. Drawn N(0, 0.02) as every nn.Embedding (transformers: N(0, 1 /
    sqrt(d_model)), 0.036 at 768): a near-zero bias at the start either way."""

    flops_per_token = elementwise_flops  # a lookup

    @dataclass
    class Settings(PositionScheme.Settings):  # T5's (T5Config.relative_attention_num_buckets, _max_distance)
        t5_num_buckets: int = setting(32, at_least=2)  # T5's buckets, the first half a distance each
        t5_max_distance: int = setting(128, at_least=1)  # the distance from which keys share T5's last bucket

        def __post_init__(self):
            super().__post_init__()
            n, exceed = self.t5_num_buckets // 2, f"t5_max_distance={self.t5_max_distance} must exceed"
            require(self.t5_max_distance > n, f"{exceed} t5_num_buckets // 2 = {n}, the ones a bucket each")

    def __init__(self, config):
        super().__init__(config)
        s = config.pos_settings
        self.num_buckets, self.max_distance = s.t5_num_buckets, s.t5_max_distance
        self.relative_attention_bias = nn.Embedding(self.num_buckets, config.n_head)  # T5's name and shape

    def score_bias(self, query_pos, key_pos):
        buckets = t5_bucket(query_pos[:, None] - key_pos[None, :], self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).permute(2, 0, 1)[None]  # (1, n_head, n_query, n_key)


def fire_input(query_pos, key_pos, c, threshold):
    """FIRE's progressive interpolation (Li et al. 2024): psi(i - j) / psi(max(L, i)) with
    psi(x) = ln(1 + c x), for query i and key j; c > 0 and L = threshold >= 1 tensors, so that gradients
    reach them. In [0, 1] for 0 <= j <= i at any length (i - j <= i <= max(L, i), psi increasing), 0 at i = j;
    a later key (masked) counts as i = j. -> (n_query, n_key), in c's dtype
    Worked: c = 1, L = 4: i = 2, j = 0 -> ln 3 / ln 5 = 0.683; i = 8, j = 0 -> 1; i = 8, j = 6 -> 0.5."""
    i = query_pos.to(c.dtype)[:, None]
    distance = (i - key_pos.to(c.dtype)[None, :]).clamp(min=0)
    return torch.log1p(c * distance) / torch.log1p(c * torch.maximum(i, threshold))


class FIREPositions(PositionScheme):
    """FIRE (Li et al., ICLR 2024): the bias of query i on key j is f(fire_input(i, j)), f an MLP 1 ->
    fire_hidden -> n_head with ReLU (the paper's f: R -> R^H; 32 hidden units as the public PyTorch FIRE,
    mcleish7/arithmetic, cramming/architectures/embeddings.py). Every input is in [0, 1] at any length: past
    the training length f meets only finer ones (progressive interpolation). One f shared by every layer (that
    code builds one per layer). c = e^c_log from 0.1, L = 1 + e^L_log from 1 + block_size / 4 (that code: 512
    of the paper's 2048): positive with smooth gradients where that code takes |c| and |L|."""

    @dataclass
    class Settings(PositionScheme.Settings):
        fire_hidden: int = setting(32, at_least=1)  # FIRE's hidden units in its MLP f (the public code's 32)

    def __init__(self, config):
        super().__init__(config)
        self.hidden, self.n_head = config.pos_settings.fire_hidden, config.n_head  # f's hidden units, outputs
        # f's weights drawn as nn.Linear draws them, the public code's start, but held as plain Parameters:
        # GPT.init_weights' N(0, 0.02) and zero biases would start f linear in x and of order 1e-3
        first, second = nn.Linear(1, self.hidden), nn.Linear(self.hidden, config.n_head)
        self.w1, self.b1 = nn.Parameter(first.weight.detach()), nn.Parameter(first.bias.detach())
        self.w2, self.b2 = nn.Parameter(second.weight.detach()), nn.Parameter(second.bias.detach())
        self.c_log = nn.Parameter(torch.tensor(math.log(0.1)))
        self.L_log = nn.Parameter(torch.tensor(math.log(config.block_size / 4)))

    def flops_per_token(self, seq_len, batch_size):
        """f's two matmuls, forward and backward (6 per weight), on each of the seq_len^2 pairs of one
        forward, whose bias all batch_size sequences share."""
        return 6 * self.hidden * (1 + self.n_head) * seq_len * seq_len / (batch_size * seq_len)

    def score_bias(self, query_pos, key_pos):
        x = fire_input(query_pos, key_pos, self.c_log.exp(), 1 + self.L_log.exp())[..., None]  # (n_q, n_k, 1)
        hidden = torch.relu(nn.functional.linear(x, self.w1, self.b1))  # (n_query, n_key, 32)
        return nn.functional.linear(hidden, self.w2, self.b2).permute(2, 0, 1)[None]  # (1, n_head, n_q, n_k)


# -----------------------------------------------------------------------------
# Attention's one mask: the causal mask and a scheme's score bias (model.py, its KV cache, lab/finetune)


def attention_mask(scheme, query_pos, key_pos, window=None):
    """The one additive mask of attention where SDPA's is_causal cannot serve (a score bias, a KV cache,
    a method's groups), for queries at query_pos (T,) and keys at key_pos (n_key,): 0 where causal_mask lets
    query i see key j (a window, empty cache slots), -inf elsewhere, plus scheme.score_bias at those very
    positions (scheme None: no bias). -> (1, n_head or 1, T, n_key)"""
    visible = causal_mask(query_pos, key_pos, window)[None, None]
    bias = None if scheme is None else scheme.score_bias(query_pos, key_pos)
    return torch.where(visible, 0.0 if bias is None else bias, float("-inf"))


# -----------------------------------------------------------------------------
# The one place where a scheme is chosen: a fork adds its class above and its name here
POSITION_MODULES = dict(learned=LearnedPositions, sinusoidal=SinusoidalPositions, rope=RotaryPositions,
                        alibi=ALiBiPositions, none=NoPositions,
                        t5=T5Positions, fire=FIREPositions)  # fmt: skip
POS_SCHEMES = tuple(POSITION_MODULES)
