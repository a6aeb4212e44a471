"""
Cached generation: model.py's GPT decoding one token at a time against the keys and values it has already
computed, in O(context) per token where GPT.generate, the reference, pays O(context^2). As gpt-fast's
generate.py and nanochat's engine.py: a preallocated KV cache written in place, an eager decode loop, and a
decode step that torch.compile turns into one graph (a CUDA graph on CUDA).

    KVCache(n_layer, window, max_len)          what GPT.forward(idx, cache=...) reads and writes
    generate_cached(model, idx, max_new_tokens, ...)    the same samples as model.generate, faster
    decode_step(model, idx, position, cache)    one token at a fixed shape; compile_decode_step compiles it

tests/test_generation.py checks that cached and uncached logits agree to 1e-5 for every scheme.
"""

import contextlib

import torch

from model import sample_next


class KVCache:
    """Each layer's keys (after RoPE) and values of the tokens seen so far. The buffers are allocated once and
    written in place, and every slot remembers the absolute position of the key it holds (`positions`, -1 while
    empty): the causal mask, a sliding window and ALiBi's distances all come from comparing a query's position
    with that buffer. The cache plans each step (begin) and keeps the slots it hands out, so attention only
    calls update(layer, k, v).

    window: each token sees only the `window` latest (sliding-window attention); positions keep counting, and
            the buffer is a ring of `window` slots: position p lives in slot p % window.
    max_len: positions to hold, allocated at the first step; None: what each step needs, doubled when full.
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
        self.slots = None  # where this step's keys and values go
        self.n_read = None  # this step attends to slots [0, n_read) ...
        self.n_old = None  # ... or, when not None, to the n_old old keys plus this step's new ones (see begin)
        self.needs_mask = True  # False: every key this step attends to is visible to its one query

    def begin(self, query_pos):
        """Plan a step of T new tokens at query_pos = seen .. seen + T - 1. -> the key positions to attend to.
        Slots fill from 0 in order, so those in use are always [0, min(seen, size))."""
        T, end = query_pos.numel(), self.seen + query_pos.numel()
        needed = end if self.window is None else min(end, self.window)
        if self.size is None or needed > self.size:  # room for every key a query of this step may see
            size = max(needed, 2 * (self.size or 0))
            self._resize(size if self.window is None else min(size, self.window), query_pos.device)
        elif self.positions is None:
            self._resize(self.size, query_pos.device)
        self.slots = query_pos % self.size
        if self.window is not None and T > 1:
            # several tokens into a ring: writing first would overwrite keys the earlier ones still see, so
            # they attend to the old keys plus all the new ones, and only the latest `size` are kept
            self.n_old, keep = min(self.seen, self.size), min(T, self.size)
            key_pos = torch.cat([self.positions[: self.n_old], query_pos])
            self.positions.index_copy_(0, self.slots[-keep:], query_pos[-keep:])
        else:
            self.n_old, self.n_read = None, min(end, self.size)
            self.positions.index_copy_(0, self.slots, query_pos)
            key_pos = self.positions[: self.n_read]
        self.needs_mask = T > 1  # one token sees all it gets: the keys before it, within the window
        self.seen = end
        return key_pos

    def begin_static(self, position):
        """begin() for decode_step: one token at `position`, a (1,) tensor, written at slot position % size; it
        attends over every slot, so shapes never change. seen is left to the caller. -> key positions"""
        self.slots = position % self.size
        self.positions.index_copy_(0, self.slots, position)
        self.n_old, self.n_read, self.needs_mask = None, self.size, True
        return self.positions

    def update(self, layer_idx, k, v):
        """Write this step's (B, nh, T, hs) keys and values at the planned slots. -> the keys and values to attend to"""
        if self.k[layer_idx] is None:
            B, n_head, _, head_dim = k.shape
            self.k[layer_idx] = k.new_zeros(B, n_head, self.size, head_dim)
            self.v[layer_idx] = v.new_zeros(B, n_head, self.size, head_dim)
        cached_k, cached_v = self.k[layer_idx], self.v[layer_idx]
        if self.n_old is not None:  # several tokens into a ring (see begin)
            k_all = torch.cat([cached_k[:, :, : self.n_old], k], dim=2)
            v_all = torch.cat([cached_v[:, :, : self.n_old], v], dim=2)
            keep = min(k.size(2), self.size)
            cached_k.index_copy_(2, self.slots[-keep:], k[:, :, -keep:])
            cached_v.index_copy_(2, self.slots[-keep:], v[:, :, -keep:])
            return k_all, v_all
        cached_k.index_copy_(2, self.slots, k)
        cached_v.index_copy_(2, self.slots, v)
        return cached_k[:, :, : self.n_read], cached_v[:, :, : self.n_read]

    @staticmethod
    def bytes_needed(config, batch, n_slots, dtype=torch.float32):
        """Bytes of the buffers a cache of n_slots slots allocates for `batch` rows of a model of config (a
        GPTConfig): keys and values, 2 x n_layer x batch x n_head x n_slots x head_dim elements of dtype, and the
        int64 position of each slot. Estimated before allocating (sample.py checks it against the free memory)."""
        elements = 2 * config.n_layer * batch * config.n_head * n_slots * config.head_dim
        return elements * dtype.itemsize + n_slots * torch.int64.itemsize

    def mark_static(self):
        """Tell torch.compile that the buffers keep their addresses from step to step, so that a CUDA graph writes
        into them in place. torch has no public name for this; transformers' StaticCache calls the same function."""
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


# -----------------------------------------------------------------------------
# Memory, estimated from the shapes before anything is allocated: a request that cannot fit is refused in one line
# instead of being killed by the kernel without a word. The tensors that stay allocated, and the largest transient
# of a step; not the activations inside a block, nor a table's float64 copy while it is built.


def position_table_bytes(config, n_pos):
    """Bytes of the float32 table a model of config, fresh (its table covers block_size), grows to cover n_pos
    positions (wpe.reserve): n_embd per position for sinusoidal, rotary_dim for RoPE (cos and sin, half of it each),
    at least twice the rows it had, as reserve grows it; 0 for the schemes without one and within block_size."""
    per_position = {"sinusoidal": config.n_embd, "rope": config.rotary_dim}.get(config.pos, 0)
    if n_pos <= config.block_size:
        return 0
    return max(n_pos, 2 * config.block_size) * per_position * torch.float32.itemsize


def forward_bytes(config, batch, length, cached=False):
    """{what: bytes} of the largest tensors one float32 forward pass over `length` tokens (attending to as many
    keys) makes: the logits, batch x length x vocab_size; the MLP's hidden layer before and after GELU, 2 x batch x
    length x 4 n_embd; and the mask GPT.attention_mask builds where it builds one (ALiBi, or several tokens into a
    KV cache): length x length int64 distances, a bool mask and float32 scores biases, n_head of them for ALiBi."""
    parts = {"logits": batch * length * config.vocab_size * 4,
             "activations": 2 * batch * length * 4 * config.n_embd * 4}
    if config.pos == "alibi" or (cached and length > 1):
        heads = config.n_head if config.pos == "alibi" else 1
        parts["attention mask"] = length * length * (8 + 1 + 2 * heads * 4)
    return parts


def generation_bytes(config, batch, n_prompt, max_new_tokens, max_context=None, cached=True):
    """{what: bytes} that generate_cached (cached=False: GPT.generate, the reference) allocates beyond the weights to
    append max_new_tokens to `batch` prompts of n_prompt tokens: the KV cache, the position table grown to the last
    position, the int64 token buffer and the largest forward pass (forward_bytes), cropped as the sampler crops
    (learned past its table, max_context). sample.py checks it against the available memory before generating."""
    total = n_prompt + max_new_tokens
    learned = config.block_size if config.pos == "learned" else None
    if not cached:  # each token reruns the whole context, which torch.cat copies into a longer one
        crop = min([n for n in (learned, max_context) if n is not None], default=None)
        longest = total - 1 if crop is None else min(crop, total - 1)
        return {"tokens": 2 * batch * total * 8, "position table": position_table_bytes(config, longest),
                **forward_bytes(config, batch, longest)}
    crop = None if learned is None else min(learned, max_context or learned)  # as generate_cached crops
    n_pos = min(n_prompt, crop or n_prompt) + max_new_tokens - 1
    n_pos = n_pos if crop is None else min(n_pos, crop)
    window = max_context if crop is None else None
    longest = n_prompt if crop is None else min(crop, total - 1)  # the prefill, or learned's sliding window
    return {"KV cache": KVCache.bytes_needed(config, batch, min(n_pos, window or n_pos)),
            "position table": position_table_bytes(config, n_pos), "tokens": batch * total * 8,
            **forward_bytes(config, batch, longest, cached=True)}


@torch.no_grad()
def generate_cached(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
                    on_token=None, compile=False, backend=None):
    """model.generate's samples in O(context) per token: the prompt idx (B, T) runs once (prefill), then each new
    token attends to the cached keys and values (decode). on_token(next_ids (B, 1)) is called per token.

    Positions keep counting past block_size, except with a position table (learned): once it is full the window
    of its last max_len tokens slides, positions restart inside it, and each token reruns the window (as generate
    does). Two settings differ from generate by design (README.md): max_context is a sliding attention window
    over absolute positions here (each token sees the max_context latest; with several layers information still
    flows from further back), where generate reruns the last max_context tokens from position 0; and with dynamic
    NTK a key stays rotated for the length at which it was cached (as transformers does).

    compile=True runs every decode step through compile_decode_step (backend: torch.compile's, e.g. "eager");
    the first call pays for the compilation.
    """
    B, n_prompt = idx.shape
    crop = None if model.max_len is None else min(model.max_len, max_context or model.max_len)
    prompt = idx if crop is None else idx[:, -crop:]
    n_pos = prompt.size(1) + max_new_tokens - 1  # positions that get a key: the last token is never run
    n_pos = n_pos if crop is None else min(n_pos, crop)
    model.transformer.wpe.reserve(n_pos)  # every table sized once, before any step
    cache = KVCache(model.config.n_layer, window=max_context if crop is None else None, max_len=n_pos)
    out = torch.empty(B, n_prompt + max_new_tokens, dtype=idx.dtype, device=idx.device)
    out[:, :n_prompt] = idx
    # Eager steps run under inference_mode, which skips autograd's view and version bookkeeping (docs/perf.md);
    # `out` and the tables were made before it, so they stay ordinary tensors. A compiled step stays under no_grad:
    # compiling inside inference_mode has open CUDA-graph bugs (pytorch/pytorch#135892).
    with contextlib.nullcontext() if compile else torch.inference_mode():
        logits = model(prompt, cache=cache)[0][:, -1]  # prefill
        if compile:
            step = compile_decode_step(model, backend)
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
                logits = model(out[:, t + 1 - crop : t + 1])[0][:, -1]
            elif compile:
                logits = step(idx_next, position, cache)
                cache.seen += 1  # Python state stays out of the compiled graph: the position advances here
                position += 1
            else:
                logits = model(idx_next, cache=cache)[0][:, -1]  # decode: one token against the cache
    return out


def decode_step(model, idx, position, cache):
    """One token per row, idx (B, 1), at the absolute position in `position`, a (1,) long tensor, against a cache
    allocated for every position it will see. Shapes never change: every slot is attended to (empty and
    out-of-window ones masked) and the position is a tensor, so one compiled graph serves every step. The tables
    must already cover the position (wpe.reserve). -> logits (B, vocab_size)"""
    key_pos = cache.begin_static(position)
    return model.run(idx, position, key_pos, cache)[:, -1]


def compile_decode_step(model, backend=None):
    """decode_step through torch.compile with static shapes, in one graph: on CUDA as a CUDA graph
    (mode="reduce-overhead": one launch per token, not one per kernel). backend: torch.compile's (default
    inductor, which needs a C++ compiler on a CPU; "eager" traces without generating code). Each new cache size
    compiles again."""
    if model.config.rope_scaling == "dynamic":
        raise ValueError("rope_scaling='dynamic' recomputes the frequencies from the length at every step, "
                         "which a static decode step cannot do: generate with compile=False")

    def step(idx, position, cache):
        return decode_step(model, idx, position, cache)

    if backend is not None:
        return torch.compile(step, backend=backend, fullgraph=True, dynamic=False)
    mode = "reduce-overhead" if model.lm_head.weight.is_cuda else None
    return torch.compile(step, mode=mode, fullgraph=True, dynamic=False)
