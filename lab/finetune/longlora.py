"""LongLoRA's fine-tuning (Chen et al. 2024) as an extension of train.py's run (plumbing.resume.Extension):
S²-Attn in training (s2.py) and LoRA adapters (lora.py), each with flags of its own beside train.py's. `python
-m lab.finetune` runs it; a checkpoint holds the plain GPT's weights (LoRA merged), which sample.py,
lab.eval_length and --init_from read as any other, and the adapters beside them for an exact --resume."""

from dataclasses import dataclass, replace

from lab.finetune import lora, s2
from plumbing.resume import Extension
from positions import require


@dataclass
class FineTuneFlags:
    s2_attn: bool = False  # train with S²-Attn: attention within groups, half the heads shifted by half one
    s2_group: int | None = None  # S²-Attn's group in tokens; None: block_size / 4
    lora_rank: int = 0  # LoRA adapters of this rank on attention's c_attn and c_proj, rest frozen; 0: none
    lora_alpha: float | None = None  # the adapters' scale is lora_alpha / lora_rank; None: 16
    lora_dropout: float | None = None  # dropout on the adapters' input; None: 0.05
    lora_train: str | None = None  # with LoRA also train: embed, norm or embed,norm (LongLoRA's LoRA+)


class LongLoRA(Extension):
    """python -m lab.finetune: train.py's run (every train.py flag) with LongLoRA's S²-Attn and LoRA.

    python -m lab.finetune --init_from=out/shakespeare_char_rope --block_size=256 --rope_scaling=linear \\
        --rope_factor=4 --s2_attn --lora_rank=8 --lora_train=embed,norm
    python -m lab.finetune ... --resume                 # the same command plus --resume continues the run
    """

    prog = "python -m lab.finetune"
    Flags = FineTuneFlags

    def configure(self, flags, model_config):
        lora.check_flags(flags.lora_rank, flags.lora_alpha, flags.lora_dropout, flags.lora_train)
        lora.check_rank(flags.lora_rank, model_config.n_embd)
        # the run records what it used: the defaults where a flag was not given (None)
        alpha = lora.ALPHA if flags.lora_alpha is None else flags.lora_alpha
        dropout = lora.DROPOUT if flags.lora_dropout is None else flags.lora_dropout
        flags = replace(flags, lora_alpha=alpha, lora_dropout=dropout)
        require(flags.s2_attn or flags.s2_group is None, "--s2_group needs --s2_attn")
        if flags.s2_attn:
            group = s2.group_size(flags.s2_group, model_config.block_size, model_config.n_head)
            flags = replace(flags, s2_group=group)
        self.flags = flags

    def adapt(self, model):
        s2.use_s2_attn(model, self.flags.s2_group)  # None: full attention
        f = self.flags
        if f.lora_rank:
            lora.add_adapters(model, f.lora_rank, f.lora_alpha, f.lora_dropout, f.lora_train)
            return lora.describe(model)
        return None

    def checkpoint_entries(self, model):
        return lora.checkpoint_entries(model)

    def resume_state(self, path, ckpt, model):
        return lora.resume_state(path, ckpt, model)
