"""
Cached generation: model.py's GPT decoding one token at a time against the keys and values it has already
computed, O(context) per token where GPT.generate, the reference, pays O(context^2). As gpt-fast's generate:
each attention layer owns a preallocated KV cache (GPT.setup_cache), the prompt runs once (prefill), then one
decode loop feeds each new token at its position, eagerly or through torch.compile (a CUDA graph on CUDA).
tests/test_generation.py checks that cached and uncached logits agree to 1e-5 for every scheme.
"""

import contextlib

import torch

from model import sample_next
from positions import require, window_length


@torch.no_grad()
def generate_cached(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
                    on_token=None, compile=False, backend=None):  # fmt: skip
    """model.generate's samples in O(context) per token: the prompt idx (B, T) runs once (prefill, in chunks),
    then each new token attends to the cached keys and values (decode); on_token(next_ids (B, 1)) per token.
    Positions count on past block_size; past a scheme's length_limit (learned's table) the window of its last
    length_limit tokens slides once it is full, each token rerunning it from position 0 (as generate does). By
    design (README.md) max_context is a sliding window over absolute positions here, where generate reruns the
    last max_context tokens from position 0; and with dynamic NTK a key stays rotated for the length at which
    it was cached (as transformers). A scheme that encodes every position anew past a length (LongRoPE's long
    factors: recode_past) reruns the tokens so far when the sequence passes it, its cached keys rotated anew
    (as transformers, PR #33129). compile: each decode step through torch.compile (backend: its backend)."""
    B, n_prompt = idx.shape
    limit, recode_past = model.length_limit, model.transformer.wpe.recode_past
    crop = None if limit is None else window_length(limit, max_context)
    prompt = idx if crop is None else idx[:, -crop:]
    n_pos = prompt.size(1) + max_new_tokens - 1  # positions that get a key: the last token is never run
    n_pos = n_pos if crop is None else min(n_pos, crop)
    window = max_context if crop is None else None
    chunk = prefill_chunk(model.config.block_size, window)
    model.setup_cache(B, n_pos, window, chunk)
    out = torch.empty(B, n_prompt + max_new_tokens, dtype=idx.dtype, device=idx.device)
    out[:, :n_prompt] = idx
    step = compile_cached_forward(model, backend) if compile else cached_forward
    # Eager steps under inference_mode, a compiled one under no_grad (CUDA-graph bugs: pytorch#135892)
    with contextlib.nullcontext() if compile else torch.inference_mode():
        logits = prefill(model, prompt, chunk)
        position = torch.tensor([prompt.size(1)], device=idx.device)
        for t in range(n_prompt, n_prompt + max_new_tokens):
            idx_next = sample_next(logits, temperature, top_k, top_p)
            out[:, t : t + 1] = idx_next
            if on_token is not None:
                on_token(idx_next)
            if t == n_prompt + max_new_tokens - 1:
                break
            if crop is not None and t + 1 > crop:
                # the window is full: it slides, every position in it changes: no cache, from 0
                logits = model(out[:, t + 1 - crop : t + 1])[0][:, -1]
            elif t == recode_past:  # the sequence passes it: every position encoded anew, from the start
                logits = prefill(model, out[:, : t + 1], chunk)
                position = position + 1
            else:
                logits = step(model, idx_next, position)  # decode: one token against the cache
                position = position + 1
    return out


def prefill_chunk(block_size, window=None):
    """The prompt's tokens per prefill call: with a window its length, so that a chunk fits the ring of
    window + chunk - 1 slots; else block_size, so that a long prompt's attention mask is block_size x the
    keys so far, never n_prompt x n_prompt (plumbing/memory.py estimates it)."""
    return window or block_size


def prefill(model, tokens, chunk):
    """Tokens (B, T) at positions 0 .. T - 1 through the KV caches, chunk per call, each chunk told the
    sequence's length T. -> the last logits"""
    for start in range(0, tokens.size(1), chunk):
        positions = torch.arange(start, min(start + chunk, tokens.size(1)), device=tokens.device)
        logits = cached_forward(model, tokens[:, positions], positions, tokens.size(1))
    return logits


def cached_forward(model, idx, input_pos, seq_len=None):
    """Tokens idx (B, T) at positions input_pos (T,) through the model's KV caches, a prefill's chunk or one
    decode step (seq_len: the sequence's length, by default input_pos[-1] + 1). -> the last logits (B, V)"""
    return model(idx, input_pos=input_pos, seq_len=seq_len)[0][:, -1]


def compile_cached_forward(model, backend=None):
    """cached_forward through torch.compile with static shapes, in one graph: every slot of the cache is
    attended to (empty and out-of-window ones masked) and the position is a tensor, so one graph serves
    every decode step; on CUDA a CUDA graph (mode="reduce-overhead": one launch per token, not per kernel)."""
    dynamic = "rope_scaling='dynamic' recomputes the frequencies from the length at every step, which a"
    dynamic += " static decode step cannot do: generate with compile=False"
    require(model.config.rope_scaling != "dynamic", dynamic)
    mode = "reduce-overhead" if model.lm_head.weight.is_cuda and backend is None else None
    backend = backend or "inductor"
    return torch.compile(cached_forward, backend=backend, mode=mode, fullgraph=True, dynamic=False)
