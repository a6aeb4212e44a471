"""Passkey retrieval (lab/eval_length.py --task=passkey): does a checkpoint find a key stated L tokens back?

    tokens, answer_start = passkey_batch(stoi, length=256, depth=0.5, trials=50, seed=0)
    correct = count_correct(model, tokens, answer_start)   # all five digits the argmax, in one forward pass
    wilson_interval(correct, 50)                           # its 95% interval

Exact match by one forward pass equals greedy decoding's (answers_by_greedy), and is what is measured: with
dynamic NTK the KV cache keeps keys rotated for shorter lengths, another model."""

import math

import numpy as np
import torch

from data.passkey.task import KEY_DIGITS, eval_sample
from generation import generate_cached
from model import window_length

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(correct, trials, z=Z_95):
    """Wilson's score interval for a binomial proportion (Wilson 1927): unlike the normal approximation it
    stays inside [0, 1] and is not empty at 0 or all correct. -> (low, high); (0, 1) for no trials."""
    if trials == 0:
        return 0.0, 1.0
    p = correct / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def passkey_batch(stoi, length, depth, trials, seed):
    """`trials` samples of length + 1 characters (the last digit a target only) with the key at `depth`, drawn
    from (seed, length, depth). -> (tokens (trials, length + 1) int64, index of the answer's first digit)"""
    rng = np.random.default_rng([seed, length, round(depth * 1000)])
    samples = [eval_sample(rng, length + 1, depth) for _ in range(trials)]
    tokens = torch.tensor([[stoi[c] for c in s.text] for s in samples], dtype=torch.int64)
    return tokens, samples[0].answer_start


@torch.no_grad()
def answers_by_forward(model, tokens, answer_start, batch_size=50):
    """The argmax at each answer digit given the true text before it, a forward pass per batch of rows; past a
    position table (learned), each digit from the window_length tokens before it, as it generates.
    -> (rows, 5)"""
    where = torch.arange(answer_start - 1, answer_start - 1 + KEY_DIGITS)  # the inputs predicting the digits
    limit, out = window_length(model.length_limit), []
    for rows in tokens[:, :-1].split(batch_size):  # the last digit is only a target
        if limit is None or rows.size(1) <= limit:
            logits = model(rows)[0][:, where]
        else:
            logits = torch.stack([model(rows[:, p + 1 - limit : p + 1])[0][:, -1] for p in where], 1)
        out.append(logits.argmax(-1))
    return torch.cat(out)


def answers_by_greedy(model, tokens, answer_start):
    """The KEY_DIGITS tokens greedy decoding (KV cache) writes after the prompt, eagerly: capturing a CUDA
    graph costs more than so few steps save. -> (rows, KEY_DIGITS)"""
    out = generate_cached(model, tokens[:, :answer_start], KEY_DIGITS, temperature=0, cuda_graph=False)
    return out[:, answer_start:]


def count_correct(model, tokens, answer_start, batch_size=50):
    """How many rows get all KEY_DIGITS digits right (exact match)."""
    guesses = answers_by_forward(model, tokens, answer_start, batch_size)
    return int((guesses == tokens[:, answer_start : answer_start + KEY_DIGITS]).all(1).sum())
