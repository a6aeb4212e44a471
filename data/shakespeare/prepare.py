"""
Tiny Shakespeare as GPT-2 BPE tokens (nanoGPT's shakespeare): 90% train, 10% val, split by characters.

    python -m data.shakespeare.prepare

Reads the one copy of the corpus, data/shakespeare_char/input.txt. The BPE comes from tiktoken, which
downloads it on first use; offline, point TIKTOKEN_CACHE_DIR at a folder that holds its cached files.
train.py prepares this dataset by itself on first use (data.common.ensure_prepared).
"""

import argparse

from data.common import DATA_ROOT, REPLACE_HELP, dataset_dir, exit_on_user_error, prepare_file, summarize

INPUT = DATA_ROOT / "shakespeare_char" / "input.txt"


def prepare(out_dir=None, replace: bool = False) -> dict:
    """Write Tiny Shakespeare's GPT-2 tokens to out_dir (default data/shakespeare); return the meta."""
    return prepare_file(
        INPUT, out_dir or dataset_dir("shakespeare"), tokenizer="gpt2", val_fraction=0.1, replace=replace
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m data.shakespeare.prepare",
        description="Prepare data/shakespeare from data/shakespeare_char/input.txt.",
    )
    parser.add_argument("--replace", action="store_true", help=REPLACE_HELP)
    args = parser.parse_args(argv)
    with exit_on_user_error():
        meta = prepare(replace=args.replace)
    print(summarize(dataset_dir("shakespeare"), meta))


if __name__ == "__main__":
    main()

# Expected output (measured):
# $ python -m data.shakespeare.prepare
# wrote data/shakespeare: gpt2 tokenizer, vocab_size 50,257, train 301,966 tokens, val 36,059 tokens (uint16)
# (the same counts as nanoGPT's data/shakespeare)
