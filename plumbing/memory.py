"""Memory, estimated from the shapes before anything is allocated, so that a request that cannot fit is
refused in one line instead of being killed without a word or left allocating for hours: the tensors that stay
allocated and the largest transient of a step. The tests hold them against what the code allocates."""

import torch

from generation import cache_plan, captured_on
from model import GPT, window_length
from plumbing.hardware import check_memory
from positions import POSITION_MODULES

SAMPLER_BYTES = 4096  # one training batch stream (data.common.BatchSampler: its torch.Generator, meta, paths)
# what to lower for each part of training_bytes, named as train.py's and lab.perf.bench's flags
TRAINING_ADVICE = {
    "weights": "--n_layer or --n_embd", "activations": "--batch_size, --block_size or --n_layer",
    "position table": "--block_size", "batch streams": "--grad_accum"}  # fmt: skip


def scheme_shapes(config):
    """The scheme GPTConfig config names, built on the meta device: its answers and shapes (length_limit,
    parameters, table_bytes) for the estimates made before any model exists, no memory allocated."""
    with torch.device("meta"):
        return POSITION_MODULES[config.pos](config)


def parameter_count(config):
    """GPT(config)'s parameters: the tied token embedding, the position scheme's own (learned's table), per
    layer q, k, v and the output (4 C^2), the MLP (8 C^2) and two LayerNorms, the final LayerNorm; bias=True:
    a bias beside each weight."""
    C, bias = config.n_embd, config.bias
    per_layer = 12 * C * C + 2 * C + bias * (9 * C + 2 * C)
    scheme = sum(p.numel() for p in scheme_shapes(config).parameters())
    return config.vocab_size * C + scheme + config.n_layer * per_layer + C + bias * C


def activation_bytes(config, batch):
    """What a float32 training forward over batch x T tokens keeps for backward, per token: about 20 C a layer
    (LayerNorms' ins and outs, q, k, v and their rotated copies, attention's output, the MLP's 4 C before and
    after GELU, residuals), twice the logits (and log-softmax); with dropout, 2 C of masks and 2 n_head T of
    math attention's weights a layer; and what the scheme's score bias computes, once for the batch."""
    T, C, L = config.block_size, config.n_embd, config.n_layer
    per_token = L * 20 * C + 2 * config.vocab_size + 2 * C
    if config.dropout > 0:
        per_token += L * (2 * C + 2 * config.n_head * T)
    return batch * T * per_token * 4 + scheme_shapes(config).bias_bytes(T, T)


def training_bytes(config, batch, micro_steps, per_stream=SAMPLER_BYTES):
    """{what: bytes} training allocates in float32 (an upper bound under bf16 autocast): weights, gradients,
    AdamW's two moments, the position table, one micro-batch's activations (its backward frees them)."""
    weights, table = parameter_count(config) * 4, scheme_shapes(config).table_bytes(config.block_size)
    parts = {"weights": weights, "gradients": weights, "AdamW state": 2 * weights, "position table": table}
    return parts | {"activations": activation_bytes(config, batch), "batch streams": micro_steps * per_stream}


def check_training_memory(config, batch, micro_steps, device, copies=1, per_stream=SAMPLER_BYTES):
    """Refuse, before any model is built, training `copies` models at once beyond device's memory."""
    parts = training_bytes(config, batch, micro_steps, per_stream)
    parts = {what: copies * size for what, size in parts.items()}
    advice = TRAINING_ADVICE.get(max(parts, key=parts.get), TRAINING_ADVICE["weights"])
    times, millions = f"{copies} x " if copies > 1 else "", parameter_count(config) / 1e6
    what = f"training {times}{millions:,.1f}M parameters in batches of {batch} x {config.block_size} tokens"
    check_memory(parts, device, what, f"lower {advice}")


def kv_cache_bytes(config, batch, n_slots):
    """Keys and values of n_slots slots for `batch` rows, in float32."""
    return 2 * config.n_layer * batch * config.n_head * n_slots * config.head_dim * 4


def position_table_bytes(config, n_pos):
    """The table a fresh model grows to for n_pos positions (wpe.grow: at least doubles; none within T)."""
    grown = max(n_pos, 2 * config.block_size)
    return 0 if n_pos <= config.block_size else scheme_shapes(config).table_bytes(grown)


def forward_bytes(config, batch, length, cached=False, n_keys=None):
    """{what: bytes} of the largest tensors of one float32 forward over `length` tokens (attending to n_keys
    keys, by default as many): the logits, the MLP's hidden layer before and after GELU, and the mask
    GPT.attention_mask builds for a score bias or several tokens into a KV cache (length x n_keys int64
    distances, a bool mask and float32 score biases, n_head of them for a biased scheme)."""
    tokens, scheme = batch * length, scheme_shapes(config)
    parts = {"logits": tokens * config.vocab_size * 4, "activations": 2 * tokens * 4 * config.n_embd * 4}
    if scheme.biased or (cached and length > 1):
        heads = config.n_head if scheme.biased else 1
        parts["attention mask"] = length * (n_keys or length) * (8 + 1 + 2 * heads * 4)
        parts["attention mask"] += scheme.bias_bytes(length, n_keys or length)
    return parts


def generation_bytes(config, batch, n_prompt, max_new_tokens, max_context=None, cached=True, static=False):
    """{what: bytes} generate_cached (cached=False: GPT.generate, the reference) allocates beyond the weights
    to append max_new_tokens to `batch` prompts of n_prompt tokens: the KV cache, the position table grown to
    the last position, the int64 tokens and the largest forward pass: a prefill chunk against the keys cached
    by its end (static: every slot, as a CUDA graph's step), or learned's window rerun once its table is
    full; cropped as the sampler crops (generation.cache_plan)."""
    total = n_prompt + max_new_tokens
    limit = scheme_shapes(config).length_limit
    if not cached:  # each token reruns the whole context, which torch.cat copies into a longer one
        longest = min(total - 1, window_length(limit, max_context) or total)
        parts = {"tokens": 2 * batch * total * 8, "position table": position_table_bytes(config, longest)}
        return parts | forward_bytes(config, batch, longest)
    crop, n_run, n_pos, window, chunk = cache_plan(
        limit, config.block_size, n_prompt, max_new_tokens, max_context
    )
    slots = GPT.cache_size(n_pos, window, chunk)
    n_keys = slots if static else min(n_run, slots)  # a static step attends to every slot, written or not
    passes = [forward_bytes(config, batch, min(chunk, n_run), cached=True, n_keys=n_keys)]
    if crop is not None and total - 1 > crop:  # learned's full table: each token reruns its window
        passes.append(forward_bytes(config, batch, crop))
    cache, table = kv_cache_bytes(config, batch, slots), position_table_bytes(config, n_pos)
    parts = {"KV cache": cache, "position table": table, "tokens": batch * total * 8}
    return parts | max(passes, key=lambda forward: sum(forward.values()))


def check_generation_memory(config, batch, n_prompt, max_new_tokens, device, advice, max_context=None,
                            cached=True, weights=False, model_advice=None):  # fmt: skip
    """Refuse generation beyond device's memory (weights=True: a model not yet built, whose float32 weights
    and the position table its scheme builds at block_size count too: RoPE's at a block_size of 10**9 would
    be tens of GB before any step; a table grown later is built beside it). model_advice: the advice where
    the model itself is the most of it, which no generation setting makes fit (a checkpoint's)."""
    static = captured_on(device)  # generate_cached's default there: the static, captured step
    parts = generation_bytes(config, batch, n_prompt, max_new_tokens, max_context, cached, static)
    if weights:
        parts["weights"] = parameter_count(config) * 4
        parts["position table at block_size"] = scheme_shapes(config).table_bytes(config.block_size)
        if model_advice and max(parts, key=parts.get) in ("weights", "position table at block_size"):
            advice = model_advice
    check_memory(parts, device, f"generating {max_new_tokens:,} tokens in a batch of {batch}", advice)
