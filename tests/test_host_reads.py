"""No sampled token waits for the host: sample.py's decode loop (the static step a CUDA graph captures, forced
here on the CPU; sampled with temperature, top_k and top_p; streamed) reads the device a number of times that
grows by at most one per Streamer.chunk_tokens tokens; the draw that replaces torch.multinomial (which
synchronises on CUDA) is seeded and has multinomial's distribution; a logit that turns non-finite mid-way is
still one line naming the checkpoint."""

import math

import pytest
import torch
from helpers import TINY_RUN, error_line
from torch.utils._python_dispatch import TorchDispatchMode

import generation
import sample
import train
from model import draw, sample_next
from plumbing.checkpoint import checkpoint_path
from plumbing.tokenizers import CharTokenizer

# Operators that make the host wait for a GPU: a value read back (.item(), int(), bool()), a shape that
# depends on values (nonzero, masked_select), torch.multinomial (it checks its input on the host), and a
# tensor made from host data (a pageable copy to the GPU waits for the queue: a list used as an index).
HOST_WAITS = {
    "aten._local_scalar_dense.default",
    "aten.is_nonzero.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.multinomial.default",
    "aten.lift_fresh.default",
}


class HostReads(TorchDispatchMode):
    """Counts the HOST_WAITS operators dispatched inside it, and Tensor.tolist (no operator, a read all the
    same, patched while inside): names, one per read, in order."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __enter__(self):
        self.tolist = torch.Tensor.tolist
        torch.Tensor.tolist = lambda t: self.names.append("tolist") or self.tolist(t)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self.tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in HOST_WAITS:
            self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("run") / "rope"
    train.main([*TINY_RUN, "--pos=rope", f"--out_dir={out_dir}"])
    return out_dir


def host_reads(monkeypatch, checkpoint, new_tokens):
    """The host reads of sample.py's generation of new_tokens, sampled and streamed, the decode step the
    static one a CUDA graph captures (generation.captured_on forced), Streamer's time rule off."""
    monkeypatch.setattr(generation, "captured_on", lambda device: True)
    monkeypatch.setattr(sample, "captured_on", lambda device: True)
    monkeypatch.setattr(sample.Streamer, "chunk_seconds", math.inf)
    flags = ["--temperature=0.8", "--top_k=20", "--top_p=0.9", "--stream=on", "--device=cpu"]
    with HostReads() as reads:
        (loaded, samples, _) = sample.main(
            [f"--out_dir={checkpoint}", *flags, f"--max_new_tokens={new_tokens}"]
        )
    assert loaded.model.static_cache and len(samples[0]) == 1 + new_tokens  # the static step ran
    return reads.names


def test_host_reads_do_not_grow_with_the_tokens_beyond_one_per_chunk(monkeypatch, capsys, checkpoint):
    """Over 256 more sampled, streamed tokens, at most 256 / chunk_tokens more host reads (today's target: 16
    at most; 1,024 with a read per token): none in the step, none in the draw, one per streamed chunk."""
    short, long = (host_reads(monkeypatch, checkpoint, n) for n in (64, 320))
    more = len(long) - len(short)
    assert more <= 256 // sample.Streamer.chunk_tokens + 1 <= 16, (len(short), len(long), long)
    assert "aten.multinomial.default" not in long


def test_the_streamer_prints_as_often_as_its_clock_says_on_a_slow_model(capsys):
    """Where tokens come slower than chunk_seconds apart (a big model on a CPU), each is printed as it comes;
    the text is the batch's, marker included."""
    text = "ROMEO: what light through yonder window breaks?"
    tokenizer = CharTokenizer(sorted(set(text)))
    ids = tokenizer.encode(text)
    now = [0.0]

    def clock():
        now[0] += 1.0  # a second a token: past chunk_seconds every time
        return now[0]

    streamer = sample.Streamer(tokenizer, ids[:3], block_size=10, clock=clock)
    printed = [capsys.readouterr().out]
    for token in ids[3:]:
        streamer(torch.tensor([[token]]))
        printed.append(capsys.readouterr().out)
    streamer.close()
    assert all(printed[1:]), "a token waited for a chunk although its second had passed"
    assert "".join(printed) + capsys.readouterr().out == sample.mark_trained_length(tokenizer, ids, 10)


def test_seeded_sampling_is_reproducible_and_temperature_zero_is_the_argmax():
    """The same seed gives the same draws through sample_next (top_k, top_p and all); another seed others;
    temperature 0 is the argmax."""
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(torch.cat([sample_next(logits, 0.9, top_k=20, top_p=0.95) for _ in range(20)], 1))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    assert torch.equal(sample_next(logits, temperature=0), logits.argmax(-1, keepdim=True))


def test_the_draw_has_multinomials_distribution():
    """draw (the argmax of p / Exp(1) noise) picks token i with probability p_i: frequencies over 40,000 rows
    within 5 standard errors of p, a token of probability 0 never (float64 probabilities)."""
    torch.manual_seed(0)
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0], dtype=torch.float64)
    picks = draw(p.expand(40_000, -1)).flatten()
    freq = torch.bincount(picks, minlength=5).double() / picks.numel()
    tolerance = 5 * (p * (1 - p) / picks.numel()).sqrt()
    assert ((freq - p).abs() <= tolerance).all(), freq
    assert freq[4] == 0


def test_logits_that_turn_non_finite_mid_generation_are_one_line(monkeypatch, capsys, checkpoint):
    """A decode step whose logits turn NaN after a few tokens (the prefill's are finite): the flag kept on
    the device, read once at the end, makes it one line naming the checkpoint, status 1, streamed or not."""
    forward = generation.cached_forward

    def turning_nan(model, idx, input_pos, seq_len=None):
        logits = forward(model, idx, input_pos, seq_len)
        return logits if input_pos.numel() > 1 or int(input_pos[0]) < 5 else logits * math.nan

    monkeypatch.setattr(generation, "cached_forward", turning_nan)
    for stream in ("on", "off"):
        argv = [f"--out_dir={checkpoint}", "--max_new_tokens=12", f"--stream={stream}", "--device=cpu"]
        err = error_line(capsys, sample, argv, 1)
        named = (
            f"{checkpoint_path(checkpoint)}: the model's logits are not finite (NaN or inf) while generating"
        )
        assert err.endswith(
            named + ("" if err.endswith("generating") else err[err.index(named) + len(named) :])
        )
        assert named in err


def test_the_draw_gives_torch_multinomials_tokens_for_a_seed_on_the_cpu():
    """torch.multinomial draws one sample by the same exponential race on the CPU: for a seed, draw gives its
    very tokens, so a seed's text from before the change is the same text (docs/usage.md's samples)."""
    for seed in range(5):
        probs = torch.softmax(torch.randn(64, 65, generator=torch.Generator().manual_seed(seed)), dim=-1)
        torch.manual_seed(seed)
        expected = torch.multinomial(probs, num_samples=1)
        torch.manual_seed(seed)
        assert torch.equal(draw(probs), expected)
