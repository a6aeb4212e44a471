"""
Cached generation: model.py's GPT decoding one token at a time against the keys and values it has already
computed, O(context) per token where GPT.generate, the reference, pays O(context^2). As gpt-fast's generate:
each attention layer owns a preallocated KV cache (GPT.setup_cache), the prompt runs once (prefill), then one
decode loop feeds each new token at its position. On a GPU a decode step is a few hundred small kernels, each
launch costing more than its arithmetic, so there the step is static (the same shapes at every position, no
host sync) and captured once as a CUDA graph: each token is then one replay (CUDAGraphStep). torch.compile
fuses the same static step. tests/test_generation.py checks that every path gives the uncached logits.
"""

import contextlib
import time

import torch

from model import NonFiniteLogits, check_finite_logits, sample_next, window_length
from positions import require


@torch.no_grad()
def generate_cached(model, idx, max_new_tokens, temperature=1.0, top_k=None, top_p=None, max_context=None,
                    on_token=None, compile=False, cuda_graph=None, backend=None, timing=None):  # fmt: skip
    """model.generate's samples in O(context) per token: the prompt idx (B, T) runs once (prefill, in chunks),
    then each new token attends to the cached keys and values (decode); on_token(next_ids (B, 1)) per token.
    Positions count on past block_size; past a scheme's length_limit (learned's table) the window of its last
    length_limit tokens slides once it is full, each token rerunning it from position 0 (as generate does). By
    design (README.md) max_context is a sliding window over absolute positions here, where generate reruns the
    last max_context tokens from position 0; and with dynamic NTK a key stays rotated for the length at which
    it was cached (as transformers). A scheme that encodes every position anew past a length (LongRoPE's long
    factors: recode_past) reruns the tokens so far when the sequence passes it, its cached keys rotated anew
    (as transformers, PR #33129). compile, cuda_graph (None: on CUDA): how a decode step runs, decode_mode's
    choice; backend: torch.compile's. Sampling runs outside the step, eagerly: seeded as the eager path. No
    token waits for the host: the prefill's logits are checked finite once (model.check_finite_logits), every
    later token's on the device, read once at the end; on_token gets the token on the device. timing: a dict
    to fill with the one-off setup's seconds (the prefill and the first decode step: warm-up, capture,
    compilation) and the decode loop's seconds and tokens after it, each ended by one synchronisation."""
    B, n_prompt = idx.shape
    plan = _cache_plan(model.length_limit, model.config.block_size, n_prompt, max_new_tokens, max_context)
    crop, n_run, n_pos, window, chunk = plan
    mode = decode_mode(model, idx.device, compile, cuda_graph)
    model.setup_cache(B, n_pos, window, chunk, static=mode != "eager")
    out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)  # the prompt, then the new tokens
    step = decode_step(model, mode, backend)
    # Eager steps under inference_mode; a compiled or captured one under no_grad (pytorch#135892)
    clock = Clock(idx.device, timing)
    with torch.inference_mode() if mode == "eager" else contextlib.nullcontext():
        logits = prefill(model, idx[:, n_prompt - n_run :], chunk)  # the prompt's latest n_run tokens
        check_finite_logits(logits)  # once, after the prefill: the one host sync this adds
        finite = torch.ones((), dtype=torch.bool, device=idx.device)  # every later logit, on the device
        position = torch.tensor([n_run], device=idx.device)
        for t in range(n_prompt, n_prompt + max_new_tokens):
            idx_next = sample_next(logits, temperature, top_k, top_p)
            out[:, t : t + 1] = idx_next
            if on_token is not None:
                on_token(idx_next)
            if t == n_prompt + max_new_tokens - 1:
                break
            if t == n_prompt + 1:  # the first decode step (warm-up, capture) is behind: the loop starts
                clock.lap("setup_seconds")
            if crop is not None and t + 1 > crop:
                # the window is full: it slides, every position in it changes: no cache, from 0
                logits = model(out[:, t + 1 - crop : t + 1])[0][:, -1]
            elif t == model.transformer.wpe.recode_past:  # the sequence passes it: every position anew
                logits = prefill(model, out[:, : t + 1], chunk)  # the caches a captured step reads
            else:
                logits = step(model, idx_next, position)  # decode: one token against the cache
            finite &= torch.isfinite(logits).all()
            position = position + 1  # the next token's (unused once the window slides)
    clock.lap("decode_seconds", decode_tokens=max(0, max_new_tokens - 2))
    if not finite:  # the one read of the flag
        raise NonFiniteLogits("while generating")
    return out


class Clock:
    """generate_cached's timing (a dict, or None: no clock, no sync): lap(name) synchronises the device and
    records the seconds since the last lap under name; a lap never taken is 0."""

    def __init__(self, device, timing):
        self.device, self.timing, self.last = torch.device(device), timing, time.perf_counter()

    def lap(self, name, **extra):
        if self.timing is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timing.setdefault("setup_seconds", 0.0)
        self.timing[name] = now - self.last
        self.timing |= extra
        self.last = now


def _cache_plan(length_limit, block_size, n_prompt, max_new_tokens, max_context=None):
    """What generate_cached runs and caches for a prompt of n_prompt tokens: crop, the window a scheme with a
    length_limit slides (learned's table), or None; n_run, the prompt's latest tokens the prefill runs; n_pos,
    the positions that get a key (the last new token is never run); window, the KV caches' sliding window
    (max_context, unless crop bounds the context); chunk, the prefill's tokens a call: with a window its
    length, so that a chunk fits the ring of window + chunk - 1 slots, else block_size, so that a long
    prompt's attention mask is block_size x the keys so far, never n_prompt x n_prompt.
    -> (crop, n_run, n_pos, window, chunk)"""
    crop = None if length_limit is None else window_length(length_limit, max_context)
    n_run = n_prompt if crop is None else min(n_prompt, crop)
    n_pos = n_run + max_new_tokens - 1 if crop is None else min(n_run + max_new_tokens - 1, crop)
    window = max_context if crop is None else None
    return crop, n_run, n_pos, window, window or block_size


def decode_mode(model, device, compile=False, cuda_graph=None):
    """How generate_cached runs its decode steps: "compiled" (the static step through torch.compile; captured
    on CUDA), "cuda_graph" (the static step, captured on CUDA as one graph replayed per token, eager
    elsewhere: what the graph replays), or "eager" (only the slots written so far: the fastest on a CPU,
    whose kernels cost their arithmetic, not their launch). A scheme whose step varies with the length
    (step_varies: dynamic NTK) decodes eagerly under cuda_graph; compile refuses it."""
    varies = model.transformer.wpe.step_varies
    if compile:
        require(varies is None, f"{varies}: a static decode step cannot; generate with compile=False")
        return "compiled"
    wanted = captured_on(device) if cuda_graph is None else cuda_graph
    return "cuda_graph" if wanted and varies is None else "eager"


def captured_on(device):
    """Whether generate_cached captures its decode step by default on device: on CUDA, where each kernel's
    launch costs more than its arithmetic."""
    return torch.device(device).type == "cuda"


def decode_step(model, mode, backend=None):
    """A decode step (model, idx (B, 1), position (1,)) -> logits (B, V) for decode_mode's mode."""
    step = cached_forward
    if mode == "compiled":
        step = torch.compile(cached_forward, backend=backend or "inductor", fullgraph=True, dynamic=False)
    return CUDAGraphStep(step) if mode != "eager" and model.lm_head.weight.is_cuda else step


class CUDAGraphStep:
    """A static decode step captured once as a CUDA graph, each later token one replay: one launch per token,
    not one per kernel (PyTorch's "whole-network capture", the design of gpt-fast's decode loop). The graph
    reads the token and the position from static buffers, copied in before each replay, and leaves the logits
    in a static buffer; the KV caches it writes are the model's own, so a prefill between two replays
    (LongRoPE's re-encoding) is seen by the next. Captured at the first call, with that call's inputs, after a
    warm-up on a side stream (as torch.cuda.graphs asks: lazy initialisation, a compiled step's compilation):
    the warm-up computes that very step, writing the same keys to the same slots, so its repeats change
    nothing. step_fn: cached_forward, or a torch.compile of it (its kernels are captured the same way)."""

    warmup_steps = 3

    def __init__(self, step_fn):
        self.step_fn, self.graph, self.replays = step_fn, None, 0

    def __call__(self, model, idx, position):
        if self.graph is None:
            self.idx, self.position = idx.clone(), position.clone()
            self.capture(model)
        else:
            self.idx.copy_(idx)
            self.position.copy_(position)
        self.graph.replay()
        self.replays += 1
        return self.logits

    def capture(self, model):
        """On the model's own GPU (cuda:1 too, whatever the current device): its stream, its graph."""
        with torch.cuda.device(model.lm_head.weight.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup_steps):
                    self.step_fn(model, self.idx, self.position)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, stream=side):  # the warm-up's stream: its BLAS state made there
                self.logits = self.step_fn(model, self.idx, self.position)


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
