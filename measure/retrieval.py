"""
Passkey retrieval: does a checkpoint find a key stated L tokens back? eval_length.py --task=passkey measures it.

    tokens, answer_start = passkey_batch(stoi, length=256, depth=0.5, trials=50, seed=0)
    guesses = answers_by_forward(model, tokens, answer_start)        # (trials, 5): one pass, argmax at each digit
    guesses = answers_by_greedy(model, tokens, answer_start)         # the same by greedy decoding, KV cache
    correct = (guesses == tokens[:, answer_start:]).all(1)
    wilson_interval(int(correct.sum()), len(correct))                # its 95% interval

The two ways agree on exact match: the five digits are all the argmax given the true digits before them exactly
when greedy decoding writes the five (tests/test_retrieval.py); the forward pass is the one measured, in the same
exact full passes as eval_length's loss (with dynamic NTK the cache keeps keys rotated for shorter lengths, so
greedy decoding there is another model).
"""

import math

import numpy as np
import torch

from data.passkey.task import KEY_DIGITS, eval_sample
from generation import generate_cached

Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


def wilson_interval(correct, trials, z=Z_95):
    """Wilson's score interval for a binomial proportion (Wilson 1927): unlike the normal approximation it stays
    inside [0, 1] and is not empty at 0 or all correct. -> (low, high); (0, 1) for no trials."""
    if trials == 0:
        return 0.0, 1.0
    p = correct / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def passkey_batch(stoi, length, depth, trials, seed):
    """`trials` evaluation samples read in `length` tokens with the key at `depth`: length + 1 characters, the last
    digit a target only, as a training sample of block_size + 1 fills a window of T (the answer at the same
    positions at L = T). Fresh keys and filler drawn from (seed, length, depth): the same every run, and apart from
    training's (data/passkey/task.py). -> (tokens (trials, length + 1) int64, index of the answer's first digit)"""
    rng = np.random.default_rng([seed, length, round(depth * 1000)])
    samples = [eval_sample(rng, length + 1, depth) for _ in range(trials)]
    tokens = torch.tensor([[stoi[c] for c in s.text] for s in samples], dtype=torch.int64)
    return tokens, samples[0].answer_start


@torch.no_grad()
def answers_by_forward(model, tokens, answer_start, batch_size=50):
    """The argmax at each answer digit, given the true text before it, in one forward pass per batch of rows.
    A scheme with a position table (learned) past its length sees, for each digit, the max_len tokens ending
    before it (its sliding window, as it generates). -> (rows, KEY_DIGITS)"""
    inputs = tokens[:, :-1]  # the last digit is only a target
    where = torch.arange(
        answer_start - 1, answer_start - 1 + KEY_DIGITS
    )  # the inputs that predict the digits
    limit = model.max_len
    out = []
    for rows in inputs.split(batch_size):
        if limit is None or rows.size(1) <= limit:
            out.append(model(rows)[0][:, where].argmax(-1))
        else:
            out.append(
                torch.stack([model(rows[:, p + 1 - limit : p + 1])[0][:, -1].argmax(-1) for p in where], 1)
            )
    return torch.cat(out)


def answers_by_greedy(model, tokens, answer_start):
    """The KEY_DIGITS tokens greedy decoding (temperature 0, KV cache) writes after the prompt. -> (rows, KEY_DIGITS)"""
    prompt = tokens[:, :answer_start]
    return generate_cached(model, prompt, KEY_DIGITS, temperature=0)[:, answer_start:]


def count_correct(model, tokens, answer_start, batch_size=50):
    """How many rows get all KEY_DIGITS digits right (exact match)."""
    guesses = answers_by_forward(model, tokens, answer_start, batch_size)
    return int((guesses == tokens[:, answer_start : answer_start + KEY_DIGITS]).all(1).sum())
