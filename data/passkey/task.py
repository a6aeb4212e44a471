"""
The passkey task (Mohtashami & Jaggi 2023, "Landmark Attention"), at character level: a 5-digit key is stated
once inside filler and asked for at the end. Loss past the trained length cannot tell whether a model uses what
lies far back (a model that reads only the last few dozen characters keeps a flat loss); retrieving the key can.

    ...qhwvzkeoxM48213.pfjwqlxhadsn...yfkcM48213
          statement ^^^^^^^            ^ question, then the answer

The question repeats the statement's marker, an uppercase letter, so that answering is in-context copying: find
the earlier occurrence of the marker and copy the five digits after it (an induction head, Olsson et al. 2022).
The filler is random lowercase letters: it says nothing about the key and never contains a digit or a marker.

A training sample holds 1 to `needles` keys, each under its own marker, stated at random places and asked for at
the end in random order; evaluation asks for one. Sparse retrieval is slow to learn at this size (one key is 5 of
65 tokens), so several keys per sample give the copying more gradient (Arora et al. 2023's multi-query recall).

Evaluation keys are apart from training keys: a fixed hash puts one key in ten (EVAL_KEYS_ONE_IN) in the
evaluation set, and train.bin never states one of them; val.bin and the retrieval evaluator use only those.
"""

import string
from dataclasses import dataclass


FILLER = string.ascii_lowercase
DIGITS = string.digits
MARKERS = string.ascii_uppercase
END = "."  # closes a statement, so that the key's last digit is not followed by more filler-like text
CHARS = sorted(FILLER + DIGITS + MARKERS + END)  # the vocabulary, in id order (meta.json's chars)
KEY_DIGITS = 5
EVAL_KEYS_ONE_IN = 10


def is_eval_key(key):
    """Whether a key (0 .. 99999) belongs to the evaluation keys: Knuth's multiplicative hash, so the split says
    nothing about the digits (a rule such as 'last digit 7' would be learned, and fail on evaluation)."""
    return (key * 2654435761) % 2**32 < 2**32 // EVAL_KEYS_ONE_IN


def draw_key(rng, split):
    """A random 5-digit key (leading zeros kept) from the training or the evaluation keys."""
    want_eval = split != "train"
    while True:
        key = int(rng.integers(10**KEY_DIGITS))
        if is_eval_key(key) == want_eval:
            return f"{key:0{KEY_DIGITS}d}"


def statement(marker, key):
    return f"{marker}{key}{END}"


@dataclass(frozen=True)
class Sample:
    text: str  # the whole sequence: filler with the statement(s), then the question(s) and answer(s)
    answer_start: int  # index in text of the first digit of the last answer
    key: str  # the last answer
    statement_start: int  # index in text of the last answer's statement (its marker)


def passkey_text(filler, keys, markers, cuts, order):
    """filler with statement i inserted before filler[cuts[i]], then the questions (marker + key) in `order`.
    -> (text, index of the first digit of the last answer, index of its statement)"""
    pieces, previous, where = [], 0, {}
    for i in sorted(range(len(keys)), key=lambda i: cuts[i]):
        pieces.append(filler[previous:cuts[i]])
        where[i] = sum(map(len, pieces))
        pieces.append(statement(markers[i], keys[i]))
        previous = cuts[i]
    pieces.append(filler[previous:])
    pieces += [markers[i] + keys[i] for i in order]
    text = "".join(pieces)
    return text, len(text) - KEY_DIGITS, where[order[-1]]


def key_characters(n_keys):
    """Characters that n_keys statements and their questions (marker and answer) take."""
    return n_keys * (len(statement("M", "0" * KEY_DIGITS)) + 1 + KEY_DIGITS)


def filler_length(length, n_keys):
    """How many filler characters a sample of `length` characters with n_keys keys has."""
    n = length - key_characters(n_keys)
    if n < 0:
        raise ValueError(f"{n_keys} key(s) need {length - n} characters, more than a sample of {length}")
    return n


def eval_sample(rng, length, depth):
    """One evaluation sample of exactly `length` characters: one key under a random marker, its statement after
    round(depth x filler) characters of filler (depth 0: first, 1: right before the question), the answer last."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    n = filler_length(length, 1)
    filler = "".join(rng.choice(list(FILLER), n))
    marker, key = MARKERS[int(rng.integers(len(MARKERS)))], draw_key(rng, "eval")
    text, answer_start, statement_start = passkey_text(filler, [key], [marker], [round(depth * n)], [0])
    return Sample(text, answer_start, key, statement_start)


def training_sample(rng, length, needles, split):
    """One sample of exactly `length` characters with 1 to `needles` keys (as many as fit), each under its own
    marker, stated at uniformly random places, asked for at the end in random order."""
    most = min(needles, len(MARKERS))
    while most > 1 and key_characters(most) > length:
        most -= 1
    n_keys = int(rng.integers(1, most + 1))
    n = filler_length(length, n_keys)
    filler = "".join(rng.choice(list(FILLER), n))
    markers = [str(m) for m in rng.choice(list(MARKERS), n_keys, replace=False)]
    keys = [draw_key(rng, split) for _ in range(n_keys)]
    cuts = [int(c) for c in rng.integers(0, n + 1, n_keys)]
    order = [int(i) for i in rng.permutation(n_keys)]
    text, answer_start, statement_start = passkey_text(filler, keys, markers, cuts, order)
    return Sample(text, answer_start, keys[order[-1]], statement_start)
