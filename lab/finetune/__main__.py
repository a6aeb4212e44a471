"""python -m lab.finetune: train.py's run with LongLoRA's S²-Attn and LoRA (lab/finetune/longlora.py), added
as train.py takes a training method: a TrainConfig subclass with its own flags, run by train.main(argv,
FineTuneConfig); `python -m lab.finetune --help` lists every flag."""

import sys

if not __package__:  # `python lab/finetune/__main__.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.finetune`")

from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import signal
from dataclasses import dataclass

import train
from lab.finetune import longlora
from plumbing.errors import exit_status

PROG = "python -m lab.finetune"  # as the user types it, in every error line


@dataclass
class FineTuneConfig(train.TrainConfig, longlora.FineTuneFlags):
    """python -m lab.finetune: train.py's run (every train.py flag) with LongLoRA's S²-Attn and LoRA.

    python -m lab.finetune --init_from=out/shakespeare_char_rope --block_size=256 --rope_scaling=linear \\
        --rope_factor=4 --s2_attn --lora_rank=8 --lora_train=embed,norm
    python -m lab.finetune ... --resume                 # the same command plus --resume continues the run
    """

    prog = PROG
    state_entry = longlora.STATE_ENTRY

    def fit(self, model_config):
        return longlora.fit(self, model_config)

    def prepare(self, model):
        return longlora.prepare(self, model)


Config = FineTuneConfig  # what lab.experiments.runs reads a command's settings with


def main(argv=None):
    """-> train.main's summary of the fine-tuning run."""
    return train.main(argv, FineTuneConfig)


if __name__ == "__main__":
    try:
        sys.exit(exit_status(main()["stopped"]))
    finally:  # the run is over: a Ctrl-C now (the interpreter shutting down) would only print a traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
