"""Kernels a cached decode step launches, counted on any machine: on a GPU at batch 1 a step's time is its
launches (a few microseconds each, more than their arithmetic), so this count, not a CPU's tokens/s, is what
decides eager decoding's speed there (docs/perf.md); lab.perf.bench's generation table shows it per scheme.
Every aten operator that reaches the dispatcher in one static decode step (generation.CUDAGraphStep's, run
eagerly) is counted, views left out (they launch nothing); a cast to the dtype a tensor already has never
reaches it.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from generation import cached_forward, prefill
from model import GPT

# nanoGPT's shakespeare_char recipe (configs/shakespeare_char.toml): the shape the op targets are set at
RECIPE_SHAPE = dict(block_size=256, vocab_size=65, n_layer=6, n_head=6, n_embd=384, dropout=0.0, bias=False)
# aliases of their input that the schema does not mark as views (a Linear's reshaped output): no kernel
UNMARKED_VIEWS = {"aten._unsafe_view.default"}


class LaunchCounter(TorchDispatchMode):
    """Counts the operators dispatched inside it that do work (not func.is_view nor UNMARKED_VIEWS: an alias
    of its input launches no kernel); names: each counted operator, in order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and str(func) not in UNMARKED_VIEWS:
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def decode_step_ops(config, n_prompt=8):
    """The operators one static decode step of a GPT(config) dispatches, after a prefill of n_prompt tokens
    (fewer where block_size is shorter), on the CPU in float32. -> [operator name, ...]"""
    torch.manual_seed(0)
    model = GPT(config).eval()
    n_prompt = min(n_prompt, config.block_size - 1)
    with torch.no_grad():
        model.setup_cache(1, n_prompt + 1, chunk=max(1, n_prompt), static=True)
        if n_prompt:
            prefill(model, torch.zeros(1, n_prompt, dtype=torch.long), n_prompt)
        idx, position = torch.zeros(1, 1, dtype=torch.long), torch.tensor([n_prompt])
        with LaunchCounter() as counter:
            cached_forward(model, idx, position)
    return counter.names
