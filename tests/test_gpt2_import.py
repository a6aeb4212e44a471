"""OpenAI's GPT-2 through Hugging Face transformers: a converted model computes transformers' own logits.

As minGPT's tests/test_huggingface_import.py, but offline: a small GPT2LMHeadModel with random weights stands
in for the released ones (plumbing.gpt2.from_pretrained downloads those, then runs the same conversion,
from_hf_gpt2).
"""

import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
from conftest import ROOT

from generation import generate_cached
from plumbing.checkpoint import build_model
from plumbing.gpt2 import from_hf_gpt2, from_pretrained, gpt2_weights_from_hf

REASON = "the GPT-2 import needs Hugging Face transformers: pip install transformers"


def tiny_hf_gpt2(seed=0):
    """GPT-2's architecture at toy size (tanh GELU = HF's "gelu_new", layer-norm eps 1e-5 = nn.LayerNorm's),
    every weight, bias and gain perturbed so that each one matters to the comparison."""
    transformers = pytest.importorskip("transformers", reason=REASON)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=16,
        vocab_size=50,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    hf_model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in hf_model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return hf_model


def test_converted_gpt2_gives_transformers_logits():
    """Same logits as GPT2LMHeadModel to 1e-5, in eval mode, over all 16 positions of a batch of two."""
    hf_model = tiny_hf_gpt2()
    model = from_hf_gpt2(hf_model)
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf_model(idx).logits
        logits, _ = model(idx)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_gpt2_weights_convert_as_views_and_build_one_model_through_the_checkpoint_path():
    """sample.py --init_from=gpt2 builds one GPT: the conversion returns views of transformers' tensors
    (nothing copied, no GPT built) as a checkpoint's parts, and the checkpoint path builds from them a model
    that computes transformers' logits."""
    hf_model = tiny_hf_gpt2()
    config, state_dict = gpt2_weights_from_hf(hf_model)
    hf_state = hf_model.state_dict()
    assert all(
        t.untyped_storage().data_ptr() == hf_state[name].untyped_storage().data_ptr()
        for name, t in state_dict.items()
    )
    model = build_model("gpt2", {"model": state_dict, "model_config": asdict(config)}).eval()
    idx = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf_model(idx).logits, rtol=0, atol=1e-5)


def test_converted_gpt2_is_learned_gpt2_with_the_same_parameters():
    """pos=learned, biases on, GPT-2's vocabulary and context; the same number of parameters (the tied
    embedding counted once on both sides)."""
    hf_model = tiny_hf_gpt2()
    model = from_hf_gpt2(hf_model)
    c = model.config
    assert (c.pos, c.bias, c.vocab_size, c.block_size) == ("learned", True, 50, 16)
    assert (c.n_layer, c.n_head, c.n_embd, c.dropout) == (2, 2, 32, 0.0)
    assert model.num_params() == hf_model.num_parameters()


def test_converted_gpt2_decodes_with_the_cache_like_transformers_greedy_search():
    """Greedy tokens from the KV cache equal transformers' generate(do_sample=False)
    up to the 16 positions."""
    hf_model = tiny_hf_gpt2()
    model = from_hf_gpt2(hf_model)
    prompt = torch.randint(0, 50, (1, 4), generator=torch.Generator().manual_seed(2))
    expected = hf_model.generate(
        prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt)
    )
    assert torch.equal(generate_cached(model, prompt, 12, temperature=0), expected)


def test_position_past_n_positions_is_a_clear_error():
    """GPT-2 has no position 16 when n_positions = 16:
    a ValueError that names block_size, not an index error."""
    model = from_hf_gpt2(tiny_hf_gpt2())
    with pytest.raises(ValueError, match="exceeds block_size=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_only_openai_model_names_are_accepted():
    """A name that is not one of the four released models is refused before any download."""
    with pytest.raises(ValueError, match="gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        from_pretrained("gpt3")


def test_from_pretrained_without_the_hub_says_why(tmp_path):
    """Offline and with an empty cache, from_pretrained raises a RuntimeError whose one-line message says why
    (in a fresh process: transformers reads HF_HUB_OFFLINE when it is imported)."""
    pytest.importorskip("transformers", reason=REASON)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    code = "from plumbing.gpt2 import from_pretrained; from_pretrained('gpt2')"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        "RuntimeError: could not load 'gpt2' from the Hugging Face Hub (no internet"
    ), last_line


def test_missing_transformers_names_the_pip_command(monkeypatch):
    """Without transformers installed, from_pretrained raises an ImportError with the command that fixes it.
    (None in sys.modules is how Python marks a module as not importable.)"""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match="pip install transformers"):
        from_pretrained("gpt2")
