"""LongLoRA's fine-tuning (Chen et al. 2024) as train.py runs a training method: its flags (FineTuneFlags),
checked against the model (fit), and what it does to the built model before the optimizer takes its
parameters (prepare): S²-Attn in training (s2.py) replaces each layer's attention, LoRA (lora.py) wraps
attention's Linears. `python -m lab.finetune` joins them to train.py's TrainConfig. A checkpoint holds the
plain GPT's weights (LoRA merged), which sample.py, lab.eval_length and --init_from read as any other, and the
adapters' exact tensors beside them ("lora", from the model's state_dict) for an exact --resume."""

from dataclasses import dataclass, replace

from lab.finetune import lora, s2
from positions import require

STATE_ENTRY = "lora"  # the checkpoint entry of the adapters' state (TrainConfig.state_entry)


@dataclass
class FineTuneFlags:
    s2_attn: bool = False  # train with S²-Attn: attention within groups, half the heads shifted by half one
    s2_group: int | None = None  # S²-Attn's group in tokens; None: block_size / 4
    lora_rank: int = 0  # LoRA adapters of this rank on attention's c_attn and c_proj, rest frozen; 0: none
    lora_alpha: float | None = None  # the adapters' scale is lora_alpha / lora_rank; None: 16
    lora_dropout: float | None = None  # dropout on the adapters' input; None: 0.05
    lora_train: str | None = None  # with LoRA also train: embed, norm or embed,norm (LongLoRA's LoRA+)


def fit(flags, model_config):
    """flags (a FineTuneFlags, or a config holding its fields) checked against the model, each mistake a
    one-line ValueError, before any work -> flags as the run records them: the defaults where not given."""
    lora.check_flags(flags.lora_rank, flags.lora_alpha, flags.lora_dropout, flags.lora_train)
    lora.check_rank(flags.lora_rank, model_config.n_embd)
    base = getattr(flags, "init_from", True) or getattr(flags, "resume", False)
    require(
        not flags.lora_rank or base,
        f"--lora_rank={flags.lora_rank} trains adapters on a frozen model: give the run to fine-tune, "
        "--init_from=RUN (or --resume to continue a fine-tune)",
    )
    alpha = lora.ALPHA if flags.lora_alpha is None else flags.lora_alpha
    dropout = lora.DROPOUT if flags.lora_dropout is None else flags.lora_dropout
    require(flags.s2_attn or flags.s2_group is None, "--s2_group needs --s2_attn")
    group = flags.s2_group
    if flags.s2_attn:
        group = s2.group_size(flags.s2_group, model_config.block_size, model_config.n_head)
    return replace(flags, lora_alpha=alpha, lora_dropout=dropout, s2_group=group)


def prepare(flags, model):
    """S²-Attn and LoRA on the built model (fit's flags) -> the log line on what trains, or None."""
    s2.use_s2_attn(model, flags.s2_group if flags.s2_attn else None)
    if not flags.lora_rank:
        return None
    lora.add_adapters(model, flags.lora_rank, flags.lora_alpha, flags.lora_dropout, flags.lora_train)
    return lora.describe(model)
