"""FineWeb-Edu (its 10B-token sample) as GPT-2 BPE tokens: the web-scale corpus for GPU runs.

    pip install datasets
    python -m data.fineweb_edu.prepare                          # the whole sample: ~10B tokens, ~20 GB
    python -m data.fineweb_edu.prepare --max_tokens 1000000000  # the first ~1B train tokens, for shorter runs

Not nanoGPT's OpenWebText: on the Hugging Face Hub that is a loading script, which `datasets` 4 refuses.
FineWeb-Edu is plain parquet, and the corpus of llm.c's and nanochat's GPT-2 runs, whose loss curves are
published. Documents are streamed, tokenized in worker processes, each followed by <|endoftext|>, and appended
as uint16: whole documents from the start of the stream to val until it holds --val_tokens, the rest to train.
"""

import sys

if not __package__:  # `python data/fineweb_edu/prepare.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m data.fineweb_edu.prepare`")


import argparse
import os
import signal
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from itertools import islice

import numpy as np

from data import common, writing
from plumbing.errors import UserError
from plumbing.progress import progress_bar
from plumbing.tokenizers import GPT2Tokenizer

HF_DATASET, HF_CONFIG = "HuggingFaceFW/fineweb-edu", "sample-10BT"
SAMPLE_TOKENS = 10_000_000_000  # sample-10BT is named for its ~10B GPT-2 tokens; sets the progress bar's ETA


def tokenize_docs(docs: list) -> list:
    """Each document's GPT-2 ids followed by <|endoftext|>, as uint16 arrays (runs in a worker process)."""
    tok = GPT2Tokenizer()
    return [np.array(tok.encode(doc) + [tok.eot_id], dtype=np.uint16) for doc in docs]


def _leave_signals_to_the_parent():
    # Ctrl-C reaches the whole process group: workers ignore it while the parent stops and cleans up; SIGTERM
    # gets back its default, not the parent's handler inherited through fork
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def tokenize_in_order(docs, num_proc: int, docs_per_task: int = 64):
    """Yield tokenize_docs' arrays in document order, from num_proc processes, at most 2 * num_proc tasks in
    flight (Pool.imap would read the whole stream into memory ahead of the workers)."""
    docs, pending = iter(docs), deque()
    with ProcessPoolExecutor(num_proc, initializer=_leave_signals_to_the_parent) as pool:
        try:
            while batch := list(islice(docs, docs_per_task)):
                pending.append(pool.submit(tokenize_docs, batch))
                if len(pending) >= 2 * num_proc:
                    yield from pending.popleft().result()
            while pending:
                yield from pending.popleft().result()
        finally:  # the caller may stop early (max_tokens): don't tokenize what nobody will read
            for future in pending:
                future.cancel()


def write_token_dataset(
    out_dir, docs, val_tokens, max_tokens=None, num_proc=1, docs_per_task=64, total_tokens=None, replace=False
) -> dict:
    """Tokenize document strings into a GPT-2 dataset in out_dir; return the meta. Whole documents go to val
    until it holds val_tokens, then train until it holds max_tokens (None: all). total_tokens: for the ETA."""
    tok_meta = GPT2Tokenizer().to_meta()  # loads the BPE here, so a missing one fails before any work
    counts = {"train": 0, "val": 0}
    with writing.staged_dataset(out_dir, replace) as tmp:
        bar = progress_bar(total_tokens, "tok", desc=f"tokenizing into {out_dir}")
        with open(tmp["train.bin"], "wb") as train_f, open(tmp["val.bin"], "wb") as val_f, bar:
            files = {"train": train_f, "val": val_f}
            for ids in tokenize_in_order(docs, num_proc, docs_per_task):
                split = "val" if counts["val"] < val_tokens else "train"
                if split == "train" and max_tokens is not None and counts["train"] >= max_tokens:
                    break
                files[split].write(ids.tobytes())
                counts[split] += len(ids)
                bar.update(len(ids))
        meta = writing.complete_meta(tok_meta, counts["train"], counts["val"])
        writing.save_meta(tmp["meta.json"], meta)
    return meta


def stream_documents():
    """FineWeb-Edu sample-10BT's texts, streamed from the Hugging Face Hub in its fixed file order."""
    try:
        from datasets import load_dataset  # not a requirement of the repo: only this script needs it
    except ImportError:
        raise UserError("streaming FineWeb-Edu needs Hugging Face datasets: pip install datasets") from None
    rows = load_dataset(HF_DATASET, name=HF_CONFIG, split="train", streaming=True)
    return (row["text"] for row in rows)


def main(argv=None):
    description = "Prepare data/fineweb_edu: FineWeb-Edu sample-10BT as GPT-2 tokens."
    parser = argparse.ArgumentParser(prog="python -m data.fineweb_edu.prepare", description=description)
    add = parser.add_argument
    add("--max_tokens", type=int, help="stop once train holds this many tokens (default: all)")
    add("--val_tokens", type=int, default=10_000_000, help="tokens of whole documents kept for val")
    cores = max(1, (os.cpu_count() or 2) - 1)
    add("--num_proc", type=int, default=cores, help="tokenizer processes (default: all cores but one)")
    add("--replace", action="store_true", help=writing.REPLACE_HELP)
    args = parser.parse_args(argv)
    out_dir = common.dataset_dir("fineweb_edu")
    total = args.val_tokens + (args.max_tokens if args.max_tokens is not None else SAMPLE_TOKENS)
    with writing.exit_on_user_error(parser.prog):
        writing.refuse_existing(out_dir, args.replace)  # before connecting to the Hub
        docs = stream_documents()
        meta = write_token_dataset(
            out_dir, docs, args.val_tokens, args.max_tokens, args.num_proc, 64, total, args.replace
        )
    print(writing.summarize(out_dir, meta))


if __name__ == "__main__":
    main()
