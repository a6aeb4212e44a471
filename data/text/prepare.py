"""
Make a dataset from your own UTF-8 text file: val is the end of the text, as in nanoGPT's shakespeare_char.

    python -m data.text.prepare --input mybook.txt          # -> data/mybook, one token per character
    python -m data.text.prepare --input mybook.txt --tokenizer gpt2 --name mybook_gpt2
    python -m data.text.prepare --input mybook2.txt --name mybook --replace  # a name in use needs --replace
    python train.py --dataset mybook
"""

import sys

if not __package__:  # `python data/text/prepare.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m data.text.prepare`")


from pathlib import Path

from data import common, writing
from plumbing.cli import ArgumentParser
from plumbing.tokenizers import TOKENIZERS


def main(argv=None):
    description = "Make data/NAME/{train,val}.bin and meta.json from a UTF-8 text file."
    parser = ArgumentParser(prog="python -m data.text.prepare", description=description)  # errors: 1 line
    add = parser.add_argument
    add("--input", required=True, help="the UTF-8 text file")
    tokenizer_help = "char: one token per character; gpt2: GPT-2 BPE"
    add("--tokenizer", choices=TOKENIZERS, default="char", help=tokenizer_help)
    add("--name", help="dataset name, the folder under data/ (default: the file name without suffix)")
    add("--val_fraction", type=float, default=0.1, help="fraction of the text, from its end, kept for val")
    block_help = "the context you will train with: each split needs T + 1 tokens"
    add("--block_size", type=int, default=64, help=block_help)
    add("--replace", action="store_true", help=writing.REPLACE_HELP)
    with writing.exit_on_user_error(parser.prog):
        args = parser.parse_args(argv)
        name = Path(args.input).stem if args.name is None else args.name
        if common.bad_dataset_name(name):
            parser.error(f"--name must be a plain folder name such as mybook, got {name!r}")
        out_dir = common.dataset_dir(name)
        meta = writing.prepare_file(
            args.input, out_dir, args.tokenizer, args.val_fraction, args.block_size, args.replace
        )
    print(writing.summarize(out_dir, meta))
    print(f"train on it with --dataset {name}")


if __name__ == "__main__":
    main()
