"""Instruments for the demonstrations (python -m lab.demo.permutation, lab.demo.probe, lab.demo.figures): read
a trained model through its own modules, by forward hooks on GPT's blocks and their attention;
tests/test_demo.py checks each instrument against the model's own output."""

import importlib.util
import inspect
import math
import os
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lab.measure.losses import validation_tokens
from lab.outputs import check_outputs, figure_file, write_output
from model import CausalSelfAttention
from plumbing.checkpoint import open_model
from plumbing.errors import UserError
from positions import apply_rope, attention_mask, overrides

ROOT = Path(__file__).resolve().parents[2]


def use_one_thread():
    """One thread unless OMP_NUM_THREADS is set: more only add spin-waits to these tiny models (128 dims)."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def describe(out_dir, ckpt):
    """'out/shakespeare_char_rope (2000 steps, val loss 1.7588)'"""
    steps, loss = ckpt.get("iter_num"), ckpt.get("best_val_loss")
    trained = f"{steps} steps, val loss {loss:.4f}" if steps is not None and loss is not None else "trained"
    folder = Path(out_dir).resolve()
    return f"{folder.relative_to(ROOT) if folder.is_relative_to(ROOT) else out_dir} ({trained})"


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.backends.backend_agg  # noqa: F401 (now: an import Ctrl-C cuts fails as an ImportError)
    import matplotlib.pyplot as plt

    return plt


def figure_format(path, flag):
    """Its path's extension (png without one); a usage UserError for one matplotlib cannot write (.pt)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix, formats = Path(path).suffix[1:].lower(), FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        names = ", ".join("." + name for name in sorted(formats))
        raise UserError(f"--{flag}={path}: matplotlib writes no .{suffix} file; give one of {names}", 2)
    return suffix or "png"


def check_figure_paths(flag, paths, replace=False, inputs=()):
    """Each path writable, in a format matplotlib writes, none an input of the run (inputs: the files and the
    dataset folders it reads, --replace or not), and no file there but a figure of that format unless replace
    (the command's --replace): one line if not. -> False without matplotlib"""
    if importlib.util.find_spec("matplotlib") is None:
        return False
    for path in paths:
        earlier = {flag: figure_file(figure_format(path, flag))}
        check_outputs({flag: path}, inputs, earlier=earlier, replace=replace)
    return True


def save_figure(fig, path, flag="out", dpi=110, tight=False):
    """Written whole or not at all, to path exactly (no extension added), after fig.tight_layout() if tight;
    the same figure gives the same bytes (no software version or date in a PNG's metadata)."""
    if tight:
        fig.tight_layout()
    fmt = figure_format(path, flag)
    metadata = {"Software": None} if fmt == "png" else None
    write_output(flag, path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=fmt, metadata=metadata))
    pyplot().close(fig)
    return path


def state_table(labels, columns, width):
    """Lines of a text table: a column per label, a line per hidden state (embedding, block 1, ...)."""
    lines = [f"{'':<10}" + "".join(f"{label:>{width}}" for label in labels)]
    for i in range(max(map(len, columns))):
        cells = "".join(f"{c[i] if i < len(c) else '':>{width}}" for c in columns)
        lines.append(f"{'embedding' if i == 0 else f'block {i}':<10}{cells}")
    return lines


def load(out_dir, dtype=torch.float32):
    """(model on the CPU in eval mode and dtype, tokenizer, checkpoint dict)."""
    model, tokenizer, ckpt = open_model(out_dir)
    return model.to(dtype), tokenizer, ckpt


def validation_windows(ckpt, n_windows):
    """The first n_windows non-overlapping windows of block_size tokens of the val split. -> (n_windows, T)"""
    data, T = validation_tokens(ckpt["train_config"]["dataset"]), ckpt["model_config"]["block_size"]
    n_windows = min(n_windows, len(data) // T)
    return torch.from_numpy(data[: n_windows * T].astype(np.int64)).view(n_windows, T)


@contextmanager
def hooks(handles):
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def attention_arguments(args, kwargs):
    """CausalSelfAttention.forward's arguments by name, however the block passed them."""
    bound = inspect.signature(CausalSelfAttention.forward).bind(None, *args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def unmasked(model):
    """A with-block where each attention layer's mask is the scheme's own score bias at every (query, key)
    pair, future ones too (ALiBi's -m_h (i - j)), or zeros where it biases none: each query sees every key."""

    def drop_mask(module, args, kwargs):
        arguments = attention_arguments(args, kwargs)
        del arguments["self"]
        x = arguments["x"]
        positions = torch.arange(x.size(1), device=x.device)
        bias = model.transformer.wpe.score_bias(positions, positions)
        arguments["mask"] = torch.zeros(1, 1, x.size(1), x.size(1), device=x.device) if bias is None else bias
        return (), arguments

    return hooks(
        [block.attn.register_forward_pre_hook(drop_mask, with_kwargs=True) for block in model.transformer.h]
    )


@torch.no_grad()
def hidden_states(model, idx, mask=True):
    """The residual stream: the embedding output, then each block's. -> n_layer + 1 tensors (B, T, C)"""
    states, blocks = [], model.transformer.h
    handles = [blocks[0].register_forward_pre_hook(lambda module, args: states.append(args[0]))]
    handles += [block.register_forward_hook(lambda module, args, out: states.append(out)) for block in blocks]
    with hooks(handles), nullcontext() if mask else unmasked(model):
        model(idx)
    return states


@torch.no_grad()
def attention_inputs(model, idx, layer):
    """The arguments the attention of `layer` receives on idx (x after ln_1, rope, mask, ...), and "self"."""
    seen = {}
    grab = lambda module, args, kwargs: seen.update(attention_arguments(args, kwargs), self=module)
    with hooks([model.transformer.h[layer].attn.register_forward_pre_hook(grab, with_kwargs=True)]):
        model(idx)
    return seen


def split_heads(t, n_head):
    B, T, C = t.shape
    return t.view(B, T, n_head, C // n_head).transpose(1, 2)  # (B, nh, T, hs)


@torch.no_grad()
def attention_probabilities(model, idx, layer):
    """softmax(q k^T / sqrt(hs) + mask) of one layer (Vaswani et al. 2017, eq. 1), from its own c_attn and the
    rotation or mask its position module gave it. -> (B, n_head, T, T), zero above the diagonal"""
    inputs = attention_inputs(model, idx, layer)
    attn, x, rope, mask = inputs["self"], inputs["x"], inputs["rope"], inputs["mask"]
    q, k = (split_heads(t, attn.n_head) for t in attn.c_attn(x).split(x.size(2), dim=2)[:2])
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is None:  # plain causal attention: query i sees keys j <= i
        positions = torch.arange(x.size(1), device=x.device)
        mask = attention_mask(None, positions, positions)
    return F.softmax(scores + mask, dim=-1)  # additive: causal -inf (and the scheme's bias), or unmasked's


@torch.no_grad()
def qk_terms(model, idx, head=0):
    """Layer 0's scores q k^T of a learned-position model split into four terms (Ke et al. 2021, TUPE):
    x = e + p gives (q_e + q_p)(k_e + k_p)^T = token-token + token-position + position-token +
    position-position, before scale and mask. ln_1 is split by the statistics of the sum, exactly with
    bias=False: LN(x) = g (e - mean e) / sigma + g (p - mean p) / sigma. -> {name: (T, T)} for idx[0]"""
    wpe = model.transformer.wpe
    if not (overrides(wpe, "embed") and list(wpe.parameters())) or model.config.bias:
        raise ValueError("the four-term split needs a trained position table (pos=learned) and bias=False")
    block, T = model.transformer.h[0], idx.size(1)
    e = model.transformer.wte(idx[:1])[0]  # (T, C), and p the rows the scheme adds at positions 0 .. T-1
    p = wpe.embed(torch.zeros_like(e), torch.arange(T, device=e.device))
    ln, x = block.ln_1, e + p
    sigma = (x.var(dim=-1, unbiased=False, keepdim=True) + ln.eps).sqrt()
    hs = x.size(1) // block.attn.n_head
    w_q, w_k, _ = block.attn.c_attn.weight.split(x.size(1), dim=0)
    rows = slice(head * hs, (head + 1) * hs)
    q, k = {}, {}
    for name, part in (("token", e), ("position", p)):
        share = ln.weight * (part - part.mean(dim=-1, keepdim=True)) / sigma  # this part's share of LN(x)
        q[name], k[name] = share @ w_q[rows].T, share @ w_k[rows].T
    return {f"{a}-{b}": q[a] @ k[b].T for a in q for b in k}


# -----------------------------------------------------------------------------
# The permutation demonstration and the probe (course exercises: keep names, signatures and contracts)
def swap_permutation(pieces):
    """Token pieces [A, middle, B] -> perm, the order of B + middle + A as indices into A + middle + B
    (so (A + middle + B)[perm] = B + middle + A)."""
    a, mid, b = (len(p) for p in pieces)
    perm = list(range(a + mid, a + mid + b)) + list(range(a, a + mid)) + list(range(a))
    return torch.tensor(perm)


@torch.no_grad()
def swap_differences(model, ids, swapped_ids, perm, words, mask=True):
    """For each hidden state, max |h(swapped)[perm^-1] - h(ids)| over the positions of the swapped words and
    over the unchanged ones: 0 means the runs coincide up to the swap (equivariance). swapped_ids = ids[perm].
    -> list of (words max, unchanged max), one per hidden state"""
    assert torch.equal(swapped_ids, ids[perm]), "the swapped sentence must be a permutation of the tokens"
    inverse = torch.argsort(perm)
    rest = torch.ones(len(ids), dtype=torch.bool)
    rest[words] = False
    out = []
    states = zip(hidden_states(model, ids[None], mask), hidden_states(model, swapped_ids[None], mask))
    for h, h_swapped in states:
        gap = (h_swapped[0, inverse] - h[0]).abs().amax(dim=-1)  # (T,): row i is token i of the original
        out.append((gap[words].max().item(), gap[rest].max().item() if rest.any() else 0.0))
    return out


def probe_targets(windows, newline_id):
    """Per token: its position in the window, and its distance back to the latest newline at or before it
    (NaN when the window shows none: the model cannot know it). -> two (N, T) float64 tensors"""
    n, T = windows.shape
    position = torch.arange(T, dtype=torch.float64).expand(n, T)
    is_newline = windows == newline_id
    latest = torch.where(is_newline, position, torch.full_like(position, -1)).cummax(dim=1).values
    distance = torch.where(latest >= 0, position - latest, torch.full_like(position, float("nan")))
    return position, distance


def fit_ridge(X, y, ridge):
    """Least squares with a small ridge, on centred data (intercept unpenalised). -> (weights, intercept)"""
    mean_x, mean_y = X.mean(dim=0), y.mean()
    Xc = X - mean_x
    gram = Xc.T @ Xc
    penalty = ridge * gram.diagonal().mean() * torch.eye(X.size(1), dtype=X.dtype)
    w = torch.linalg.solve(gram + penalty, Xc.T @ (y - mean_y))
    return w, mean_y - mean_x @ w


def r_squared(y, prediction):
    """R^2 = 1 - sum (y - prediction)^2 / sum (y - mean y)^2, as a Python float: the share of y's variance
    explained. 1 is a perfect fit, 0 no better than the mean, below 0 worse (possible on held-out windows)."""
    return 1.0 - ((y - prediction) ** 2).sum().item() / ((y - y.mean()) ** 2).sum().item()


def probe_score(features, target, fit_rows, ridge=1e-3, seed=0):
    """(R^2 on held-out windows of a linear probe fit on the others, the same on shuffled targets: what a
    probe of this size finds in noise). features (N, T, C), target (N, T) (NaN: left out), fit_rows (N,)."""
    known = ~target.isnan()
    fit, test = known & fit_rows[:, None], known & ~fit_rows[:, None]
    y = target[fit]
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))]
    fits = [fit_ridge(features[fit], y_, ridge) for y_ in (y, shuffled)]
    return tuple(r_squared(target[test], features[test] @ w + b) for w, b in fits)


def probe_positions(model, windows, newline_id, mask=True, ridge=1e-3):
    """Linear probes from every hidden state, fit on the first half of the windows, scored on the second.
    -> {"position": [(R^2, shuffled R^2) per hidden state], "newline": [...]}, probe_targets' two targets"""
    states = [h.double() for h in hidden_states(model, windows, mask)]
    targets = dict(zip(("position", "newline"), probe_targets(windows, newline_id)))
    fit_rows = torch.arange(len(windows)) < len(windows) // 2
    return {name: [probe_score(h, y, fit_rows, ridge) for h in states] for name, y in targets.items()}
