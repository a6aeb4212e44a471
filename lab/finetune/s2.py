"""S²-Attn (LongLoRA): its attention, shifted_sparse_attention, and its switch (the group size a run trains
with, checked once for train.py and the study). Training only: evaluation and sampling use full attention. It
only chooses which earlier keys a query sees, so every position scheme works with it (a score bias applies
inside each group, at its true positions); learned trains past its table only when --init_from interpolates
it."""

import torch
import torch.nn.functional as F

from model import causal_attention
from positions import attention_mask, require


def group_size(group, block_size, n_head):
    """S²-Attn's group for a run of block_size tokens: `group`, or block_size / 4 (LongLoRA's) when None; a
    ValueError unless it is even (half a group is the shift) and divides block_size, and n_head is even."""
    said, fix = f"--s2_group={group}", ""
    if group is None:  # the default's failure is block_size's: say so, and how to choose instead
        group = block_size // 4
        said = f"the default --s2_group, block_size // 4 = {group} (block_size={block_size}),"
        fix = "; give an --s2_group (even, dividing block_size) or a block_size that is a multiple of 8"
    require(group >= 2 and group % 2 == 0, f"{said} must be even and >= 2: half a group is the shift{fix}")
    require(block_size % group == 0, f"{said} must divide block_size={block_size}{fix}")
    require(n_head % 2 == 0, f"--s2_attn shifts half of the heads: n_head={n_head} must be even")
    return group


def use_s2_attn(model, group):
    """Every attention layer of model trains with S²-Attn in groups of `group` tokens (None: full attention
    again), through model.py's attention hooks: each layer's `attend` and, on the instance,
    GPT.attention_mask, which in training builds S²-Attn's mask (s2_mask: the score bias of model's position
    scheme read at each group's true positions, from (G, G) biases) once a forward for the layers to share.
    Evaluation, sampling and the KV cache keep full attention and model.py's own mask."""
    model.__dict__.pop("attention_mask", None)  # model.py's own mask again
    for block in model.transformer.h:
        block.attn.attend = causal_attention
    if not group:
        return
    scheme, n_head, full_mask = model.transformer.wpe, model.config.n_head, model.attention_mask

    def attention_mask(query_pos, cached=False):
        if cached or not model.training:
            return full_mask(query_pos, cached)
        return s2_mask(n_head, query_pos.numel(), group, scheme, query_pos.device)

    def attend(q, k, v, mask, dropout_p):
        if not model.training:
            return causal_attention(q, k, v, mask, dropout_p)
        return shifted_sparse_attention(q, k, v, group, mask=mask, dropout_p=dropout_p)

    model.attention_mask = attention_mask
    for block in model.transformer.h:
        block.attn.attend = attend


def shifted_sparse_attention(q, k, v, group, scheme=None, dropout_p=0.0, mask=None):
    """S²-Attn (LongLoRA, Chen et al. 2024), a training-only approximation of causal attention: each query
    sees the earlier keys of its group of G = `group` tokens, so scores cost T x G, not T x T. The second
    half of the heads works on groups shifted by G/2 (rolled by -G/2, rolled back after) and carries
    information across group borders. LongLoRA's non-flash path rolls the sequence, so its last shifted group
    (the sequence's end, then its start) lets early tokens see late ones; its flash path, as here, cuts that
    group into two separate causal pieces (s2_mask): no token sees a later one. q, k, v: (B, nh, T, hs),
    nh even, G even and dividing T; scheme: the position scheme whose score bias applies (None: none); mask:
    s2_mask's, when already built (a model's layers share one). -> (B, nh, T, hs)"""
    B, H, T, D = q.shape
    shift = lambda x, by: torch.cat((x[:, : H // 2], x[:, H // 2 :].roll(by, dims=2)), dim=1)
    grouped = lambda x: shift(x, -(group // 2)).reshape(B, H * (T // group), group, D)  # (B, nh * T/G, G, hs)
    mask = (s2_mask(H, T, group, scheme, q.device) if mask is None else mask).to(q.dtype)
    y = F.scaled_dot_product_attention(*map(grouped, (q, k, v)), attn_mask=mask, dropout_p=dropout_p)
    return shift(y.view(B, H, T, D), group // 2)


def s2_mask(n_head, T, group, scheme=None, device=None):
    """S²-Attn's additive mask, (nh * T/G, G, G): each group's positions.attention_mask at its tokens' true
    positions (a shifted head's group starts G/2 later; the last wraps round to the sequence's start), so a
    score bias sees the positions it would see in full attention, whatever it depends on; and in the wrapped
    group no score between its two halves (no later slot seen: the sequence's start must not see its end)."""
    order, half = torch.arange(T, device=device), n_head // 2
    in_order = torch.full((group, group), float("-inf"), device=device).triu(1)
    each = lambda p: attention_mask(scheme, p, p).expand(1, n_head, group, group)[0]  # (nh, G, G)
    masks = [
        torch.stack([each(p)[heads] for p in positions.view(-1, group)])
        for heads, positions in ((slice(None, half), order), (slice(half, None), order.roll(-(group // 2))))
    ]  # [(T/G, nh/2, G, G)] for the plain heads and the shifted ones
    return (torch.cat(masks, dim=1).transpose(0, 1) + in_order).flatten(0, 1)
