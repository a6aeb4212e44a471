"""Tiny Shakespeare as GPT-2 BPE tokens (nanoGPT's shakespeare): 90% train, 10% val, split by characters.

    python -m data.shakespeare.prepare
    # wrote data/shakespeare: gpt2 tokenizer, vocab_size 50,257, train 301,966 tokens, val 36,059 tokens
    # (uint16), the counts of nanoGPT's shakespeare

Reads data/shakespeare_char/input.txt. tiktoken downloads the BPE on first use; offline, point
TIKTOKEN_CACHE_DIR at a folder holding its cached files. train.py prepares this dataset itself on first use.
"""

import sys

if not __package__:  # `python data/shakespeare/prepare.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m data.shakespeare.prepare`")


from data.common import DATA_ROOT
from data.writing import prepare_file, prepare_main


def prepare(out_dir, replace: bool = False) -> dict:
    return prepare_file(DATA_ROOT / "shakespeare_char" / "input.txt", out_dir, "gpt2", replace=replace)


if __name__ == "__main__":
    prepare_main("shakespeare", "Prepare data/shakespeare from data/shakespeare_char/input.txt.", prepare)
