"""
Validation loss at every position: how well a checkpoint predicts the text inside and past its trained length.

sample.py --compare and eval_length.py both measure with these functions; a scheme with a position table
(learned) is scored past its table the way it generates there, through a sliding window of its last max_len
tokens. Everything here is a full forward pass (no KV cache) of a model in eval mode, under torch.no_grad.

    losses = token_losses(model, x, y)                       # (B, L): cross-entropy of every token
    val = validation_tokens("shakespeare_char")             # the val split, read through np.memmap
    per_window = window_losses(model, val, 256, window_starts(len(val), 256, 32), batch_size=8, device="cpu")
    window_bytes(model.config, 8, 256)                       # {what: bytes} that batch allocates, for check_memory
"""

import numpy as np
import torch
import torch.nn.functional as F

from data.common import check_split, dataset_dir, ensure_prepared, load_meta
from plumbing.memory import forward_bytes, position_table_bytes
from plumbing.errors import UserError
from plumbing.hardware import check_memory
from positions import position_limit


@torch.no_grad()
def token_losses(model, x, y, chunk=64):
    """Cross-entropy of every token of x (B, L) predicting y, as generation sees it: the whole context, or for
    a scheme with a position table (learned) past its length, the window of its last max_len tokens, each
    position scored by a forward pass of the max_len tokens that end at it (chunk windows per pass). -> (B,
    L)"""
    L, limit = x.size(1), model.max_len
    if limit is None or L <= limit:
        logits = model(x)[0]
    else:
        head = model(x[:, :limit])[0]
        windows = x.unfold(1, limit, 1)[:, 1:].reshape(-1, limit)  # windows ending at positions limit .. L-1
        tails = torch.cat([model(w)[0][:, -1] for w in windows.split(chunk)]).view(x.size(0), L - limit, -1)
        logits = torch.cat([head, tails], dim=1)
    return F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none")


def position_losses(model, x, y, chunk=64):
    """token_losses averaged over the batch: the loss at each position. -> (L,)"""
    return token_losses(model, x, y, chunk).mean(0)


def window_bytes(config, batch, length):
    """{what: bytes} that token_losses allocates for `batch` windows of `length` tokens of a model of config,
    estimated from the shapes before anything is allocated: a forward pass (generation.forward_bytes; the
    logits batch x length x vocab_size are usually the largest), the log-softmax the cross-entropy takes of
    them, the position table grown to `length`, and for a scheme with a table (learned) past it, its sliding
    windows' tokens."""
    parts = forward_bytes(config, batch, length) | {"position table": position_table_bytes(config, length)}
    parts["log-softmax"] = parts["logits"]
    limit = position_limit(config.pos, config.block_size)
    if limit is not None and length > limit:
        parts["sliding windows"] = batch * (length - limit) * limit * 8
    return parts


# -----------------------------------------------------------------------------
# The validation split, in windows


def validation_tokens(dataset, prepare=True):
    """The val split of a dataset (data/<dataset>/val.bin) as a read-only np.memmap; an embedded dataset is
    prepared on first use unless prepare=False. A UserError (with the command that prepares it) when it is
    missing or disagrees with its meta.json."""
    data_dir = ensure_prepared(dataset) if prepare else dataset_dir(dataset)
    meta = load_meta(data_dir)
    check_split(data_dir, "val", meta)  # its size and ids against meta.json: a one-line UserError
    return np.memmap(data_dir / "val.bin", dtype=meta["dtype"], mode="r")


def window_starts(n_tokens, length, max_windows=None):
    """Starts of non-overlapping windows of `length` tokens (each with its next-token target, so length + 1
    tokens read) in a split of n_tokens: all that fit, or max_windows of them spread evenly over the split
    (the same text every run: no sampling). A UserError when not even one fits."""
    fit = (n_tokens - 1) // length
    if fit < 1:
        raise UserError(f"a window of {length} tokens does not fit in the {n_tokens}-token validation split")
    n = fit if max_windows is None else min(fit, max_windows)
    slots = np.unique(np.linspace(0, fit - 1, n).round().astype(np.int64))  # n distinct slots as n <= fit
    return slots * length


def window_losses(model, tokens, length, starts, batch_size, device, on_batch=None):
    """token_losses of every window tokens[s : s + length] (targets shifted by one), batch_size windows per
    forward pass; on_batch(n) is called after each batch of n windows (a progress bar). -> (len(starts),
    length)"""
    out = []
    for i in range(0, len(starts), batch_size):
        batch = np.stack([tokens[s : s + length + 1] for s in starts[i : i + batch_size]]).astype(np.int64)
        xy = torch.from_numpy(batch).to(device)
        out.append(token_losses(model, xy[:, :-1], xy[:, 1:]).cpu())
        if on_batch:
            on_batch(len(batch))
    return torch.cat(out)


@torch.no_grad()
def inside_vs_beyond_loss(model, dataset, device, length, n_windows=8):
    """Mean validation loss at positions < block_size and >= block_size over n_windows windows of `length`
    tokens of `dataset` (the one the model was trained on). -> (inside, beyond), or None if there is none
    (GPT-2's checkpoints name none) or it is not prepared here. A UserError (one line) if those windows would
    not fit in the memory available."""
    if dataset is None:
        return None
    try:
        val = validation_tokens(dataset, prepare=False)
    except UserError:
        return None
    length = min(length, len(val) - 1)
    what = f"measuring the validation loss over {n_windows} windows of {length:,} tokens"
    check_memory(window_bytes(model.config, n_windows, length), device, what, "lower --max_new_tokens")
    starts = np.linspace(0, len(val) - length - 1, n_windows).astype(np.int64)
    losses = window_losses(model, val, length, starts, n_windows, device).mean(0)
    block_size = model.config.block_size
    return losses[:block_size].mean().item(), losses[block_size:].mean().item()
