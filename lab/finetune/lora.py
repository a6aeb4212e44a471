"""LoRA (Hu et al. 2022) as LongLoRA uses it (Chen et al. 2024): low-rank adapters on the attention
projections (c_attn, holding q, k and v, and c_proj), every base weight frozen, optionally the embeddings and
LayerNorms trained too (LongLoRA's LoRA+, which closes most of LoRA's gap to full fine-tuning at long
context). Written here, not with peft, so the model stays a plain GPT and the checkpoint holds the merged
weights under GPT-2's names, which sample.py, lab/eval_length.py and --init_from read as any other: an adapted
Linear's state_dict holds the plain Linear's (weight merged, bias) beside its own exact tensors (lora_A,
lora_B, base.weight, base.bias), which train.py keeps beside the plain weights for an exact --resume."""

import math

import torch
import torch.nn as nn

from positions import overrides, require

TARGETS = ("c_attn", "c_proj")  # the adapted Linears of each block's attention
TRAINABLE = ("embed", "norm")  # --lora_train: the input embeddings (token, learned's table); LayerNorms
ALPHA, DROPOUT = 16.0, 0.05  # --lora_alpha and --lora_dropout where not given: LongLoRA's (peft's LoraConfig)


class LoRALinear(nn.Module):
    """base(x) + (alpha / rank) * B A dropout(x): base frozen, A (rank, in) Kaiming-uniform as nn.Linear's
    (peft's), B (out, rank) zero, so at step 0 the output is the base's exactly."""

    def __init__(self, base, rank, alpha, dropout=0.0):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        like = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **like))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.base(x) + self.scale * (self.dropout(x) @ self.lora_A.t() @ self.lora_B.t())

    def merged_weight(self):
        """W + (alpha / rank) B A: the plain Linear's weight that computes the same function (in eval)."""
        return (self.base.weight + self.scale * self.lora_B @ self.lora_A).detach()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """Its own tensors, and the plain Linear's it stands for: weight (merged) and bias."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.merged_weight()
        if self.base.bias is not None:
            destination[prefix + "bias"] = self.base.bias.detach()

    def _load_from_state_dict(self, state_dict, prefix, *args):
        for name in ("weight", "bias"):  # the plain Linear's: derived from the exact tensors, not loaded
            state_dict.pop(prefix + name, None)
        super()._load_from_state_dict(state_dict, prefix, *args)


class InputOnlyHead(nn.Linear):
    """The output head of a tied model whose weight trains as an input embedding only: it reads the shared
    matrix detached, so no gradient reaches it through the logits. Llama 2's embed_tokens, which LongLoRA
    trains, is untied from its lm_head; here the one matrix is both, so it moves by its input gradient alone
    and the head, reading it, moves with it."""

    def forward(self, x):
        return nn.functional.linear(x, self.weight.detach(), self.bias)


def check_flags(rank, alpha, dropout, train):
    """lab.finetune's LoRA flags, each a one-line ValueError; alpha, dropout and train None where not given,
    as each must be without --lora_rank: without adapters it would change nothing. -> --lora_train as a
    tuple"""
    require(rank >= 0, f"lora_rank must be >= 0 (0: no LoRA), got {rank}")
    require(alpha is None or alpha > 0, f"lora_alpha must be > 0, got {alpha}")
    require(dropout is None or 0.0 <= dropout < 1.0, f"lora_dropout must be in [0, 1), got {dropout}")
    names = tuple(train.split(",")) if train else ()
    each_once = all(name in TRAINABLE for name in names) and len(set(names)) == len(names)
    choices = f"give one or more of {', '.join(TRAINABLE)}, comma-separated and each once"
    require(each_once, f"--lora_train={train!r}: {choices}")
    for flag, value in (("lora_alpha", alpha), ("lora_dropout", dropout), ("lora_train", train)):
        require(rank or value is None, f"--{flag} sets LoRA's adapters: it needs --lora_rank")
    return names


def check_rank(rank, n_embd):
    """A one-line ValueError if rank exceeds n_embd, the smaller side of every adapted Linear (c_attn: n_embd
    to 3 n_embd, c_proj: n_embd to n_embd): B A of a larger rank has no more rank, only more parameters."""
    require(
        rank <= n_embd,
        f"--lora_rank={rank} is above n_embd={n_embd}, the smaller side of the adapted layers "
        f"{' and '.join(TARGETS)}: give a rank from 1 to {n_embd}",
    )


def add_adapters(model, rank, alpha, dropout=0.0, train=None):
    """Freeze a GPT but LoRALinear adapters on each block's TARGETS and what `train` names. -> model"""
    train = check_flags(rank, alpha, dropout, train)
    check_rank(rank, model.config.n_embd)
    model.requires_grad_(False)
    for attn in (block.attn for block in model.transformer.h):
        for name in TARGETS:
            setattr(attn, name, LoRALinear(getattr(attn, name), rank, alpha, dropout).train(model.training))
    if "embed" in train:  # the token embedding by its input gradient only (InputOnlyHead); the scheme's own
        model.transformer.wte.requires_grad_(True)  # if it says they are an embedding (learned's table)
        model.transformer.wpe.requires_grad_(overrides(model.transformer.wpe, "embed"))
        head = model.lm_head
        model.lm_head = InputOnlyHead(head.in_features, head.out_features, head.bias is not None)
        model.lm_head.weight, model.lm_head.bias = head.weight, head.bias  # the tied matrix, shared
    for module in model.modules() if "norm" in train else ():
        if isinstance(module, nn.LayerNorm):
            module.requires_grad_(True)
    model.lora = dict(rank=rank, alpha=alpha, train=",".join(train))
    return model


def trained_params(model):
    """(trained, total) parameter counts, a tied weight once."""
    params = list(model.parameters())
    return sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)


def describe(model):
    trained, total = trained_params(model)
    lora = getattr(model, "lora", None)
    what = "full fine-tuning" if lora is None else "LoRA rank {rank}, alpha {alpha:g}".format(**lora)
    also = f" + {lora['train']}" if lora and lora["train"] else ""
    return f"{what}{also}: training {trained:,} of {total:,} parameters ({trained / total:.1%})"


def adapters(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
