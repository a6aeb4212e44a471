"""python -m lab.finetune: train.py's run with LongLoRA's S²-Attn and LoRA (lab/finetune/longlora.py), added
through train.py's extension point (train.main(argv, extension)); `python -m lab.finetune --help` lists every
flag."""

import sys

if not __package__:  # `python lab/finetune/__main__.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.finetune`")

from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import signal

import train
from lab.finetune.longlora import LongLoRA
from plumbing.errors import exit_status

PROG = "python -m lab.finetune"  # as the user types it, in every error line


def extension():
    """What this command adds to train.py's run (lab.experiments.runs reads its flags through it too)."""
    return LongLoRA()


def main(argv=None):
    """-> train.main's summary of the fine-tuning run."""
    return train.main(argv, extension())


if __name__ == "__main__":
    try:
        sys.exit(exit_status(main()["stopped"]))
    finally:  # the run is over: a Ctrl-C now (the interpreter shutting down) would only print a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
