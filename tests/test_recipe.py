"""The training recipe's details that a refactor can silently lose: each test fails if one is removed.

Evaluation in eval mode, gradient clipping before the optimizer step, the sinusoidal token scaling and GPT-2's
residual-projection init all leave training working, just worse, so only a test of the property itself catches
their loss. Tiny models on CPU through train.py's own functions; no mocks.
"""

import math
from dataclasses import replace

import pytest
import torch

import train
from data.common import prepare_data
from model import GPT, GPTConfig
from plumbing import resume
from plumbing.distributed import Processes
from positions import sinusoidal_embedding


def tiny_run(tmp_path, *flags):
    """train.py's State (model, optimizer, batch streams) for a tiny model on shakespeare_char,
    built as train() does."""
    cfg, model_config = train.parse_args(
        [
            "--n_layer=2",
            "--n_head=2",
            "--n_embd=32",
            "--block_size=16",
            "--batch_size=4",
            "--device=cpu",
            "--compile=false",
            f"--out_dir={tmp_path}",
            *flags,
        ]
    )
    data_dir, meta = prepare_data(cfg.dataset, Processes())
    model_config = replace(model_config, vocab_size=meta["vocab_size"])
    cfg = resume.resolve_runtime(cfg, model_config)
    return cfg, train.build(cfg, model_config, meta, data_dir, Processes())


def test_loss_estimate_runs_in_eval_mode_with_dropout_off(tmp_path):
    """With dropout 0.5 the estimate equals the eval-mode loss on the same batches (dropout would make it
    higher and random), and the model is back in train mode afterwards."""
    _, run = tiny_run(tmp_path, "--dropout=0.5")
    state = run.eval_sampler.state_dict()
    estimate = train.estimate_loss(run.model, run.eval_sampler, 3, run.autocast)
    assert run.model.training
    run.eval_sampler.load_state_dict(state)
    run.model.eval()
    with torch.no_grad():
        expected = {
            split: sum(run.model(*run.eval_sampler.get_batch(split))[1].item() for _ in range(3)) / 3
            for split in ("train", "val")
        }
    assert estimate == pytest.approx(expected, abs=1e-6)


def gradient_norm_at_step(cfg_run, lr=1e-3):
    """The global gradient norm the optimizer sees in one train_step
    (read by the optimizer's own pre-step hook)."""
    cfg, run = cfg_run
    seen = []
    hook = run.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            torch.linalg.vector_norm(
                torch.stack(
                    [torch.linalg.vector_norm(p.grad) for p in run.model.parameters() if p.grad is not None]
                )
            )
        )
    )
    train.train_step(run, lr, cfg.grad_clip)
    hook.remove()
    return seen[0].item()


def test_train_step_clips_the_gradient_norm_before_the_optimizer_step(tmp_path):
    """grad_clip=0.01: the optimizer steps with a gradient of norm 0.01;
    grad_clip=0 leaves it (about 1 at init)."""
    assert gradient_norm_at_step(tiny_run(tmp_path, "--grad_clip=0.01")) == pytest.approx(0.01, rel=1e-4)
    assert gradient_norm_at_step(tiny_run(tmp_path, "--grad_clip=0")) > 0.1


def test_a_step_over_micro_batches_uses_their_mean_loss_and_mean_gradient(tmp_path):
    """grad_accum=2: the step's loss and the gradient the optimizer sees are the means over the two
    micro-batches (a sum would double the effective learning rate with every extra micro-batch)."""
    cfg, run = tiny_run(tmp_path, "--grad_accum=2", "--grad_clip=0")
    states = [sampler.state_dict() for sampler in run.samplers]
    batches = [sampler.get_batch("train") for sampler in run.samplers]
    for sampler, state in zip(run.samplers, states):
        sampler.load_state_dict(state)
    losses = [run.model(x, y)[1] for x, y in batches]
    expected = torch.autograd.grad(sum(losses) / 2, list(run.model.parameters()))
    seen = []
    run.optimizer.register_step_pre_hook(
        lambda *_: seen.append([p.grad.clone() for p in run.model.parameters()])
    )
    loss = train.train_step(run, 1e-3, cfg.grad_clip)
    assert loss.item() == pytest.approx(sum(micro.item() for micro in losses) / 2, rel=1e-6)
    for got, want in zip(seen[0], expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_sinusoidal_scales_token_embeddings_by_sqrt_n_embd():
    """Vaswani et al. section 3.4: the token embeddings are multiplied by sqrt(d_model) before the
    unit-amplitude table is added, so the tokens (GPT-2 init, std 0.02) are not drowned by the positions. Read
    at the input of the first block, through GPT.forward."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig.from_flat(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=32, pos="sinusoidal")
    ).double()
    idx = torch.randint(0, 16, (1, 8))
    first_block_input = []
    model.transformer.h[0].register_forward_pre_hook(lambda module, args: first_block_input.append(args[0]))
    model(idx)
    expected = model.transformer.wte(idx) * math.sqrt(32) + sinusoidal_embedding(8, 32, dtype=torch.float64)
    torch.testing.assert_close(first_block_input[0], expected)


def test_residual_projections_start_smaller_by_sqrt_two_n_layer():
    """GPT-2 init: attn.c_proj and mlp.c_proj weights ~ N(0, 0.02 / sqrt(2 n_layer)), every other matrix 0.02,
    so the 2 n_layer additions to the residual stream keep its variance near that of one."""
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(
        GPTConfig.from_flat(block_size=8, vocab_size=64, n_layer=n_layer, n_head=4, n_embd=256, pos="none")
    )
    for block in model.transformer.h:
        for proj in (block.attn.c_proj, block.mlp.c_proj):
            assert proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * n_layer), rel=0.03)
        assert block.mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.03)
        assert block.attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.03)


def test_output_head_is_the_token_embedding():
    """Weight tying (Press & Wolf 2017), as GPT-2: lm_head and wte are one matrix, saved under both of GPT-2's
    names (so GPT-2's checkpoints load) but one tensor."""
    model = GPT(GPTConfig.from_flat(block_size=8, vocab_size=16, n_layer=1, n_head=2, n_embd=8, pos="none"))
    assert model.lm_head.weight is model.transformer.wte.weight
    state = model.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
