"""
Memory, estimated from the shapes before anything is allocated, so that a request that cannot fit is refused
in one line (sample.py, eval_length.py, measure/) instead of being killed without a word: the tensors that
stay allocated and the largest transient of a step; not the activations inside a block, nor a table's
float64 copy while it is built.
"""

import torch

from model import GPT


def kv_cache_bytes(config, batch, n_slots, dtype=torch.float32):
    """Bytes of the KV caches of a model of config (a GPTConfig) with n_slots slots for `batch` rows: keys and
    values, 2 x n_layer x batch x n_head x n_slots x head_dim elements of dtype."""
    return 2 * config.n_layer * batch * config.n_head * n_slots * config.head_dim * dtype.itemsize


def position_table_bytes(config, n_pos):
    """Bytes of the float32 table a model of config, fresh (its table covers block_size), grows to cover n_pos
    positions (wpe.reserve): n_embd per position for sinusoidal, rotary_dim for RoPE (cos and sin, half of
    it each), at least twice the rows it had, as reserve grows it; 0 for the schemes without one and within
    block_size."""
    per_position = {"sinusoidal": config.n_embd, "rope": config.rotary_dim}.get(config.pos, 0)
    if n_pos <= config.block_size:
        return 0
    return max(n_pos, 2 * config.block_size) * per_position * torch.float32.itemsize


def forward_bytes(config, batch, length, cached=False):
    """{what: bytes} of the largest tensors one float32 forward pass over `length` tokens (attending to as
    many keys) makes: the logits, batch x length x vocab_size; the MLP's hidden layer before and after
    GELU, 2 x batch x length x 4 n_embd; and the mask GPT.attention_mask builds where it builds one (ALiBi,
    or several tokens into a KV cache): length x length int64 distances, a bool mask and float32 scores
    biases, n_head of them for ALiBi."""
    parts = {
        "logits": batch * length * config.vocab_size * 4,
        "activations": 2 * batch * length * 4 * config.n_embd * 4,
    }
    if config.pos == "alibi" or (cached and length > 1):
        heads = config.n_head if config.pos == "alibi" else 1
        parts["attention mask"] = length * length * (8 + 1 + 2 * heads * 4)
    return parts


def generation_bytes(config, batch, n_prompt, max_new_tokens, max_context=None, cached=True):
    """{what: bytes} that generate_cached (cached=False: GPT.generate, the reference) allocates beyond the
    weights to append max_new_tokens to `batch` prompts of n_prompt tokens: the KV cache, the position
    table grown to the last position, the int64 token buffer and the largest forward pass (forward_bytes),
    cropped as the sampler crops (learned past its table, max_context). sample.py checks it against the
    available memory before generating."""
    total = n_prompt + max_new_tokens
    learned = config.block_size if config.pos == "learned" else None
    if not cached:  # each token reruns the whole context, which torch.cat copies into a longer one
        crop = min([n for n in (learned, max_context) if n is not None], default=None)
        longest = total - 1 if crop is None else min(crop, total - 1)
        return {
            "tokens": 2 * batch * total * 8,
            "position table": position_table_bytes(config, longest),
            **forward_bytes(config, batch, longest),
        }
    crop = None if learned is None else min(learned, max_context or learned)  # as generate_cached crops
    n_pos = min(n_prompt, crop or n_prompt) + max_new_tokens - 1
    n_pos = n_pos if crop is None else min(n_pos, crop)
    window = max_context if crop is None else None
    longest = n_prompt if crop is None else min(crop, total - 1)  # the prefill, or learned's sliding window
    return {
        "KV cache": kv_cache_bytes(config, batch, GPT.cache_size(n_pos, window, window)),
        "position table": position_table_bytes(config, n_pos),
        "tokens": batch * total * 8,
        **forward_bytes(config, batch, longest, cached=True),
    }
