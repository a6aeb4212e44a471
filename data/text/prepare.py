"""
Make a dataset from your own UTF-8 text file.

    python -m data.text.prepare --input mybook.txt                    # -> data/mybook, one token per character
    python -m data.text.prepare --input mybook.txt --tokenizer gpt2 --name mybook_gpt2
    python train.py --dataset mybook

The text is cut at (1 - val_fraction) of its characters and each part encoded, so val is the end of the
text, as in nanoGPT's shakespeare_char. With --tokenizer char the vocabulary is the sorted set of the file's
characters. The Shakespeare datasets are this script with a fixed input.
"""
import argparse
from pathlib import Path

from data.common import (TOKENIZERS, CharTokenizer, DataError, GPT2Tokenizer, dataset_dir, exit_on_user_error,
                         summarize, write_dataset)


def read_text(path) -> str:
    """The text of a UTF-8 file, or an error that says what to do about it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; pass --input the path of a UTF-8 text file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # -sig drops the byte-order mark some Windows editors write first
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): "
                        f"save it as UTF-8, e.g. iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8.txt") from None
    if not text:
        raise DataError(f"{path} is empty: pass a file with some text in it")
    return text


def prepare_text(text: str, out_dir, tokenizer: str = "char", val_fraction: float = 0.1, block_size: int = 64,
                 source: str = "the text") -> dict:
    """Split, encode and write `text` as a dataset in out_dir; return its meta.

    Each split must hold at least block_size + 1 tokens, the length of one (x, y) training window.
    """
    if not 0 < val_fraction < 1:
        raise DataError(f"--val_fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if block_size < 1:
        raise DataError(f"--block_size must be at least 1, got {block_size}")
    if tokenizer not in TOKENIZERS:
        raise DataError(f"--tokenizer must be one of {', '.join(TOKENIZERS)}, got {tokenizer!r}")
    tok = CharTokenizer(sorted(set(text))) if tokenizer == "char" else GPT2Tokenizer()
    n = int(len(text) * (1 - val_fraction))
    splits = {"train": tok.encode(text[:n]), "val": tok.encode(text[n:])}
    for split, ids in splits.items():
        if len(ids) < block_size + 1:
            fix = "a larger --val_fraction" if split == "val" else "a smaller --val_fraction"
            raise DataError(f"{source} is too short: its {split} split has {len(ids)} {tokenizer} tokens, fewer than "
                            f"block_size + 1 = {block_size + 1}; use a longer text, a smaller --block_size or {fix}")
    return write_dataset(out_dir, splits["train"], splits["val"], tok.to_meta())


def prepare_file(input_path, out_dir=None, tokenizer: str = "char", val_fraction: float = 0.1,
                 block_size: int = 64) -> dict:
    """prepare_text on a file's text; out_dir defaults to data/<file stem>."""
    text = read_text(input_path)
    out_dir = out_dir if out_dir is not None else dataset_dir(Path(input_path).stem)
    return prepare_text(text, out_dir, tokenizer, val_fraction, block_size, source=str(input_path))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m data.text.prepare",
        description="Make data/NAME/{train,val}.bin and meta.json from a UTF-8 text file.")
    parser.add_argument("--input", required=True, help="the UTF-8 text file")
    parser.add_argument("--tokenizer", choices=TOKENIZERS, default="char",
                        help="char: one token per character, vocabulary from the file; gpt2: GPT-2 BPE (tiktoken)")
    parser.add_argument("--name", help="dataset name, the folder under data/ (default: the file name without suffix)")
    parser.add_argument("--val_fraction", type=float, default=0.1, help="fraction of the text, from its end, kept for val")
    parser.add_argument("--block_size", type=int, default=64,
                        help="the context length you will train with: each split needs at least block_size + 1 tokens")
    args = parser.parse_args(argv)
    name = args.name or Path(args.input).stem
    if Path(name).name != name or name in ("", ".", ".."):
        parser.error(f"--name must be a plain folder name such as mybook, got {name!r}")
    with exit_on_user_error():
        meta = prepare_file(args.input, dataset_dir(name), args.tokenizer, args.val_fraction, args.block_size)
    print(summarize(dataset_dir(name), meta))
    print(f"train on it with --dataset {name}")


if __name__ == "__main__":
    main()
