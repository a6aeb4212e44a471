"""
Tiny Shakespeare, one token per character (nanoGPT's shakespeare_char): 65 characters, 90% train, 10% val.

    python -m data.shakespeare_char.prepare

input.txt here is the repo's one copy of the corpus (data/shakespeare reads it too). train.py prepares
this dataset by itself on first use (data.common.ensure_prepared).
"""

import argparse
from pathlib import Path

from data.common import REPLACE_HELP, dataset_dir, exit_on_user_error, prepare_file, summarize

INPUT = Path(__file__).with_name("input.txt")


def prepare(out_dir=None, replace: bool = False) -> dict:
    """Write Tiny Shakespeare's characters to out_dir (default data/shakespeare_char); return the meta."""
    return prepare_file(
        INPUT, out_dir or dataset_dir("shakespeare_char"), tokenizer="char", val_fraction=0.1, replace=replace
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m data.shakespeare_char.prepare",
        description="Prepare data/shakespeare_char from input.txt.",
    )
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    args = parser.parse_args(argv)
    with exit_on_user_error():
        meta = prepare(replace=args.replace)
    print(summarize(dataset_dir("shakespeare_char"), meta))


if __name__ == "__main__":
    main()

# Expected output (measured):
# $ python -m data.shakespeare_char.prepare
# wrote data/shakespeare_char: char tokenizer, vocab_size 65, train 1,003,854 tokens, val 111,540 tokens (uint16)
# (1,115,394 characters in all; the same counts as nanoGPT's shakespeare_char)
