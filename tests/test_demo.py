"""The demonstrations (python -m lab.demo.permutation, python -m lab.demo.probe), the instruments behind them
and the figures (lab/measure/instruments.py): each instrument reads the model's own modules, so each is
checked against the model's own output; and how lab/experiments/runs.py decides to reuse, continue or refuse a
trained run.

Tiny random models in float64 wherever exactness is the point; fixed seeds."""

import importlib.util
import os
import signal

import pytest
import torch
from helpers import error_line

import train
from lab.demo import figures, permutation, probe
from lab.experiments import runs
from lab.measure import instruments
from model import GPT, GPTConfig
from plumbing.errors import UserError
from plumbing.tokenizers import CharTokenizer, GPT2Tokenizer
from positions import POS_SCHEMES, POSITION_MODULES, PositionScheme, overrides

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
PNG = b"\x89PNG\r\n\x1a\n"
LETTERS = CharTokenizer("\nabcdefghijklmnopqrstuvwxyz ")  # 28 characters: enough for "dog bites man"


def tiny_model(pos, seed=0, **overrides):
    torch.manual_seed(seed)
    fields = dict(
        block_size=16,
        vocab_size=LETTERS.vocab_size,
        n_layer=2,
        n_head=2,
        n_embd=16,
        dropout=0.0,
        bias=False,
        pos=pos,
    )
    return GPT(GPTConfig.from_flat(**(fields | overrides))).double().eval()


def worst(rows):
    return max(max(row) for row in rows)


# -----------------------------------------------------------------------------
# python -m lab.demo.permutation


def test_without_positions_or_mask_the_swapped_sentence_gives_the_same_states_up_to_the_swap():
    """NoPE with the mask off: every hidden state of 'man bites dog', reordered, is that of 'dog bites man'
    (float64 rounding only): attention alone is permutation equivariant, and so is the whole model."""
    rows, text, swapped = permutation.compare(tiny_model("none"), LETTERS, "dog bites man", mask=False)
    assert (text, swapped) == ("dog bites man", "man bites dog")
    assert len(rows) == 3  # the embedding output and two blocks
    assert worst(rows) < 1e-12


def test_the_causal_mask_alone_tells_the_swapped_sentences_apart():
    """With the mask NoPE's states differ: 'dog' at position 0 sees only itself,
    at position 10 the whole sentence."""
    rows, _, _ = permutation.compare(tiny_model("none"), LETTERS, "dog bites man", mask=True)
    assert rows[0] == (0.0, 0.0)  # the embedding carries no position
    assert rows[-1][0] > 1e-6 and rows[-1][1] > 1e-6


@pytest.mark.parametrize(
    "pos",
    [
        p
        for p in POS_SCHEMES
        if any(overrides(POSITION_MODULES[p], h) for h in ("embed", "rotation", "score_bias"))
    ],
)
def test_every_position_scheme_tells_the_swapped_sentences_apart_even_without_the_mask(pos):
    """Each scheme breaks the symmetry by itself. The additive ones already in the embedding, at the swapped
    words only (the unchanged tokens keep their positions); RoPE and ALiBi only inside attention."""
    rows, _, _ = permutation.compare(tiny_model(pos), LETTERS, "dog bites man", mask=False)
    assert rows[-1][0] > 1e-6
    additive = POSITION_MODULES[pos].embed is not PositionScheme.embed
    assert (rows[0][0] > 0) == additive and rows[0][1] == 0.0


@pytest.mark.skipif(
    not os.environ.get("TIKTOKEN_CACHE_DIR"), reason="GPT-2 BPE needs tiktoken's cached files"
)
def test_with_gpt2_bpe_the_swap_is_a_permutation_of_the_real_tokens():
    """GPT-2 BPE makes ' dog' one token and 'dog' another: with a leading space on every word the pieces are
    alike, and 'man bites dog' tokenizes to the same tokens as 'dog bites man' with the words exchanged."""
    tokenizer = GPT2Tokenizer()
    first, middle, last = permutation.pieces(tokenizer, "dog bites man")
    assert first + middle + last == tokenizer.encode(" dog bites man")
    assert last + middle + first == tokenizer.encode(" man bites dog")


# -----------------------------------------------------------------------------
# The instruments


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_hidden_states_are_the_residual_stream_the_logits_come_from(pos):
    """The last hidden state through ln_f and the head gives the model's logits:
    the hooks read the real stream."""
    model = tiny_model(pos)
    idx = torch.randint(0, LETTERS.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    states = instruments.hidden_states(model, idx)
    assert len(states) == model.config.n_layer + 1
    logits, _ = model(idx)
    torch.testing.assert_close(model.lm_head(model.transformer.ln_f(states[-1])), logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_without_the_mask_the_first_token_sees_the_last(pos):
    """instruments.unmasked really removes the mask: changing the last token changes the first token's states
    only then."""
    model = tiny_model(pos)
    idx = torch.randint(1, LETTERS.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    changed = idx.clone()
    changed[0, -1] = 0
    for mask, should_change in ((True, False), (False, True)):
        first = instruments.hidden_states(model, idx, mask)[-1][0, 0]
        first_changed = instruments.hidden_states(model, changed, mask)[-1][0, 0]
        assert (not torch.allclose(first, first_changed, rtol=0, atol=1e-12)) == should_change, mask


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_attention_probabilities_reproduce_the_layers_output(pos):
    """softmax(q k^T / sqrt(hs) + bias) recomputed from the layer's own weights, times v, through c_proj, is
    the attention output the model computed: the attention maps are the model's, not a second model's."""
    model = tiny_model(pos)
    idx = torch.randint(0, LETTERS.vocab_size, (2, 16), generator=torch.Generator().manual_seed(3))
    layer = 1
    attn = model.transformer.h[layer].attn
    seen = []
    handle = attn.register_forward_hook(lambda module, args, out: seen.append(out))
    probs = instruments.attention_probabilities(model, idx, layer)
    handle.remove()
    x = instruments.attention_inputs(model, idx, layer)["x"]
    C = x.size(-1)
    v = instruments.split_heads(attn.c_attn(x).split(C, dim=2)[2], attn.n_head)
    y = (probs @ v).transpose(1, 2).reshape(x.shape)
    torch.testing.assert_close(attn.c_proj(y), seen[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, 16, dtype=torch.float64), rtol=0, atol=1e-12)
    assert probs.triu(1).abs().max() == 0  # causal


def test_the_four_qk_terms_add_up_to_the_scores():
    """token-token + token-position + position-token + position-position = q k^T of layer 1's head, exactly:
    ln_1 is split with the statistics of the sum, which makes it linear in the two parts."""
    model = tiny_model("learned")
    idx = torch.randint(0, LETTERS.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4))
    terms = instruments.qk_terms(model, idx, head=1)
    assert set(terms) == {"token-token", "token-position", "position-token", "position-position"}
    x = instruments.attention_inputs(model, idx, 0)["x"][0]
    q, k, _ = model.transformer.h[0].attn.c_attn(x).split(16, dim=1)
    head = slice(8, 16)
    torch.testing.assert_close(sum(terms.values()), q[:, head] @ k[:, head].T, rtol=0, atol=1e-12)


# -----------------------------------------------------------------------------
# python -m lab.demo.probe


def test_probe_targets_count_back_to_the_latest_newline():
    """Distance to the latest newline at or before each token;
    unknown (NaN) before the window's first newline."""
    windows = torch.tensor([[5, 0, 5, 5, 0, 5]])  # 0 is the newline
    position, distance = instruments.probe_targets(windows, newline_id=0)
    assert position[0].tolist() == [0, 1, 2, 3, 4, 5]
    assert distance[0, 0].isnan() and distance[0, 1:].tolist() == [0, 1, 2, 0, 1]


def probe_windows(n=256, T=16, seed=5):
    return torch.randint(0, LETTERS.vocab_size, (n, T), generator=torch.Generator().manual_seed(seed))


def test_probe_gives_one_r2_per_hidden_state_and_its_shuffled_baseline_is_near_zero():
    """A learned table is linearly readable at the embedding, even untrained: its 16 random rows and the 28
    token vectors are linearly independent in 64 dimensions, so R^2 is ~1. The same probe fit on shuffled
    positions explains nothing of the held-out positions."""
    model = tiny_model("learned", n_embd=64)
    result = instruments.probe_positions(model, probe_windows(), newline_id=0)
    for target in ("position", "newline"):
        assert len(result[target]) == model.config.n_layer + 1
    r2, _ = result["position"][0]
    assert r2 > 0.99
    assert all(abs(baseline) < 0.1 for _, baseline in result["position"])  # chance: ~2/sqrt(n) here


def test_without_the_mask_nope_hidden_states_hold_no_position():
    """Unmasked NoPE sees a set: a token's state depends on its own token and on the whole window, never on
    where it stands, so no probe can read its position (R^2 <= ~0 on held-out windows, at every layer)."""
    result = instruments.probe_positions(
        tiny_model("none", n_embd=32), probe_windows(), newline_id=0, mask=False
    )
    assert all(r2 < 0.05 for r2, _ in result["position"]), result["position"]


def test_permutation_flag_pos_none_means_the_nope_scheme():
    """--pos=none is the scheme called none, not a missing value
    (a `str | None` flag would read it as None)."""
    assert permutation.parse_args(["--pos=none", "--no_mask"]).pos == "none"
    assert permutation.parse_args([]).pos == "all"


def refusal(flag, path):
    return (
        f"--{flag}={path}: that file exists and is no earlier output of this command (not a .png image); "
        "give another file, or add --replace to replace it"
    )


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="figures need matplotlib")
def test_probe_figure_replaces_a_figure_this_command_drew_and_no_other_unless_replace(
    tmp_path, capsys, monkeypatch
):
    """A file of the user's at --figure (text named .png) is refused in one line before any model is read, and
    kept; --replace replaces it; the command's own figure is replaced again without a flag (a new file, not
    the old one written over); --replace without --figure is a usage error. The probes are stubbed: the files
    are the point."""
    notes, none = tmp_path / "notes.png", f"--checkpoints={tmp_path / 'none'}"  # no runs: none is read
    notes.write_text("not a picture\n")
    assert error_line(capsys, probe, [none, f"--figure={notes}"], 1).endswith(refusal("figure", notes))
    assert notes.read_text() == "not a picture\n"
    r2 = {"position": [(0.9, 0.01), (0.5, -0.02)], "newline": [(0.3, 0.0), (0.2, 0.01)]}
    monkeypatch.setattr(probe, "run_probes", lambda cfg: {"rope": r2})
    probe.main([f"--figure={notes}", "--replace"])
    assert notes.read_bytes().startswith(PNG)
    own = tmp_path / "probe.png"
    probe.main([f"--figure={own}"])
    first = own.stat().st_ino
    probe.main([f"--figure={own}"])
    assert own.read_bytes().startswith(PNG) and own.stat().st_ino != first
    capsys.readouterr()
    err = error_line(capsys, probe, ["--replace"], 2)
    assert err.endswith("--replace applies to --figure only: leave it out, or give --figure"), err


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="figures need matplotlib")
def test_figures_replace_the_pngs_this_command_drew_and_no_other_file_unless_replace(tmp_path, capsys):
    """Every file a figure writes is checked before any work (attention's second file too): a file of the
    user's under a figure's name is refused in one line, nothing drawn, and kept; --replace replaces it; a
    rerun replaces the command's own PNGs (a new file each)."""
    out, none = tmp_path / "figs", f"--checkpoints={tmp_path / 'none'}"  # no runs: none is read
    out.mkdir()
    mine = out / "attention_distance.png"
    mine.write_text("my notes\n")
    argv = ["--only=sinusoidal,attention", f"--out={out}", none]
    assert error_line(capsys, figures, argv, 1).endswith(refusal("out", mine))
    assert mine.read_text() == "my notes\n" and not (out / "sinusoidal.png").exists()
    mine.rename(out / "sinusoidal.png")
    assert error_line(capsys, figures, ["--only=sinusoidal", f"--out={out}"], 1).endswith(
        refusal("out", out / "sinusoidal.png")
    )
    figures.main(["--only=sinusoidal", f"--out={out}", "--replace"])
    first = (out / "sinusoidal.png").stat().st_ino
    assert (out / "sinusoidal.png").read_bytes().startswith(PNG)
    figures.main(["--only=sinusoidal", f"--out={out}"])
    assert (out / "sinusoidal.png").stat().st_ino != first


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="figures need matplotlib")
def test_figures_runs_the_probe_over_its_own_figure_and_passes_replace_on(tmp_path, monkeypatch):
    """lab.demo.figures draws probe.png through python -m lab.demo.probe --figure: a rerun over its PNG needs
    no flag (the probe takes it for its own), and figures' --replace reaches the probe, whose own check would
    refuse the user's file that figures' --replace allowed."""
    commands = []
    monkeypatch.setattr(figures, "model_dirs", lambda *args, **kwargs: {})
    monkeypatch.setattr(figures, "run_python", commands.append)
    (tmp_path / "probe.png").write_text("my notes\n")
    figures.main(["--only=probe", f"--out={tmp_path}", "--replace"])
    (tmp_path / "probe.png").write_bytes(PNG)
    figures.main(["--only=probe", f"--out={tmp_path}"])
    figure = f"--figure={tmp_path.resolve() / 'probe.png'}"
    assert commands == [["-m", "lab.demo.probe", figure, "--replace"], ["-m", "lab.demo.probe", figure]]


# -----------------------------------------------------------------------------
# lab/experiments/runs.py: which trained run the demos, the figures and the study use

TINY_RUN = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=4",
    "--eval_iters=2",
    "--eval_interval=2",
    "--log_interval=1",
    "--max_iters=2",
    "--device=cpu",
    "--compile=false",
]


def stopped_by_ctrl_c(argv):
    """train.main(argv) with a Ctrl-C (SIGINT) in its first training step's forward pass (after step 0's
    evaluation): train.py finishes the step, saves ckpt.pt and stops, before max_iters."""

    def ctrl_c(module, args, output):
        if module.training:
            handle.remove()
            signal.raise_signal(signal.SIGINT)

    handle = torch.nn.modules.module.register_module_forward_hook(ctrl_c)
    try:
        return train.main(argv)
    finally:
        handle.remove()


def test_a_finished_run_is_reused_a_stopped_one_continued_and_another_run_refused(tmp_path):
    """runs.decide reads a folder's ckpt.pt against what the command will train (train.py's own reading of its
    flags): a finished run is reused, one stopped before its max_iters is continued with --resume, an empty
    folder is trained, and a run of another pos or model shape is a one-line error naming the folder."""
    finished, stopped = tmp_path / "finished", tmp_path / "stopped"
    assert train.main([*TINY_RUN, f"--out_dir={finished}"])["iter_num"] == 2
    assert stopped_by_ctrl_c([*TINY_RUN, f"--out_dir={stopped}"])["stopped"] == "SIGINT"
    commands = [[*TINY_RUN, f"--out_dir={folder}"] for folder in (finished, stopped, tmp_path / "empty")]
    commands += [[*TINY_RUN, f"--out_dir={finished}", flag] for flag in ("--pos=alibi", "--n_embd=32")]
    reuse, resume, empty, other_pos, other_shape = runs.plan(commands)
    assert runs.decide(reuse) == ("reuse", 2)
    assert runs.decide(resume) == ("resume", 1)
    assert runs.decide(empty) == ("train", None)
    for plan, words in ((other_pos, "(pos rope, not alibi)"), (other_shape, "(n_embd 16, not 32)")):
        with pytest.raises(UserError) as error:
            runs.decide(plan, elsewhere="move it away")
        message = str(error.value)
        assert message.startswith(f"{finished} holds another run") and words in message, message
        assert "\n" not in message and message.endswith("move it away")


@pytest.mark.parametrize("demo", ["permutation", "probe"])
def test_a_demo_blocked_by_another_run_names_the_flags_it_offers_instead(demo, monkeypatch, capsys):
    """An out_dir holding a run of other settings: the refusal names what that demo takes instead, and only
    that (lab.demo.permutation has --checkpoint=DIR, lab.demo.probe only --checkpoints=DIR)."""

    def another_run(plan, elsewhere):
        raise UserError(f"{plan.out_dir} holds another run than `{plan.command}`: {elsewhere}")

    monkeypatch.setattr(runs, "decide", another_run)
    module = __import__(f"lab.demo.{demo}", fromlist=["main"])
    with pytest.raises(SystemExit) as stopped:
        module.main([])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and err.count("\n") == 1, err
    assert "--checkpoints=DIR (a folder of runs)" in err
    assert ("--checkpoint=DIR (one trained run)" in err) == (demo == "permutation"), err
