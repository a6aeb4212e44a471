"""Who bit whom? Feed "dog bites man" and "man bites dog" through a trained model of each position scheme and
compare the hidden states, layer by layer, up to the swap.

    python -m lab.demo.permutation                        # all five schemes, with the causal mask
    python -m lab.demo.permutation --pos=none --no_mask   # NoPE without the mask: states equal up to the swap
    python -m lab.demo.permutation --checkpoint=out/shakespeare_char_rope

Each cell is max |h(man bites dog)[swap] - h(dog bites man)| over the swapped words / over the tokens that
stay put: 0 means the model saw the same thing up to the swap (attention is permutation equivariant: lesson
section 1); any position scheme, or the causal mask alone, makes them differ."""

import sys

if not __package__:  # `python lab/demo/permutation.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.demo.permutation`")


from dataclasses import dataclass

import torch

from lab.experiments.runs import model_dirs
from lab.measure import instruments
from plumbing.cli import parse_flags
from plumbing.errors import one_line_errors
from positions import POS_SCHEMES

PROG = "python -m lab.demo.permutation"
DTYPES = {"float64": torch.float64, "float32": torch.float32}
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}  # below it, "same up to the swap": rounding only


@dataclass
class PermutationConfig:
    pos: str = "all"  # one scheme, or all five side by side
    no_mask: bool = False  # attention without the causal mask (every query sees every key)
    checkpoint: str | None = None  # a trained out_dir to use instead (its scheme is the checkpoint's)
    checkpoints: str | None = None  # a folder holding <pos>/ or shakespeare_char_<pos>/ checkpoints
    sentence: str = "dog bites man"  # three words; the first and the last are swapped
    dtype: str = "float64"  # float64: equivariance shows as ~1e-16; float32: ~1e-7

    def __post_init__(self):
        words = self.sentence.split(" ")
        if len(words) != 3 or not all(words):
            raise ValueError(f"sentence must be three words between single spaces, got {self.sentence!r}")
        if self.checkpoint and (self.pos != "all" or self.checkpoints):
            raise ValueError("--checkpoint names one model: leave out --pos and --checkpoints")


def parse_args(argv=None):
    choices = {"pos": (*POS_SCHEMES, "all"), "dtype": tuple(DTYPES)}
    sections = [("demo", PermutationConfig, None)]
    return PermutationConfig(**parse_flags(argv, PROG, __doc__, sections, choices=choices))


def pieces(tokenizer, sentence):
    """Token ids of [first word, the middle, last word]. GPT-2 BPE makes " dog" one token with its space,
    so there every word gets a leading space: both words are then pieces of the same form, swappable."""
    first, middle, last = sentence.split(" ")
    char = tokenizer.name == "char"
    texts = [first, f" {middle} ", last] if char else [f" {first}", f" {middle}", f" {last}"]
    return [tokenizer.encode(t) for t in texts]


def compare(model, tokenizer, sentence, mask=True):
    """-> (rows: one (swapped words max, unchanged max) per hidden state, text, swapped text)"""
    ids = pieces(tokenizer, sentence)
    perm = instruments.swap_permutation(ids)
    original = torch.tensor(ids[0] + ids[1] + ids[2])
    words = list(range(len(ids[0]))) + list(range(len(original) - len(ids[2]), len(original)))
    rows = instruments.swap_differences(model, original, original[perm], perm, words, mask)
    return rows, tokenizer.decode(original.tolist()), tokenizer.decode(original[perm].tolist())


def report(results, cfg):
    """results: {label: (rows, text, swapped)} -> the printed table, one column pair per model."""
    _, text, swapped = next(iter(results.values()))
    columns, verdicts = [], ""
    for rows, _, _ in results.values():  # an exact 0 shown as 0: bit-for-bit equal states
        columns.append([" / ".join(f"{value:.1e}" if value else "0" for value in row) for row in rows])
        same = max(max(row) for row in rows) < TOLERANCE[cfg.dtype]
        verdicts += f"{'same up to the swap' if same else 'different':>22}"
    mask = "without the causal mask" if cfg.no_mask else "with the causal mask"
    header = f"max |h({swapped!r})[swap] - h({text!r})| per hidden state, {mask}, {cfg.dtype}:"
    cells = "each cell: over the swapped words / over the tokens between them, which stay put"
    table = instruments.state_table(list(results), columns, 22)
    return "\n".join([header, cells, "", *table, f"{'':<10}{verdicts}"])


def main(argv=None):
    with one_line_errors(PROG):
        cfg = parse_args(argv)
        instruments.use_one_thread()
        if cfg.checkpoint:
            folders = {None: cfg.checkpoint}
        else:
            schemes = list(POS_SCHEMES) if cfg.pos == "all" else [cfg.pos]
            other = "--checkpoint=DIR (one trained run) or --checkpoints=DIR (a folder of runs)"
            folders = model_dirs(schemes, cfg.checkpoints, other=other)
        results = {}
        for folder in folders.values():
            model, tokenizer, ckpt = instruments.load(folder, DTYPES[cfg.dtype])
            print(f"pos={model.config.pos:<11} {instruments.describe(folder, ckpt)}")
            results[model.config.pos] = compare(model, tokenizer, cfg.sentence, mask=not cfg.no_mask)
    print(f"\n{report(results, cfg)}")
    return results


if __name__ == "__main__":
    main()
