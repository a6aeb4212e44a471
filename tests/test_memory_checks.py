"""The training memory estimate against what a small model allocates, and each entry point that allocates by
a user's numbers refusing a size that cannot fit in one line, before it builds a model or prepares data."""

import pytest
import torch
from helpers import TINY_RUN

import train
from data.passkey import prepare as passkey_prepare
from lab.perf import ab, bench
from model import GPT, GPTConfig
from plumbing import hardware, memory
from plumbing.errors import UserError
from plumbing.memory import activation_bytes, forward_bytes, parameter_count, training_bytes
from positions import POS_SCHEMES


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_the_weights_and_adamw_state_are_what_one_step_allocates(pos, bias):
    """After one AdamW step the weights, their gradients and AdamW's two moments are, to the byte,
    training_bytes' weights, gradients and AdamW state (its step counters, one float per tensor, aside), and
    parameter_count is the model's own count."""
    config = GPTConfig.from_flat(
        n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=11, pos=pos, bias=bias
    )
    model = GPT(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
    x = torch.randint(11, (3, 8))
    model(x, x)[1].backward()
    optimizer.step()
    params = list(model.parameters())
    moments = [t for state in optimizer.state.values() for key, t in state.items() if key != "step"]
    estimate = training_bytes(config, 3, 1)
    assert parameter_count(config) == model.num_params()
    assert estimate["weights"] == sum(p.nbytes for p in params)
    assert estimate["gradients"] == sum(p.grad.nbytes for p in params)
    assert estimate["AdamW state"] == sum(t.nbytes for t in moments)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_the_activation_estimate_bounds_what_autograd_keeps(pos, dropout):
    """The tensors one training forward saves for backward (counted through saved_tensors_hooks, each storage
    once, weights and tables left out) are 75% to 100% of activation_bytes."""
    config = GPTConfig.from_flat(
        n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=50, pos=pos, dropout=dropout
    )
    torch.manual_seed(0)
    model = GPT(config).train()
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randint(50, (3, 32))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, x)
    assert 0.75 <= sum(saved.values()) / activation_bytes(config, 3) <= 1.0


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_the_forward_estimate_counts_the_mask_of_every_score_bias(pos):
    """Where GPT.attention_mask builds a mask (a scheme whose score_bias gives a bias: ALiBi's, T5's, FIRE's),
    forward_bytes counts at least its bytes, asked of the scheme, not of its name."""
    config = GPTConfig.from_flat(n_layer=1, n_head=4, n_embd=16, block_size=8, vocab_size=11, pos=pos)
    mask = GPT(config).attention_mask(torch.arange(32))
    counted = forward_bytes(config, 1, 32).get("attention mask", 0)
    assert mask is None or counted >= mask.nbytes, (counted, mask.nbytes)


def never(what):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} ran: the size should have been refused first")

    return refuse


TRAIN = [arg for arg in TINY_RUN if not arg.startswith(("--batch_size", "--block_size"))]
CASES = [
    (train, [*TRAIN, "--block_size=1000000000"], 1, "lower --batch_size, --block_size"),
    (train, [*TRAIN, "--batch_size=10000000"], 1, "activations"),
    (train, [*TRAIN, "--n_embd=1048576"], 1, "lower --n_layer or --n_embd"),
    (train, [*TRAIN, "--grad_accum=1000000000"], 1, "lower --grad_accum"),
    (train, [*TRAIN, "--n_layer=100000", "--overwrite"], 1, "needs about"),
    (bench, ["--device=cpu", "--n_layer=100000"], 1, f"training {len(POS_SCHEMES)} x"),
    (bench, ["--device=cpu", "--train_steps=0", "--gen_multiples", "1000000000"], 1, "lower --gen_multiples"),
    (ab, ["--against=HEAD", "--new_tokens=100000000000"], 1, "KV cache", "lower --new_tokens"),
    (passkey_prepare, ["--train_samples=10000000000", "--name=never"], 2, "lower --train_samples"),
]


@pytest.mark.parametrize("script, argv, status, words", [(s, a, c, w) for s, a, c, *w in CASES])
def test_a_size_that_cannot_fit_is_one_line_before_any_allocation(
    script, argv, status, words, tmp_path, capsys, monkeypatch
):
    """Sizes of petabytes: one line naming the size and the flag to lower, the status, and no model built
    (GPT.__init__ never runs) nor dataset prepared."""
    monkeypatch.setattr(GPT, "__init__", never("GPT()"))
    monkeypatch.setattr(passkey_prepare, "prepare", never("prepare()"))
    argv = [*argv, f"--out_dir={tmp_path}/run"] if script is train else argv
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == status and "\n" not in err and "needs about" in err, err
    assert "error: " in err and all(word in err for word in words), err


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_a_model_not_yet_built_counts_the_tables_its_scheme_builds_at_block_size(pos, monkeypatch):
    """check_generation_memory(weights=True), for a model not built yet, counts beside its weights the tables
    a fresh GPT's scheme builds at block_size (RoPE's cos and sin, sinusoidal's), to the byte: built before
    any step, a block_size of 10**9 allocates tens of GB there."""
    config = GPTConfig.from_flat(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, pos=pos)
    parts = {}
    monkeypatch.setattr(memory, "check_memory", lambda counted, *args: parts.update(counted))
    memory.check_generation_memory(config, 1, 1, 4, "cpu", "lower --max_new_tokens", weights=True)
    built = GPT(config)
    tables = sum(b.nbytes for b in built.transformer.wpe.buffers() if b.dim() == 2)
    assert parts["position table at block_size"] == tables
    assert parts["weights"] == sum(p.nbytes for p in built.parameters())


def test_the_advice_says_when_the_model_itself_does_not_fit(monkeypatch):
    """Where the weights or the tables built at block_size are the most of it, no generation setting helps:
    the refusal gives model_advice instead of the flags to lower; otherwise those flags."""
    monkeypatch.setattr(hardware, "available_memory", lambda device: 10**6)
    huge = GPTConfig.from_flat(n_layer=1, n_head=2, n_embd=16, block_size=10**8, vocab_size=11, pos="rope")
    small = GPTConfig.from_flat(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, pos="rope")
    for config, n_new, advice in [(huge, 1, "another checkpoint"), (small, 10**6, "lower --max_new_tokens")]:
        with pytest.raises(UserError, match=advice):
            memory.check_generation_memory(
                config,
                1,
                1,
                n_new,
                "cpu",
                "lower --max_new_tokens",
                weights=True,
                model_advice="another checkpoint",
            )
