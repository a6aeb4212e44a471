"""The static decode step a CUDA graph captures (generation.CUDAGraphStep): on any machine it runs eagerly and
gives the eager cache's logits at every step, for every scheme and RoPE scaling; the operators it launches
meet their targets; on CUDA (skipped elsewhere) the captured graph gives the eager tokens."""

import random

import pytest
import torch

import generation
from lab.perf.ops import RECIPE_SHAPE, decode_step_ops
from model import GPT, GPTConfig
from positions import POS_SCHEMES, POSITION_MODULES, ROPE_SCALINGS, overrides, takes

BLOCK = 16
ROTATING = [pos for pos in POS_SCHEMES if takes(POSITION_MODULES[pos], "rope_scaling")]  # RoPE's settings
on_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def tiny_model(pos, **overrides):
    torch.manual_seed(0)
    fields = dict(block_size=BLOCK, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0, pos=pos)
    return GPT(GPTConfig.from_flat(**fields | overrides)).eval()


def longrope_fields(seed=7):
    """rope_scaling=longrope with random factors (4 pairs at n_embd 16, 2 heads) and n-hat 2."""
    rng = random.Random(seed)
    short, long = [sorted(1 + rng.random() * (top - 1) for _ in range(4)) for top in (1.5, 8.0)]
    return dict(rope_scaling="longrope", rope_short_factor=short, rope_long_factor=long, rope_keep_first=2)


def logits_per_step(monkeypatch, model, prompt, n, **how):
    """generate_cached's greedy tokens and the logits it samples each token from, through its real loop."""
    seen = []
    monkeypatch.setattr(
        generation, "sample_next", lambda logits, *a: seen.append(logits) or logits.argmax(-1, True)
    )
    out = generation.generate_cached(model, prompt, n, temperature=0, **how)
    return out, torch.stack(seen)


def assert_static_step_is_eager(monkeypatch, model, prompt, n, **how):
    eager, eager_logits = logits_per_step(monkeypatch, model, prompt, n, cuda_graph=False, **how)
    static, static_logits = logits_per_step(monkeypatch, model, prompt, n, cuda_graph=True, **how)
    assert model.static_cache  # the run above decoded with the static step, over every slot
    torch.testing.assert_close(static_logits, eager_logits, rtol=0, atol=1e-5)
    assert torch.equal(static, eager)


@pytest.mark.parametrize("pos", POS_SCHEMES)
@pytest.mark.parametrize("max_context", [None, 7])
def test_the_static_step_gives_the_eager_logits_at_every_step_past_block_size(monkeypatch, pos, max_context):
    """The step a CUDA graph captures (every cache slot attended, the mask computed from the position tensor)
    run eagerly: the eager cache's logits at every one of 4 x block_size steps, to 1e-5 in float32, with and
    without a sliding window; a scheme with a length limit (learned's table) slides its window past it, as
    the eager path does."""
    model = tiny_model(pos)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(1))
    assert_static_step_is_eager(monkeypatch, model, prompt, 4 * BLOCK, max_context=max_context)


@pytest.mark.parametrize("pos", ROTATING)
@pytest.mark.parametrize("scaling", [s for s in ROPE_SCALINGS if s != "dynamic"] + ["longrope"])
def test_the_static_step_gives_the_eager_logits_under_every_rope_scaling(monkeypatch, pos, scaling):
    """Each static RoPE scaling, LongRoPE across its switch (a prompt shorter than T, its cached keys rotated
    anew once the sequence passes T, and the captured step reading the re-encoded caches after it)."""
    fields = longrope_fields() if scaling == "longrope" else dict(rope_scaling=scaling)
    model = tiny_model(pos, rope_factor=4.0, **fields)
    assert model.transformer.wpe.step_varies is None
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(2))
    assert_static_step_is_eager(monkeypatch, model, prompt, 3 * BLOCK)


def test_a_scheme_whose_step_varies_with_the_length_decodes_eagerly(monkeypatch):
    """Dynamic NTK recomputes its frequencies from the length in Python at every step: asked for a CUDA graph,
    generation decodes eagerly (sample.py says so in one line), and compile refuses it."""
    model = tiny_model("rope", rope_scaling="dynamic", rope_factor=4.0)
    assert "dynamic" in model.transformer.wpe.step_varies
    assert generation.decode_mode(model, "cuda", cuda_graph=True) == "eager"
    prompt = torch.zeros(1, 3, dtype=torch.long)
    out, _ = logits_per_step(monkeypatch, model, prompt, 2 * BLOCK, cuda_graph=True)
    assert not model.static_cache
    assert torch.equal(out, model.generate(prompt, 2 * BLOCK, temperature=0))
    with pytest.raises(ValueError, match="dynamic.*compile=False"):
        generation.decode_mode(model, "cpu", compile=True)


def test_decoding_is_captured_by_default_on_cuda_only():
    """cuda_graph=None: a CUDA graph on CUDA, eager elsewhere; False is the escape hatch; compile wins."""
    model = tiny_model("rope")
    assert generation.decode_mode(model, "cuda") == "cuda_graph"
    assert generation.decode_mode(model, "cuda:1") == "cuda_graph"
    assert generation.decode_mode(model, "cpu") == generation.decode_mode(model, "mps") == "eager"
    assert generation.decode_mode(model, "cuda", cuda_graph=False) == "eager"
    assert generation.decode_mode(model, "cuda", compile=True) == "compiled"


def test_seeded_sampling_through_the_static_step_gives_the_eager_samples():
    """Sampling (temperature, top-k, top-p) runs outside the step, on the same logits: the same seed gives
    the eager path's samples."""
    model = tiny_model("alibi")
    prompt = torch.zeros(3, 1, dtype=torch.long)
    samples = []
    for cuda_graph in (False, True):
        torch.manual_seed(5)
        samples.append(generation.generate_cached(model, prompt, 30, 0.9, 10, 0.9, cuda_graph=cuda_graph))
    assert torch.equal(*samples)


def test_every_schemes_decode_step_meets_its_operator_target():
    """At the shakespeare_char recipe's shape (6 layers), the operators one decode step launches (views left
    out): RoPE at most 4 a layer more than learned (its roll, two products and a sum; the tables indexed once
    per forward, in their final form), every other scheme at most 15 more (its bias, once per forward)."""
    counts = {pos: len(decode_step_ops(GPTConfig.from_flat(**RECIPE_SHAPE, pos=pos))) for pos in POS_SCHEMES}
    learned, layers = counts["learned"], RECIPE_SHAPE["n_layer"]
    for pos, count in counts.items():
        allowed = learned + (4 * layers if overrides(POSITION_MODULES[pos], "rotation") else 15)
        assert count <= allowed, f"{pos}: {count} operators a decode step, the target {allowed} ({counts})"


def test_the_operator_count_sees_a_layers_work():
    """The counter can fail: one more layer is more operators, and every layer's RoPE shows."""
    shape = RECIPE_SHAPE | dict(n_layer=2)
    two, three = (
        len(decode_step_ops(GPTConfig.from_flat(**shape | dict(n_layer=n), pos="rope"))) for n in (2, 3)
    )
    assert three > two
    assert decode_step_ops(GPTConfig.from_flat(**shape, pos="rope")).count("aten.roll.default") == 2


# -----------------------------------------------------------------------------
# On CUDA: the captured graph, replayed once a token


GPUS = [f"cuda:{i}" for i in range(2)]


def replayed(monkeypatch):
    """The CUDAGraphSteps generate_cached makes from here on (their replays counted), in a list."""
    steps, decode_step = [], generation.decode_step
    monkeypatch.setattr(generation, "decode_step", lambda *a: steps.append(decode_step(*a)) or steps[-1])
    return steps


@on_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("device", GPUS)
@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_cuda_graph_is_captured_on_the_models_gpu_replayed_and_gives_the_eager_tokens(
    monkeypatch, pos, device, dtype
):
    """On the model's own GPU (cuda:1 too, the current device left at cuda:0) a graph is captured and
    replayed once a decode step (the replays counted), and its greedy tokens are the eager cache's: in
    float32 against the eager step, in bfloat16 against the same static step run eagerly (the eager step's
    other shapes round otherwise in bfloat16)."""
    if torch.device(device).index >= torch.cuda.device_count():
        pytest.skip(f"needs {device}")
    model = tiny_model(pos).to(device).cast_weights(dtype)
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(3)).to(device)
    if dtype == "float32":
        eager = generation.generate_cached(model, prompt, 4 * BLOCK, temperature=0, cuda_graph=False)
    else:
        with monkeypatch.context() as patched:
            patched.setattr(generation, "CUDAGraphStep", lambda step: step)
            eager = generation.generate_cached(model, prompt, 4 * BLOCK, temperature=0, cuda_graph=True)
    steps = replayed(monkeypatch)
    assert torch.equal(generation.generate_cached(model, prompt, 4 * BLOCK, temperature=0), eager)
    (step,) = steps
    assert isinstance(step, generation.CUDAGraphStep) and step.graph is not None
    decoded = 4 * BLOCK - 1  # a step per new token but the last; learned's sliding window runs none
    assert step.replays == decoded if model.length_limit is None else 0 < step.replays < decoded


@on_cuda
def test_cuda_graph_across_longropes_switch_and_with_a_window():
    model = tiny_model("rope", rope_factor=4.0, **longrope_fields()).cuda()
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(4)).cuda()
    for how in (dict(), dict(max_context=7)):
        eager = generation.generate_cached(model, prompt, 3 * BLOCK, temperature=0, cuda_graph=False, **how)
        assert torch.equal(generation.generate_cached(model, prompt, 3 * BLOCK, temperature=0, **how), eager)


@on_cuda
def test_cuda_graph_seeded_sampling_is_reproducible():
    model = tiny_model("rope").cuda()
    prompt = torch.zeros(3, 1, dtype=torch.long, device="cuda")
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        runs.append(generation.generate_cached(model, prompt, 40, temperature=0.9, top_k=10, top_p=0.9))
    assert torch.equal(*runs)


@on_cuda
def test_cuda_compiled_decoding_is_captured_and_gives_the_eager_tokens():
    torch.compiler.reset()
    model = tiny_model("rope").cuda()
    prompt = torch.randint(0, 32, (1, 3), generator=torch.Generator().manual_seed(5)).cuda()
    eager = generation.generate_cached(model, prompt, 2 * BLOCK, temperature=0, cuda_graph=False)
    assert torch.equal(
        generation.generate_cached(model, prompt, 2 * BLOCK, temperature=0, compile=True), eager
    )
