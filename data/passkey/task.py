"""The passkey task (Mohtashami & Jaggi 2023, "Landmark Attention"), at character level: a 5-digit key is
stated once inside filler and asked for at the end. Loss past the trained length cannot tell whether a model
uses what lies far back; retrieving the key can.

    k3v9qa0e2xk3v9qa0e2xk3v#48213.9qa0e2xk3v9qa0e2xk3v9qa0e2xk3v9qa#48213
                           ^^^^^^^ the statement                    ^ the question, then the answer

Answering is in-context copying: find the earlier # and copy the five digits after it (an induction head,
Olsson et al. 2022). The filler, a random segment of 4 to 16 letters and digits repeated, asks for the same
skill at every position, since one key is too sparse a signal to learn copying from (docs/extrapolation.md
says why 4 to 16). A fixed hash puts one key in ten in the evaluation set, which train.bin never states;
val.bin and the retrieval evaluator use only those."""

import string
from dataclasses import dataclass
from pathlib import Path

FILLER = string.ascii_lowercase + string.digits
MARKER = "#"
END = "."  # closes a statement: the key's last digit is followed by something that is not filler
CHARS = sorted(FILLER + MARKER + END)  # the vocabulary, in id order (meta.json's chars)
KEY_DIGITS = 5
SEGMENT = (4, 16)  # the filler repeats a random segment of this many characters (bounds included)
EVAL_KEYS_ONE_IN = 10
KEY_CHARACTERS = 2 * (1 + KEY_DIGITS) + 1  # the statement #ddddd. and the question #ddddd
GENERATOR = {"name": "passkey", "filler_segment": list(SEGMENT)}  # meta.json's record, checked by outdated


def default_name(block_size):  # the dataset folder under data/
    return "passkey" if block_size == 64 else f"passkey_ctx{block_size}"


def is_eval_key(key):
    """Whether a key (0 .. 99999) is an evaluation key: Knuth's multiplicative hash, so the split says nothing
    about the digits (a rule such as 'last digit 7' would be learned)."""
    return (key * 2654435761) % 2**32 < 2**32 // EVAL_KEYS_ONE_IN


def draw_key(rng, split):
    """A random 5-digit key (leading zeros kept) from the training or the evaluation keys."""
    while is_eval_key(key := int(rng.integers(10**KEY_DIGITS))) != (split != "train"):
        pass  # drawn again: about one key in ten is an evaluation key
    return f"{key:0{KEY_DIGITS}d}"


def draw_filler(rng, n):
    """n characters: a random segment of SEGMENT[0] to SEGMENT[1] letters and digits, repeated."""
    segment = "".join(rng.choice(list(FILLER), int(rng.integers(SEGMENT[0], SEGMENT[1] + 1))))
    return (segment * (n // len(segment) + 1))[:n]


def filler_length(length):
    """The filler characters of a sample of `length` characters; ValueError when the key does not fit."""
    if length < KEY_CHARACTERS:
        raise ValueError(
            f"a sample of {length} characters cannot hold a statement and its question "
            f"({KEY_CHARACTERS} characters)"
        )
    return length - KEY_CHARACTERS


@dataclass(frozen=True)
class Sample:
    text: str  # filler with the statement inside, then the question and the answer: `length` characters
    key: str  # the answer, the text's last KEY_DIGITS characters
    statement_start: int  # index of the statement's marker: the number of filler characters before it
    answer_start: int  # index of the answer's first digit


def passkey_sample(rng, length, depth, split):
    """A sample of exactly `length` characters whose key is stated after round(depth x filler) characters of
    filler (depth in [0, 1]: 0 first, 1 right before the question) and asked for at the end."""
    n = filler_length(length)
    filler, key, cut = draw_filler(rng, n), draw_key(rng, split), round(depth * n)
    text = f"{filler[:cut]}{MARKER}{key}{END}{filler[cut:]}{MARKER}{key}"
    return Sample(text, key, cut, length - KEY_DIGITS)


def eval_sample(rng, length, depth):
    """An evaluation sample: an evaluation key at `depth`."""
    return passkey_sample(rng, length, depth, "eval")


def training_sample(rng, length, split):
    """A training (or val) sample: the key at a uniformly random depth."""
    return passkey_sample(rng, length, float(rng.random()), split)


def outdated(meta, data_dir):
    """(why, the prepare command that makes it again) for a passkey dataset made with other settings than
    today's, else None (for other data too). Without meta's "generator", the filler segments were 8 to 32."""
    if meta.get("generator") is None and not (meta.get("chars") == CHARS and "sample_length" in meta):
        return None  # not passkey samples
    if (was := (meta.get("generator") or {}).get("filler_segment", [8, 32])) == list(SEGMENT):
        return None
    block_size, name = meta["sample_length"] - 1, Path(data_dir).name
    rename = "" if name == default_name(block_size) else f" --name {name}"
    why = "was made with filler segments of {} to {} characters, the task's are now {} to {}"
    return why.format(*was, *SEGMENT), f"python -m data.passkey.prepare --block_size {block_size}{rename}"
