"""Validation loss per position, inside and past the trained length (lab/eval_length.py, sample.py --compare):
full forward passes in eval mode; past a scheme's length_limit (learned's table), a sliding window
(model.window_length)."""

import numpy as np
import torch
import torch.nn.functional as F

from data.common import check_split, dataset_dir, ensure_prepared, load_meta
from model import window_length
from plumbing.errors import UserError


@torch.no_grad()
def token_losses(model, x, y, chunk=64):
    """Cross-entropy of every token of x (B, L) predicting y, given the whole context, or past a position
    table the window_length tokens ending at it (a forward pass per position, chunk windows per pass).
    -> (B, L)"""
    L, limit = x.size(1), window_length(model.length_limit)
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


def validation_tokens(dataset, prepare=True):
    """data/<dataset>/val.bin as a read-only np.memmap (an embedded dataset prepared on first use unless
    prepare=False); a one-line UserError when it is missing or disagrees with its meta.json."""
    data_dir = ensure_prepared(dataset) if prepare else dataset_dir(dataset)
    meta = load_meta(data_dir)
    check_split(data_dir, "val", meta)
    return np.memmap(data_dir / "val.bin", dtype=meta["dtype"], mode="r")


def window_starts(n_tokens, length, max_windows=None, split="validation"):
    """Starts of non-overlapping windows of `length` tokens (and the next-token target) in a split of
    n_tokens: all that fit, or max_windows spread evenly (the same every run). A UserError if none fits."""
    fit = (n_tokens - 1) // length
    if fit < 1:
        raise UserError(f"a window of {length} tokens does not fit in the {n_tokens}-token {split} split")
    n = fit if max_windows is None else min(fit, max_windows)
    return np.unique(np.linspace(0, fit - 1, n).round().astype(np.int64)) * length  # n distinct as n <= fit


def window_losses(model, tokens, length, starts, batch_size, device, on_batch=None):
    """token_losses of every window tokens[s : s + length] (targets shifted by one), batch_size per forward
    pass; on_batch(n) after each batch of n windows. -> (len(starts), length)"""
    out = []
    for i in range(0, len(starts), batch_size):
        batch = np.stack([tokens[s : s + length + 1] for s in starts[i : i + batch_size]]).astype(np.int64)
        xy = torch.from_numpy(batch).to(device)
        out.append(token_losses(model, xy[:, :-1], xy[:, 1:]).cpu())
        if on_batch:
            on_batch(len(batch))
    return torch.cat(out)


def unmeasurable(dataset):
    """Why a model trained on `dataset` has no validation loss to measure here (GPT-2's weights name no
    dataset; one not prepared), or None when it has."""
    if dataset is None:
        return "its checkpoint names no dataset (GPT-2's weights)"
    try:
        validation_tokens(dataset, prepare=False)
    except UserError as e:
        return str(e)
    return None


@torch.no_grad()
def inside_vs_beyond_loss(model, dataset, device, length, n_windows=8):
    """Mean val loss at positions < block_size and >= it over n_windows windows of `length` tokens. ->
    (inside, beyond), or None where unmeasurable(dataset) says why."""
    if dataset is None:
        return None
    try:
        val = validation_tokens(dataset, prepare=False)
    except UserError:
        return None
    length = min(length, len(val) - 1)
    starts = np.linspace(0, len(val) - length - 1, n_windows).astype(np.int64)
    losses = window_losses(model, val, length, starts, n_windows, device).mean(0)
    T = model.config.block_size
    return losses[:T].mean().item(), losses[T:].mean().item()
