"""torch.compile without graph breaks for every position scheme, and the precision each device trains in.

A graph break splits the compiled model into pieces run by Python in between: slower on GPU, and a sign of
data-dependent control flow. fullgraph=True turns any break into an error. The "eager" backend traces with
TorchDynamo exactly as inductor does but skips code generation, so the check costs ~1 s per scheme on a CPU.
"""

import pytest
import torch

import train
from model import GPT, GPTConfig
from plumbing import checkpoint, hardware, resume
from positions import POS_SCHEMES

TINY = dict(block_size=16, vocab_size=65, n_layer=1, n_head=2, n_embd=16)


def model_and_batch(pos, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_flat(**TINY, pos=pos))
    x, y = torch.randint(65, (2, 16)), torch.randint(65, (2, 16))
    return model, x, y


def loss_and_grads(model, x, y, run=None):
    """Loss of (run or model)(x, y) and the gradients it leaves on model's parameters."""
    model.zero_grad(set_to_none=True)
    _, loss = (model if run is None else run)(x, y)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_compiled_model_has_no_graph_breaks(pos):
    """Every scheme's forward and backward compile as one graph (fullgraph=True) and agree with eager mode."""
    torch.compiler.reset()
    model, x, y = model_and_batch(pos)
    eager_loss, eager_grads = loss_and_grads(model, x, y)
    compiled_loss, compiled_grads = loss_and_grads(
        model, x, y, torch.compile(model, backend="eager", fullgraph=True)
    )
    torch.testing.assert_close(compiled_loss, eager_loss)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, msg=name)


def test_inductor_compiles_a_tiny_rope_model():
    """One real inductor compile (C++ generated and built on the CPU): loss and gradients match eager mode."""
    torch.compiler.reset()
    model, x, y = model_and_batch("rope")
    eager_loss, eager_grads = loss_and_grads(model, x, y)
    compiled_loss, compiled_grads = loss_and_grads(model, x, y, torch.compile(model, fullgraph=True))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-5)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)


# -----------------------------------------------------------------------------
# precision


def precision_for(*flags):
    cfg, model_config = train.parse_args(["--device=cpu", *flags])
    cfg = resume.resolve_runtime(cfg, model_config)
    autocast, scaler = hardware.precision(cfg)
    return cfg.dtype, autocast, scaler


def test_cpu_trains_in_float32_unless_dtype_says_otherwise():
    """auto is float32 on CPU (no autocast, no scaler); --dtype=bfloat16 autocasts; --dtype=float16 also
    scales the loss (a GradScaler), as on a GPU without bf16."""
    dtype, autocast, scaler = precision_for()
    assert dtype == "float32" and not isinstance(autocast, torch.autocast) and not scaler.is_enabled()
    dtype, autocast, scaler = precision_for("--dtype=bfloat16")
    assert dtype == "bfloat16" and autocast.fast_dtype == torch.bfloat16 and not scaler.is_enabled()
    dtype, autocast, scaler = precision_for("--dtype=float16")
    assert dtype == "float16" and autocast.fast_dtype == torch.float16 and scaler.is_enabled()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_run_trains_and_resumes_its_loss_scale(tmp_path, dtype):
    """A short CPU run under bf16 or fp16 autocast stays finite; fp16 saves its GradScaler state to resume."""
    flags = [
        "--n_layer=1",
        "--n_head=2",
        "--n_embd=16",
        "--block_size=16",
        "--batch_size=4",
        "--device=cpu",
        "--compile=false",
        "--eval_iters=1",
        "--log_interval=1",
        "--eval_interval=2",
        f"--dtype={dtype}",
        f"--out_dir={tmp_path}",
    ]
    result = train.main([*flags, "--max_iters=2"])
    assert all(torch.isfinite(torch.tensor(loss)) for loss in result["losses"].values())
    ckpt = checkpoint.load_checkpoint(tmp_path / "ckpt.pt")
    assert ckpt["train_config"]["dtype"] == dtype and bool(ckpt["scaler"]) == (dtype == "float16")
    assert train.main([*flags, "--max_iters=3", "--resume"])["iter_num"] == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_defaults_to_bf16_or_fp16_with_a_scaler():
    """On CUDA auto is bfloat16 where supported, else float16 with loss scaling."""
    cfg, model_config = train.parse_args(["--device=cuda"])
    cfg = resume.resolve_runtime(cfg, model_config)
    _, scaler = hardware.precision(cfg)
    assert cfg.dtype == ("bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    assert scaler.is_enabled() == (cfg.dtype == "float16") and cfg.compile is True
