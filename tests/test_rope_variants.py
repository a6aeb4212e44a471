"""The RoPE variants released models ship, each against Hugging Face transformers where it has one (the parity
tests skip without it): Llama 3's frequency scaling (rope_scaling="llama3", its parity test in
tests/test_rope_scaling.py). The rest run on the model's own functions, tiny shapes and fixed seeds.
"""

import math
from pathlib import Path

import pytest
import torch

import sample
import train
from helpers import error_line
from model import GPT, GPTConfig, llama3_inv_freq, rope_frequencies, rope_inv_freq
from plumbing.checkpoint import load_checkpoint

BLOCK = 16


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, pos="rope")
    return GPT(GPTConfig(**fields | overrides)).eval()


def uniform(low, high, generator):
    return float(torch.empty(()).uniform_(low, high, generator=generator))


# -----------------------------------------------------------------------------
# Llama 3's frequencies (rope_inv_freq and yarn_ramp: tests/test_exercise_properties.py)


@pytest.mark.parametrize("seed", range(5))
def test_llama3_keeps_fast_pairs_divides_slow_ones_and_blends_between(seed):
    """Each theta'_i lies between theta_i / s and theta_i; exactly theta_i where the pair turns more than
    high_freq_factor times over T, exactly theta_i / s where it turns fewer than low_freq_factor times; theta'
    still falls with i (no pair overtakes a faster one); and s = 1 changes nothing."""
    g = torch.Generator().manual_seed(seed)
    dim, T = 2 * int(torch.randint(2, 65, (), generator=g)), int(torch.randint(16, 8193, (), generator=g))
    s, low = uniform(1.5, 32.0, g), uniform(0.25, 2.0, g)
    high = low + uniform(0.5, 16.0, g)
    theta = rope_inv_freq(dim, 10000.0)
    scaled = llama3_inv_freq(theta, s, low, high, T)
    turns = T * theta / (2 * math.pi)
    assert (scaled <= theta * (1 + 1e-12)).all() and (scaled >= theta / s * (1 - 1e-12)).all()
    assert torch.equal(scaled[turns > high], theta[turns > high])
    assert torch.equal(scaled[turns < low], theta[turns < low] / s)
    assert (scaled[1:] < scaled[:-1]).all()
    torch.testing.assert_close(llama3_inv_freq(theta, 1.0, low, high, T), theta, rtol=1e-15, atol=0)


def test_llama3_worked_case_d32_t64():
    """rope_frequencies' worked case, by hand: d = 32, T = 64, s = 4, low 1, high 4, base 10^4. Pair i has
    wavelength 2 pi 10^(i/4) and turns r_i = 64 / (2 pi 10^(i/4)) times over T: 10.19, 5.73, 3.22, 1.81, 1.019,
    0.573, ... So pairs 0, 1 are kept (r > 4), pairs 2, 3, 4 blended with smooth = (r - 1) / 3 = 0.7404, 0.2704,
    0.0062, theta' / theta = 1/4 + 3/4 smooth = 0.8053, 0.4528, 0.2546, and pairs 5 to 15 divided by 4 (r < 1)."""
    turns = [64 / (2 * math.pi * 10 ** (i / 4)) for i in range(16)]
    assert [round(r, 3) for r in turns[:6]] == [10.186, 5.728, 3.221, 1.811, 1.019, 0.573]
    kept, blended, divided = [0, 1], [2, 3, 4], list(range(5, 16))
    assert [i for i, r in enumerate(turns) if r > 4] == kept and [i for i, r in enumerate(turns) if r < 1] == divided
    smooth = [(turns[i] - 1) / 3 for i in blended]
    assert [round(x, 4) for x in smooth] == [0.7404, 0.2704, 0.0062]
    ratio = [1.0, 1.0] + [0.25 + 0.75 * x for x in smooth] + [0.25] * 11
    assert [round(x, 4) for x in ratio[2:5]] == [0.8053, 0.4528, 0.2546]
    theta = rope_inv_freq(32)
    inv_freq, scale = rope_frequencies(32, scaling="llama3", factor=4.0, original_len=64)
    torch.testing.assert_close(inv_freq.double(), theta * torch.tensor(ratio, dtype=torch.float64), rtol=1e-6, atol=0)
    assert scale == 1.0
    assert torch.equal(inv_freq[kept], theta[kept].float())
    assert torch.equal(inv_freq[divided], (theta[divided] / 4).float())


# -----------------------------------------------------------------------------
# Flags, errors and checkpoints

TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", f"--block_size={BLOCK}", "--batch_size=4", "--max_iters=2",
        "--eval_interval=2", "--eval_iters=1", "--log_interval=1", "--device=cpu", "--compile=false"]


@pytest.mark.parametrize("argv, words", [
    (["--rope_low_freq_factor=2"], ["llama3's frequency factors", "give rope_scaling=llama3"]),
    (["--rope_scaling=llama3", "--rope_low_freq_factor=4"], ["need 0 < low < high"]),
    (["--pos=sinusoidal", "--rope_high_freq_factor=8"], ["only RoPE takes rope_high_freq_factor=8.0"]),
])
def test_bad_rope_variant_flags_are_one_line_errors(capsys, argv, words):
    """train.py refuses each bad value before any work, in one line naming what is valid."""
    err = error_line(capsys, train, [*TINY, *argv], 2)
    assert all(w in err for w in words), err


@pytest.mark.parametrize("argv, words", [
    (["--rope_low_freq_factor=2"], ["shape llama3's blend: give --rope_scaling=llama3"]),
    (["--rope_scaling=yarn", "--rope_high_freq_factor=8"], ["give --rope_scaling=llama3"]),
    (["--rope_scaling=cubic"], ["'yarn', 'llama3'"]),
])
def test_bad_sample_flags_are_one_line_errors(capsys, argv, words):
    err = error_line(capsys, sample, argv, 2)
    assert all(w in err for w in words), err


def test_a_checkpoint_older_than_the_variants_loads_as_plain_rope():
    """A model_config without the new fields (tests/fixtures: written at 491106f) reads back with plain RoPE's
    values for them, so it builds the model it was and resuming compares like with like (tests/test_cli.py
    resumes it)."""
    fixture = Path(__file__).parent / "fixtures" / "ckpt_491106f_rope.pt"
    raw = torch.load(fixture, weights_only=True)["model_config"]
    assert "rope_low_freq_factor" not in raw
    config = load_checkpoint(fixture)["model_config"]
    assert config == raw | dict(rope_low_freq_factor=1.0, rope_high_freq_factor=4.0)
    assert GPTConfig(**config).rope_scaling is None
