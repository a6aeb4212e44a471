"""OpenAI's GPT-2 (Radford et al. 2019) in this repository's model, through the optional transformers: its
weights converted to a GPT with pos="learned" (from_pretrained, from_hf_gpt2), or to a checkpoint's parts
(gpt2_weights_from_hf: sample.py --init_from=gpt2, plumbing.checkpoint.pretrained_checkpoint)."""

import torch

from model import GPT, GPTConfig

# OpenAI's released GPT-2 models: 124M, 355M, 774M and 1.5B parameters
GPT2_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def from_pretrained(name):
    """OpenAI's GPT-2, one of GPT2_MODELS, through transformers (downloaded once) as a GPT in eval mode:
    pos="learned", bias=True, vocab 50257, block_size 1024, dropout 0."""
    return from_hf_gpt2(download_gpt2(name))


def from_hf_gpt2(hf_model):
    """The GPT with the weights of a transformers GPT2LMHeadModel already loaded (works offline), in eval
    mode."""
    config, state_dict = gpt2_weights_from_hf(hf_model)
    model = GPT(config)
    model.load_state_dict(state_dict)
    return model.eval()


def download_gpt2(name):
    """transformers' GPT2LMHeadModel of one of GPT2_MODELS: downloaded once, then read from its cache."""
    if name not in GPT2_MODELS:
        raise ValueError(f"{name!r} is not an OpenAI GPT-2 model; choose one of {', '.join(GPT2_MODELS)}")
    try:
        from transformers import GPT2LMHeadModel
    except ImportError:
        needs = "OpenAI's GPT-2 weights (plumbing.gpt2, sample.py --init_from) need transformers"
        raise ImportError(f"{needs}: pip install transformers") from None
    try:
        return GPT2LMHeadModel.from_pretrained(name)
    except OSError as error:
        where = "from the Hugging Face Hub (no internet, and not in the local cache)"
        raise RuntimeError(f"could not load {name!r} {where}: {str(error).splitlines()[0]}") from error


def gpt2_weights_from_hf(hf_model):
    """(GPTConfig, state dict) of a transformers GPT2LMHeadModel, without building a GPT. The names are
    GPT-2's on both sides; HF's Conv1D stores (in, out) where nn.Linear has (out, in), so those four are
    transposed (views)."""
    c = hf_model.config
    got = (c.activation_function, c.layer_norm_epsilon, c.n_inner)
    if got[:2] != ("gelu_new", 1e-5) or c.n_inner not in (None, 4 * c.n_embd):
        expected = "activation_function='gelu_new' (tanh GELU), layer_norm_epsilon=1e-5, n_inner=None"
        got = f"got {got[0]!r}, {got[1]}, {got[2]}"
        raise ValueError(f"only GPT-2's own architecture converts: {expected}; {got}")
    shape = dict(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head)
    config = GPTConfig(**shape, n_embd=c.n_embd, dropout=0.0, bias=True, pos="learned")
    with torch.device("meta"):  # names and shapes only: nothing allocated, nothing initialised
        expected = GPT(config).state_dict()
    hf_state = hf_model.state_dict()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state_dict = {}
    for name, tensor in expected.items():  # lm_head.weight is wte.weight (tied) on both sides
        source = hf_state[name].t() if name.endswith(conv1d) else hf_state[name]
        if source.shape != tensor.shape:
            raise ValueError(f"{name}: {tuple(source.shape)} in transformers, {tuple(tensor.shape)} here")
        state_dict[name] = source
    return config, state_dict
