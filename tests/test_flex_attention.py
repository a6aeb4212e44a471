"""FlexAttention for ALiBi: the bias as a score_mod, the causal mask as a block mask, against the SDPA reference
with the (n_head, T, T) bias materialised.

The model picks flex on CUDA only (GPT.flex_attention_applies); here use_flex_attention=True forces it on the CPU,
where torch compiles flex_attention with inductor (C++ built on the machine) and runs its forward only: torch
has no FlexAttention backward on CPU, so these tests run without gradients.
"""

import functools

import pytest
import torch

import model as model_module
from generation import generate_cached
from model import GPT, POS_SCHEMES, GPTConfig


@functools.cache
def why_flex_cannot_run_here():
    """None where a compiled flex_attention runs on this CPU, else the reason (skips every test below)."""
    if model_module.flex_attention is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (it came in 2.5)"
    q = torch.randn(1, 1, 16, 8)
    try:
        with torch.no_grad():
            block_mask = model_module.causal_block_mask(16, "cpu")
            model_module.compiled_flex_attention(q, q, q, score_mod=lambda s, b, h, i, j: s, block_mask=block_mask)
    except Exception as error:  # no C++ compiler, an unsupported CPU, ...
        return f"flex_attention does not run on this CPU (torch {torch.__version__}): {type(error).__name__}: {error}"
    return None


def needs_flex():
    reason = why_flex_cannot_run_here()
    if reason is not None:
        pytest.skip(reason)


def tiny_alibi(seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(block_size=32, vocab_size=32, n_layer=2, n_head=4, n_embd=32, dropout=0.0, pos="alibi")
    fields.update(overrides)
    return GPT(GPTConfig(**fields)).eval()


@torch.no_grad()
def logits_with(model, idx, use_flex, run=None):
    model.use_flex_attention = use_flex
    logits, _ = (model if run is None else run)(idx)
    return logits


def test_flex_alibi_equals_the_sdpa_reference():
    """The score_mod -m_h (i - j) with a causal block mask gives the materialised bias's logits, to 1e-5, at a
    length that is no multiple of the kernel's blocks."""
    needs_flex()
    model = tiny_alibi()
    idx = torch.randint(0, 32, (2, 27), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits_with(model, idx, True), logits_with(model, idx, False), rtol=0, atol=1e-5)


def test_flex_alibi_traces_inside_a_compiled_model():
    """train.py compiles the whole model: flex_attention is then traced with it, in one graph (backend "eager"
    keeps this check fast), and still gives the reference's logits."""
    needs_flex()
    torch.compiler.reset()
    model = tiny_alibi()
    idx = torch.randint(0, 32, (2, 20), generator=torch.Generator().manual_seed(2))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    flex = logits_with(model, idx, True, run=compiled)
    torch.testing.assert_close(flex, logits_with(model, idx, False), rtol=0, atol=1e-5)


def test_flex_is_chosen_in_one_place_for_alibi_training_on_cuda_only():
    """By default flex serves ALiBi's training forward on CUDA (where torch has it), never on the CPU, never for a
    scheme without a score_mod, not while attention dropout is due (flex has none), and not in eval mode, where
    lengths vary and each would compile it again."""
    for pos in POS_SCHEMES:
        model = tiny_alibi(pos=pos).train()
        assert not model.flex_attention_applies("cpu")
        assert model.flex_attention_applies("cuda") == (pos == "alibi" and model_module.flex_attention is not None)
        assert not model.eval().flex_attention_applies("cuda")
    model = tiny_alibi(dropout=0.1).train()
    assert not model.flex_attention_applies("cuda")
    model.use_flex_attention = True
    with pytest.raises(ValueError, match="no attention dropout"):
        model.flex_attention_applies("cpu")


def test_kv_cache_keeps_the_sdpa_path():
    """Decoding with a KV cache attends from a few queries to cached keys at arbitrary slots: it keeps the bias
    built from the cache's positions, even where flex is forced for the full forward."""
    model = tiny_alibi()
    prompt = torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(3))
    model.use_flex_attention = False
    reference = model.generate(prompt, 12, temperature=0)
    model.use_flex_attention = True
    assert torch.equal(generate_cached(model, prompt, 12, temperature=0), reference)
