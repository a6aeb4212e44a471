"""S²-Attn's switch: which group size a run trains with, checked once for every caller (train.py, the study).
The attention itself is model.shifted_sparse_attention; evaluation and sampling use full attention. It only
chooses which earlier keys a query sees, so every position scheme works with it (ALiBi's bias, by distance,
applies inside each group); learned trains past its table only when --init_from interpolates it."""

from positions import require


def group_size(group, block_size, n_head):
    """S²-Attn's group for a run of block_size tokens: `group`, or block_size / 4 (LongLoRA's) when None; a
    ValueError unless it is even (half a group is the shift) and divides block_size, and n_head is even."""
    group = block_size // 4 if group is None else group
    require(
        group >= 2 and group % 2 == 0, f"--s2_group={group} must be even and >= 2: half a group is the shift"
    )
    require(block_size % group == 0, f"s2_group={group} must divide block_size={block_size}")
    require(n_head % 2 == 0, f"--s2_attn shifts half of the heads: n_head={n_head} must be even")
    return group


def use_s2_attn(model, group):
    """Every attention layer of model trains with S²-Attn in groups of `group` tokens (None: full)."""
    for block in model.transformer.h:
        block.attn.s2_group = group
