"""
A GPT-2 whose position scheme is one switch, GPTConfig.pos; nanoGPT's parts in nanoGPT's order. Position
enters in three places, each a call into positions.py: the embedding (GPT.forward: wpe.embed), queries and
keys (CausalSelfAttention.forward: apply_rope) and the scores (GPT.attention_mask: positions.attention_mask
adds wpe.score_bias). With pos="learned" this is GPT-2. generation.py drives cached decoding (each attention
layer owns its cache).
"""

import math
from dataclasses import asdict, dataclass, fields, is_dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from positions import (
    POSITION_MODULES,
    PositionScheme,
    apply_rope,
    attention_mask,
    check_fields,
    overrides,
    require,
    setting,
)


def scheme_settings():
    """Every scheme's settings, read from POSITION_MODULES now: {setting name: (scheme name, its field)}."""
    return {f.name: (name, f) for name, scheme in POSITION_MODULES.items() for f in fields(scheme.Settings)}


@dataclass
class GPTConfig:
    """The GPT's fields, its position scheme `pos` and that scheme's settings, pos_settings: an instance of
    its Settings (a dict of them, as asdict writes it, is built into one; None: the defaults). A checkpoint's
    model_config is asdict(config): the settings nested under pos_settings."""

    block_size: int = setting(1024, at_least=1)  # training context length T; only `learned` runs no further
    vocab_size: int = setting(50304, at_least=1)  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = setting(12, at_least=1)  # transformer blocks
    n_head: int = setting(12, at_least=1)  # attention heads per block
    n_embd: int = setting(768, at_least=1)  # width of the residual stream
    dropout: float = setting(0.0, at_least=0, below=1)  # dropout probability in training
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2; False is a bit faster
    pos: str = setting("rope", choices=lambda: POSITION_MODULES)  # the position scheme
    pos_settings: PositionScheme.Settings | dict | None = None  # the scheme's Settings (flags: each by name)

    def __post_init__(self):
        check_fields(self)
        divisible = f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}"
        require(not self.n_embd % self.n_head, divisible)
        scheme, given = POSITION_MODULES[self.pos], self.pos_settings
        if isinstance(given, dict) or given is None:  # asdict's dict of them, or None: the defaults
            foreign = [str(name) for name in given or {} if name not in scheme.Settings.__dataclass_fields__]
            require(not foreign, f"{', '.join(foreign)}: no setting of pos={self.pos}")
            self.pos_settings = scheme.Settings(**(given or {}))
        kind = type(self.pos_settings).__qualname__
        require(type(self.pos_settings) is scheme.Settings, f"pos_settings is a {kind}, not pos={self.pos}'s")
        scheme.check_config(self)

    @classmethod
    def from_flat(cls, given=(), **values):
        """A GPTConfig from flat values: its fields, and the settings of its scheme by name. A setting of
        another scheme is refused in one line if named in `given` (what flags gave) or not at its default
        (older checkpoints held every RoPE setting whatever the scheme)."""
        pos, settings = values.get("pos", cls.pos), values.pop("pos_settings", None) or {}
        settings = asdict(settings) if is_dataclass(settings) else dict(settings)
        require(pos in POSITION_MODULES, f"pos={pos!r} is not one of {', '.join(POSITION_MODULES)}")
        for name, (scheme, f) in scheme_settings().items():
            if name in values:
                value = values.pop(name)
                foreign = f"{name}={value!r} is a setting of pos={scheme}; this model has pos={pos}"
                require(scheme == pos or (value == f.default and name not in given), foreign)
                settings |= {name: value} if scheme == pos else {}
        return cls(**values, pos_settings=settings)

    def flat(self):
        """The GPT's fields and the scheme's settings side by side, as from_flat takes them (and flags)."""
        gpt = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "pos_settings"}
        return gpt | asdict(self.pos_settings)

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


def cached_key_positions(end, size):
    """The position each of a KV cache's `size` slots holds once positions 0 .. end - 1 are written, p in slot
    p % size (a ring, with a sliding window): the latest p < end with p = j (mod size), -1 while slot j is
    empty. end: a (1,) long tensor, so that a compiled decode step computes it too. -> (size,)
    Worked: end = 11, size = 4 -> (8, 9, 10, 7); end = 6, size = 8 -> (0, 1, 2, 3, 4, 5, -1, -1)."""
    slot = torch.arange(size, device=end.device)
    latest = end - 1 - (end - 1 - slot) % size
    return latest.where(latest >= 0, -1)


class KVCache(nn.Module):
    """One attention layer's keys (after RoPE: a key's position never changes) and values, allocated once and
    written in place, as gpt-fast's: position p in slot p % size, a ring with a sliding window."""

    def __init__(self, batch, n_head, size, head_dim, dtype, device, ring=False):
        super().__init__()
        shape = (batch, n_head, size, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.ring = ring  # False: a slot for every position, so position p is slot p

    def update(self, input_pos, k, v, n_keys):
        """Write the (B, nh, T, hs) keys and values at positions input_pos (T,). -> the first n_keys slots'"""
        slots = input_pos % self.k.size(2) if self.ring else input_pos
        self.k.index_copy_(2, slots, k)
        self.v.index_copy_(2, slots, v)
        return self.k[:, :, :n_keys], self.v[:, :, :n_keys]


def causal_attention(q, k, v, mask=None, dropout_p=0.0):
    """Softmax attention of q over k and v, (B, nh, T, hs) each: causal where mask is None (flash attention
    on CUDA), else under the additive mask GPT.attention_mask built (SDPA adds it to the scores, in q's dtype
    under autocast). Every layer's `attend` unless a training method replaces it (lab/finetune)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=dropout_p)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.kv_cache = None  # a KVCache while generating (GPT.setup_cache)
        self.attend = (
            causal_attention  # (q, k, v, mask, dropout_p) -> y; replaceable: a training method's own
        )

    def forward(self, x, rope=None, mask=None, input_pos=None):
        """x: (B, T, C); rope: (cos, sin) to rotate q and k, or None; mask: None (causal) or the additive mask
        GPT.attention_mask built; input_pos: the positions of x when decoding against self.kv_cache."""
        B, T, C = x.size()
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, -1).permute(2, 0, 3, 1, 4)  # (3, B, nh, T, hs)
        if rope is not None:  # RoPE acts here, on queries and keys (rotated in one call), before the scores
            qk, v = qkv.split([2, 1])  # split's backward: one concatenation (slicing's: zeros, then copies)
            q, k, v = *apply_rope(qk, *rope).unbind(0), v.squeeze(0)
        else:
            q, k, v = qkv.unbind(0)
        if input_pos is not None:  # attend to the keys cached so far, this step's included, as the mask says
            k, v = self.kv_cache.update(input_pos, k, v, mask.size(-1))
        y = self.attend(q, k, v, mask, self.dropout if self.training else 0.0)  # (B, nh, T, hs)
        y = self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))  # re-assemble the heads side by side
        return self.resid_dropout(y) if self.training else y  # eval: no call to the identity, per token


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

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, rope=None, mask=None, input_pos=None):
        x = x + self.attn(self.ln_1(x), rope, mask, input_pos)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                # the position scheme (a positions.PositionScheme) lives under GPT-2's name
                wpe=POSITION_MODULES[config.pos](config),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying (Press & Wolf 2017), as GPT-2: the output head reuses the token embedding
        self.transformer.wte.weight = self.lm_head.weight
        # whether each block takes the rotation (RoPE's nope layers do not)
        self.rope_layers = self.transformer.wpe.rope_layers or (True,) * config.n_layer
        self.cache_window = None  # the sliding window of the KV caches, if any (setup_cache)
        self.static_cache = False  # attend to every slot of the KV caches, written or not (setup_cache)
        self.init_weights()

    def init_weights(self):
        """GPT-2's: Linear and Embedding weights ~ N(0, 0.02), biases 0, LayerNorm 1/0; the 2 n_layer
        projections adding into the residual stream (attn.c_proj, mlp.c_proj) 0.02 / sqrt(2 n_layer):
        variance flat in depth. apply visits a module's children before it: a position scheme's own
        init_weights runs after its Linear and Embedding children got N(0, 0.02), the start it sets stands."""

        def init(module):
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.LayerNorm):
                module.reset_parameters()
            if isinstance(module, PositionScheme):
                module.init_weights()  # its own parameters (learned's table: N(0, 0.02) as well)

        self.apply(init)
        for block in self.transformer.h:
            for proj in (block.attn.c_proj, block.mlp.c_proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    @property
    def length_limit(self):  # the longest input the position scheme encodes (learned: block_size), or None
        return self.transformer.wpe.length_limit

    def num_params(self):  # the tied embedding counted once
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, input_pos=None, seq_len=None):
        """idx: (B, T) token ids -> logits (B, T, vocab_size), and the mean cross-entropy if targets are
        given. input_pos: None for positions 0 .. T-1; or, decoding against the KV caches (setup_cache),
        the (T,) positions of idx, consecutive and continuing those already cached. seq_len: the length of the
        sequence they belong to where it is longer (a prefill's chunk), for the scheme (LongRoPE)."""
        T, pos = idx.size(1), self.transformer.wpe
        if input_pos is None:
            pos.grow(T)  # tables grow here, outside any step; learned refuses past its table, in one line
        positions = torch.arange(T, device=idx.device) if input_pos is None else input_pos
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        x = self.transformer.drop(pos.embed(tok_emb, positions))  # position enters: the embedding
        rope = pos.rotation(positions, seq_len)  # position enters: RoPE's (cos, sin) for q and k, or None
        mask = self.attention_mask(positions, cached=input_pos is not None)  # position enters: the scores
        for block, rotates in zip(self.transformer.h, self.rope_layers):
            x = block(x, rope if rotates else None, mask, input_pos)  # a layer in nope_layers gets no RoPE
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.reshape(-1), ignore_index=-1)

    def attention_mask(self, query_pos, cached=False):
        """Every layer's mask, built once per forward: None where SDPA's is_causal says it all (no score bias,
        no cache), else positions.attention_mask over the keys attended to: with KV caches the slots written
        so far, or with a static cache every slot, so that no shape depends on the position and the step can
        be captured (-1: an empty slot, masked; the mask is computed on the device from query_pos). The
        layers' `attend` reads it: a training method that replaces theirs may replace this on the instance
        too, with the mask its attention needs (lab/finetune)."""
        pos = self.transformer.wpe
        if not cached:
            return attention_mask(pos, query_pos, query_pos) if overrides(pos, "score_bias") else None
        key_pos = cached_key_positions(query_pos[-1:] + 1, self.transformer.h[0].attn.kv_cache.k.size(2))
        if not self.static_cache:  # eager: only the slots written so far (reads the position: a host sync)
            key_pos = key_pos[: int(query_pos[-1]) + 1]
        return attention_mask(pos, query_pos, key_pos, self.cache_window)

    def setup_cache(self, batch, n_pos, window=None, chunk=1, dtype=None, static=False):
        """Give every attention layer a KV cache for positions 0 .. n_pos - 1, fed at most `chunk` tokens a
        call; with a sliding window (each token sees the `window` latest) a ring of window + chunk - 1 slots,
        so that a chunk never overwrites a key its own queries see. The position tables grow here, once.
        static: every step attends to every slot (masked), so that a decode step has the same shapes and
        reads no position on the host: a CUDA graph or a compiled step serves every position."""
        self.transformer.wpe.grow(n_pos)  # or refuses n_pos in one line (learned, past its table)
        size = self.cache_size(n_pos, window, chunk)
        dtype = dtype or self.lm_head.weight.dtype
        c, device = self.config, self.lm_head.weight.device
        for block in self.transformer.h:
            block.attn.kv_cache = KVCache(batch, c.n_head, size, c.head_dim, dtype, device, size < n_pos)
        self.cache_window, self.static_cache = window, static

    @staticmethod
    def cache_size(n_pos, window=None, chunk=1):  # slots per layer of setup_cache's KV caches
        return n_pos if window is None else min(n_pos, window + chunk - 1)

    def flops_per_token(self, batch_size=1):
        """Training FLOPs per token at batch_size sequences of block_size a forward (PaLM appendix B, as
        nanoGPT's estimate_mfu): 6N for the weights N (the position scheme's parameters, looked up, left out)
        plus 12 L H Q T for attention's q k^T and p v, plus what the scheme computes itself
        (wpe.flops_per_token). -> (FLOPs, note): the note None, or says that the scheme's own compute is not
        counted (its flops_per_token is None: unknown)."""
        c, pos = self.config, self.transformer.wpe
        n = self.num_params() - sum(p.numel() for p in pos.parameters())
        attention = 12 * c.n_layer * c.n_head * c.head_dim * c.block_size
        own = pos.flops_per_token(c.block_size, batch_size)
        note = None if own is not None else f"FLOPs of pos={c.pos}'s own compute not counted (unknown)"
        return round(6 * n + attention + (own or 0)), note

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

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None):
        """The reference sampler: append max_new_tokens to idx (B, T), rerunning the whole context for each.
        Learned sees the last block_size tokens; max_context crops further, positions restarting at 0. Logits
        that are not finite raise NonFiniteLogits (checked on the device, read once at the end)."""
        crop = window_length(self.length_limit, max_context)
        finite = torch.ones((), dtype=torch.bool, device=idx.device)  # every logit so far; no sync a token
        for _ in range(max_new_tokens):
            context = idx if crop is None else idx[:, -crop:]
            logits = self(context)[0][:, -1, :]
            finite &= torch.isfinite(logits).all()  # argmax would turn NaN into tokens without a word
            idx_next = sample_next(logits, temperature, top_k, top_p)
            idx = torch.cat((idx, idx_next), dim=1)
        if not finite:
            raise NonFiniteLogits("while generating")
        return idx

    def cast_weights(self, dtype):
        """The parameters in dtype ("bfloat16": half the bytes a decoded token reads; the KV caches follow,
        setup_cache), the position tables (buffers) kept as built, in float32, as transformers keeps RoPE's
        inv_freq: a far position's angle needs float32's digits."""
        for p in self.parameters():
            p.data = p.data.to(getattr(torch, dtype))
        return self


def window_length(limit, max_context=None):
    """How many of a sequence's latest tokens a forward pass runs on: past a scheme's length_limit (learned's
    table) the window of its last `limit`, positions from 0, narrowed by max_context if given; None: all."""
    return min((n for n in (limit, max_context) if n is not None), default=None)


class NonFiniteLogits(ValueError):
    """Logits that are NaN or inf `where`: the weights, not the user's settings (one line, exit status 1)."""

    status = 1  # plumbing.errors.one_line_errors exits with it: a damaged model, not a bad flag

    def __init__(self, where):
        super().__init__(
            f"the model's logits are not finite (NaN or inf) {where}: weights that overflow, a diverged or "
            "damaged checkpoint; use another checkpoint"
        )


def check_finite_logits(logits, where="on this prompt"):
    """Raise NonFiniteLogits unless every logit is finite: weights that overflow (finite, but huge) give inf
    or NaN, which argmax and the sampler would turn into tokens without a word. One host sync: generate_cached
    calls it once, on the prefill's logits; later tokens are checked on the device, read once at the end."""
    if not torch.isfinite(logits).all():
        raise NonFiniteLogits(where)


def sample_next(logits, temperature=1.0, top_k=None, top_p=None):
    """One token per row of the last position's logits (B, V) -> (B, 1), on the device, with no host sync
    (gpt-fast's multinomial_sample_one_no_sync). temperature=0: the most likely; top_k: among the k most
    likely; top_p: nucleus sampling (Holtzman et al. 2020), the smallest set reaching top_p."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float()  # a bfloat16 model's logits: the softmax and the draw in float32
    # from the largest logit down, so that a tiny temperature (1e-45: every quotient +-inf or 0/0) is greedy
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    logits = torch.where(shifted == 0, 0.0, shifted / temperature)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]  # a slice: no index tensor
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        # the top token always stays
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
    return draw(F.softmax(logits, dim=-1))


def draw(probs):
    """A token per row of probs (B, V) -> (B, 1), drawn as torch.multinomial would but with no host sync
    (multinomial waits for the GPU): argmax_i p_i / q_i with q_i ~ Exp(1) picks i with probability p_i (the
    exponential race; gpt-fast's multinomial_sample_one_no_sync), the noise from torch's generator, so a seed
    fixes the draw. q is kept above 0, where p_i / q_i would be 0/0 for a token of probability 0."""
    noise = torch.empty_like(probs).exponential_(1).clamp_min_(torch.finfo(probs.dtype).tiny)
    return (probs / noise).argmax(dim=-1, keepdim=True)
