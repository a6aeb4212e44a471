"""Tiny Shakespeare, one token per character (nanoGPT's shakespeare_char): 65 characters, 90% train, 10% val.

    python -m data.shakespeare_char.prepare
    # wrote data/shakespeare_char: char tokenizer, vocab_size 65, train 1,003,854 tokens, val 111,540 tokens
    # (uint16), the counts of nanoGPT's shakespeare_char

input.txt here is the repo's one copy of the corpus (data/shakespeare reads it too). train.py prepares this
dataset by itself on first use (data.common.ensure_prepared)."""

import sys

if not __package__:  # `python data/shakespeare_char/prepare.py`: the repository's packages are not importable
    sys.exit(
        f"{sys.argv[0]}: error: run it from the repository root as `python -m data.shakespeare_char.prepare`"
    )


from data.common import DATA_ROOT
from data.writing import prepare_file, prepare_main


def prepare(out_dir, replace: bool = False) -> dict:
    return prepare_file(DATA_ROOT / "shakespeare_char" / "input.txt", out_dir, "char", replace=replace)


if __name__ == "__main__":
    prepare_main("shakespeare_char", "Prepare data/shakespeare_char from input.txt.", prepare)
