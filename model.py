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
  3. Attention, MLP, Block: GPT-2's pre-LayerNorm transformer.
  4. GPT: embeddings, the stack, the tied output head, one documented init.
  5. Generation: the simple reference sampler (recomputes the whole context per token), and the
     KV-cached one, which must produce the same tokens (tests/test_generation.py).

With pos="learned" this is exactly GPT-2 (same parameter names and shapes).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

POS_SCHEMES = ("learned", "sinusoidal", "rope", "alibi", "none")
ROPE_SCALINGS = ("linear", "ntk", "dynamic", "yarn")


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
    rope_factor: float = 1.0  # the extension factor s: target context / block_size

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
    "yarn"           YaRN (Peng et al. 2023, eq. 17-21): NTK-by-parts, theta_i' = (1 - g) theta_i / s + g theta_i
                     with g a linear ramp in r_i = T / lambda_i (rotations over the original length) from 0 at
                     beta_slow = 1 to 1 at beta_fast = 32, plus the attention temperature 0.1 ln(s) + 1
                     applied to cos and sin (so to q.k twice, as sqrt(1/t) on each side).
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
        beta_fast, beta_slow = 32.0, 1.0
        theta = plain(base)
        rotations = original_len * theta / (2 * math.pi)  # r_i = T / lambda_i
        ramp = ((rotations - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)  # gamma(r_i)
        inv_freq = (1 - ramp) * theta / s + ramp * theta
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
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
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
    key_pos = torch.arange(n_key, device=slopes.device)
    distance = (query_pos[:, None] - key_pos[None, :]).to(slopes.dtype)  # i - j
    return -slopes[:, None, None] * distance[None]


def causal_mask(n_query, n_key, window=None, device=None):
    """Additive mask: 0 where query i may see key j, -inf elsewhere. -> (n_query, n_key)

    Queries are the last n_query of the n_key positions. Visible: j <= i (causal) and, with a window,
    i - j < window (sliding-window attention: each token sees itself and the window - 1 before it).
    """
    query_pos = torch.arange(n_key - n_query, n_key, device=device)
    key_pos = torch.arange(n_key, device=device)
    distance = query_pos[:, None] - key_pos[None, :]  # i - j
    hidden = distance < 0
    if window is not None:
        hidden = hidden | (distance >= window)
    return torch.zeros(n_query, n_key, device=device).masked_fill(hidden, float("-inf"))


# -----------------------------------------------------------------------------
# Position encodings: the modules. Each has the same three hooks, which GPT calls once per forward
# (start is the absolute position of the first token: 0, or how many tokens a KV cache already holds):
#   embed(tok_emb, start)                    -> what enters the first block (additive schemes add here)
#   max_len                                  -> the longest sequence it can encode (None: unbounded)
#   attention_inputs(start, n_query, n_key)  -> (RoPE's (cos, sin) or None, a score bias or None), for all layers


class NoPositions(nn.Module):
    """NoPE: no position signal. Attention is then permutation equivariant; only the causal mask
    reveals order (Haviv et al. 2022; Kazemnejad et al. 2023)."""

    max_len = None

    def __init__(self, config):
        super().__init__()

    def embed(self, tok_emb, start=0):
        return tok_emb

    def attention_inputs(self, start, n_query, n_key):
        return None, None


class LearnedPositions(nn.Embedding):
    """GPT-2: a trained vector per position 0..block_size-1, added to the token embedding.
    Nothing was trained past block_size, so longer inputs are refused."""

    def __init__(self, config):
        super().__init__(config.block_size, config.n_embd)
        self.max_len = config.block_size

    def embed(self, tok_emb, start=0):
        end = start + tok_emb.size(1)
        if end > self.max_len:
            raise ValueError(
                f"sequence length {end} exceeds block_size={self.max_len}: pos=learned has no embedding past "
                f"position {self.max_len - 1}; sinusoidal, rope, alibi and none run longer"
            )
        return tok_emb + self.weight[start:end]

    def attention_inputs(self, start, n_query, n_key):
        return None, None


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

    def embed(self, tok_emb, start=0):
        end = start + tok_emb.size(1)
        if end > self.table.size(0):  # past the cached length: only when generating beyond block_size
            self.table = sinusoidal_embedding(2 * end, self.table.size(1)).to(self.table.device)
        return tok_emb * self.token_scale + self.table[start:end].to(tok_emb.dtype)


class RotaryPositions(NoPositions):
    """RoPE: rotate queries and keys so that q_m . k_n depends only on m - n. No additive embedding.
    cos/sin are float32, cached for block_size positions and extended on demand. With a context
    extension (config.rope_scaling) the frequencies are rescaled against the trained block_size."""

    def __init__(self, config):
        super().__init__(config)
        self.head_dim, self.base = config.head_dim, config.rope_base
        self.scaling, self.factor, self.original_len = config.rope_scaling, config.rope_factor, config.block_size
        self._cache(config.block_size)

    def _cos_sin(self, n_pos, seq_len, device=None):
        inv_freq, scale = rope_frequencies(
            self.head_dim, self.base, self.scaling, self.factor, self.original_len, seq_len
        )
        return rope_cos_sin(torch.arange(n_pos, device=device), inv_freq.to(device), scale)

    def _cache(self, n_pos, device=None):
        cos, sin = self._cos_sin(n_pos, seq_len=self.original_len, device=device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def attention_inputs(self, start, n_query, n_key):
        end = start + n_query
        if self.scaling == "dynamic" and end > self.original_len:
            # dynamic NTK: the frequencies follow the current length, so they are recomputed as it grows
            cos, sin = self._cos_sin(end, seq_len=end, device=self.cos.device)
        else:
            if end > self.cos.size(0):  # past the cached length: only when generating beyond block_size
                self._cache(2 * end, device=self.cos.device)
            cos, sin = self.cos, self.sin
        return (cos[start:end], sin[start:end]), None


class ALiBiPositions(NoPositions):
    """ALiBi: no embedding; each head h adds -m_h * (i - j) to the score of query i on key j,
    a recency bias that needs no table and so extends to any length."""

    def __init__(self, config):
        super().__init__(config)
        self.register_buffer("slopes", alibi_slopes(config.n_head), persistent=False)

    def attention_inputs(self, start, n_query, n_key):
        return None, alibi_bias(self.slopes, n_query, n_key)  # (n_head, n_query, n_key)


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

    def forward(self, x, rope=None, score_bias=None, causal=True, cache=None):
        """x: (B, T, C). rope: (cos, sin) to rotate q and k. score_bias: an additive (..., T, n_key) mask that
        already holds the causal -inf; None means plain causal attention. cache: a KVCache to append this
        step's keys and values to and attend over. causal=False drops the mask (for the lessons only)."""
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        if rope is not None:  # RoPE acts here, on queries and keys, before the scores
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:  # keys are cached already rotated: a key's position never changes
            k, v = cache.update(self.layer_idx, k, v)
        dropout_p = self.dropout if self.training else 0.0
        if score_bias is not None:
            # SDPA adds a float attn_mask to the scores; it must match q's dtype under autocast
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=score_bias.to(q.dtype), dropout_p=dropout_p)
        else:  # flash attention on CUDA
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=causal)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble the heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU is the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm residual block (GPT-2): x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, score_bias=None, cache=None):
        x = x + self.attn(self.ln_1(x), rope, score_bias, cache=cache)
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

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids -> logits (B, T, vocab_size), and the mean cross-entropy if targets are given.
        With a KVCache, idx continues the tokens already cached: positions start at cache.seen."""
        T = idx.size(1)
        start = 0 if cache is None else cache.seen
        n_key = T if cache is None else cache.n_cached + T
        pos = self.transformer.wpe
        x = self.transformer.drop(pos.embed(self.transformer.wte(idx), start))
        rope, bias = pos.attention_inputs(start, T, n_key)
        score_bias = None  # None: plain causal attention, SDPA's is_causal (the flash kernel on CUDA)
        if cache is not None or bias is not None:
            score_bias = causal_mask(T, n_key, None if cache is None else cache.window, idx.device)
            if bias is not None:
                score_bias = score_bias + bias  # (n_head, T, n_key)
        for block in self.transformer.h:
            x = block(x, rope, score_bias, cache)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1), ignore_index=-1)
        return logits, loss

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
                        on_token=None):
        """The same samples as generate(), in O(context) per token instead of O(context^2): the prompt is
        run once (prefill), then each new token attends to the cached keys and values (decode).

        Positions keep counting past block_size. A scheme with a position table (learned) cannot: once the
        table is full the window of its last max_len tokens slides, positions restart inside it, and each
        new token needs the whole window recomputed (as generate() does). For the other schemes max_context is a
        sliding attention window over absolute positions (each token sees the max_context latest).
        on_token(next_ids (B, 1)) is called as each token is produced, for streaming.
        """
        crop = None if self.max_len is None else min(self.max_len, max_context or self.max_len)
        cache = KVCache(self.config.n_layer, window=max_context if crop is None else None)
        logits, _ = self(idx if crop is None else idx[:, -crop:], cache=cache)  # prefill
        for step in range(max_new_tokens):
            idx_next = sample_next(logits[:, -1, :], temperature, top_k, top_p)
            idx = torch.cat((idx, idx_next), dim=1)
            if on_token is not None:
                on_token(idx_next)
            if step == max_new_tokens - 1:
                break
            if crop is not None and idx.size(1) > crop:
                # the table is full: the window slides and every position in it changes, nothing to reuse
                logits, _ = self(idx[:, -crop:])
            else:
                logits, _ = self(idx_next, cache=cache)  # decode: one token against the cache
        return idx


class KVCache:
    """Each layer's keys and values of the tokens seen so far, so that decoding a token attends to them
    instead of recomputing the prefix. Keys are stored after RoPE, at their absolute positions.

    window: keep only the latest `window` tokens (sliding-window attention); positions keep counting.
    """

    def __init__(self, n_layer, window=None):
        self.window = window
        self.seen = 0  # tokens run through the model so far = the position of the next token
        self.layers = [None] * n_layer  # per layer: (k, v), each (B, n_head, n_cached, head_dim)

    @property
    def n_cached(self):
        return 0 if self.layers[0] is None else self.layers[0][0].size(2)

    def update(self, layer_idx, k, v):
        """Append this step's (B, nh, T, hs) keys and values; return all the keys and values to attend to."""
        if self.layers[layer_idx] is not None:
            cached_k, cached_v = self.layers[layer_idx]
            k, v = torch.cat([cached_k, k], dim=2), torch.cat([cached_v, v], dim=2)
        keep = k.size(2) if self.window is None else min(k.size(2), self.window - 1)  # room for the next token
        self.layers[layer_idx] = (k[:, :, k.size(2) - keep :], v[:, :, v.size(2) - keep :])
        return k, v

    def advance(self, n_tokens):
        self.seen += n_tokens


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
