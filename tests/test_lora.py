"""LoRA (lab/finetune/lora.py): adapters start as the identity, merge exactly, leave frozen weights without
gradients, and through python -m lab.finetune write plain checkpoints and resume bit for bit, the checkpoints
of the format before its state moved into the model's state_dict too."""

import dataclasses

import pytest
import torch
from helpers import TINY_BLOCK, TINY_RUN, finetune_error_line, train_error_line

import sample
import train
from lab.finetune import __main__ as finetune
from lab.finetune import lora
from model import GPT, GPTConfig
from plumbing.checkpoint import build_model, load_checkpoint, save_checkpoint

CONFIG = GPTConfig.from_flat(pos="rope", block_size=16, n_layer=2, n_head=2, n_embd=16, vocab_size=11)


def same(a, b):
    """Equal, tensors bit for bit, through nested dicts and lists."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def adapted(train_what=None, seed=0):
    torch.manual_seed(seed)
    base = GPT(CONFIG).double().eval()
    model = GPT(CONFIG).double().eval()
    model.load_state_dict(base.state_dict())
    return base, lora.add_adapters(model, rank=4, alpha=8.0, dropout=0.1, train=train_what)


def test_at_step_0_the_adapted_model_gives_the_base_models_logits_exactly():
    base, model = adapted()
    x = torch.randint(0, 11, (2, 16))
    assert torch.equal(model(x)[0], base(x)[0])


def test_merged_weights_compute_what_the_adapters_do():
    """B set to random values: the adapted model's state_dict holds a plain GPT's entries (the checkpoint's
    "model"), merged: loaded into a GPT, they give the same logits."""
    _, model = adapted()
    with torch.no_grad():
        for module in lora.adapters(model).values():
            module.lora_B.normal_()
    plain = GPT(CONFIG).double().eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k in plain.state_dict()})
    x = torch.randint(0, 11, (2, 16))
    torch.testing.assert_close(plain(x)[0], model(x)[0], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(plain(x)[0], adapted()[0](x)[0])  # the adapters changed something


@pytest.mark.parametrize("train_what", [None, "embed,norm"])
def test_only_adapters_and_what_lora_train_names_get_gradients(train_what):
    _, model = adapted(train_what)
    model.train()
    x = torch.randint(0, 11, (2, 16))
    model(x, x)[1].backward()
    for name, p in model.named_parameters():
        expect = "lora_" in name
        expect |= train_what is not None and ("wte" in name or "ln_" in name)
        assert (p.grad is not None) == expect == p.requires_grad, name
    trained, total = lora.trained_params(model)
    adapters = 2 * 4 * (16 + 48 + 16 + 16)  # per layer: c_attn (16 -> 48) and c_proj (16 -> 16), rank 4
    extra = 11 * 16 + 5 * 2 * 16 if train_what else 0  # wte; 5 LayerNorms, weight and bias
    assert trained == adapters + extra and total == GPT(CONFIG).num_params() + adapters


def test_lora_train_embed_trains_the_tied_matrix_by_its_input_gradient_only():
    """--lora_train=embed: the token embedding's gradient is the lookup's alone (Llama 2's embed_tokens,
    untied from its head); the head still reads the one tied matrix and computes the same logits."""
    base, model = adapted("embed")
    model.train(), base.train()
    for module in (*model.modules(), *base.modules()):
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    x = torch.randint(0, 11, (2, 16))
    logits, loss = model(x, x)
    assert torch.equal(logits, base(x)[0]) and model.lm_head.weight is model.transformer.wte.weight
    loss.backward()
    # the lookup's gradient alone: what reaches the embedding output, scattered onto the rows of x
    embedded = {}
    hook = model.transformer.wte.register_forward_hook(lambda m, i, out: embedded.setdefault("out", out))
    model.zero_grad(set_to_none=True)
    _, loss = model(x, x)
    hook.remove()
    (grad_out,) = torch.autograd.grad(loss, embedded["out"], retain_graph=True)
    rows = torch.zeros_like(model.transformer.wte.weight)
    expected = rows.index_add_(0, x.flatten(), grad_out.flatten(0, 1))
    loss.backward()
    torch.testing.assert_close(model.transformer.wte.weight.grad, expected, rtol=1e-12, atol=1e-12)


def test_bad_lora_flags_are_one_line_errors(capsys, tmp_path):
    err = finetune_error_line(
        capsys, [*TINY_RUN, f"--out_dir={tmp_path}", "--lora_rank=2", "--lora_train=ffn"], 2
    )
    assert "--lora_train='ffn': give one or more of embed, norm" in err
    err = finetune_error_line(
        capsys, [*TINY_RUN, f"--out_dir={tmp_path}", "--lora_rank=2", "--lora_train=embed,embed"], 2
    )
    assert "--lora_train='embed,embed': give one or more of embed, norm, comma-separated and each once" in err
    err = finetune_error_line(capsys, [*TINY_RUN, f"--out_dir={tmp_path}", "--lora_rank=17"], 2)
    assert "--lora_rank=17 is above n_embd=16, the smaller side of the adapted layers" in err
    assert not any(tmp_path.iterdir())
    err = finetune_error_line(capsys, [*TINY_RUN, f"--out_dir={tmp_path}", "--lora_train=norm"], 2)
    assert "needs --lora_rank" in err


@pytest.mark.parametrize(
    "flag", ["--lora_alpha=5", "--lora_dropout=0.5", "--lora_alpha=16", "--lora_dropout=0.05"]
)
def test_a_lora_setting_given_without_lora_rank_is_refused_as_lora_train_is(capsys, tmp_path, flag):
    """Without adapters it changes nothing: one line, status 2, nothing written; given at its default too."""
    err = finetune_error_line(capsys, [*TINY_RUN, f"--out_dir={tmp_path}", flag], 2)
    assert err.endswith(f"{flag.split('=')[0]} sets LoRA's adapters: it needs --lora_rank")
    assert not any(tmp_path.iterdir())


def test_lora_settings_not_given_are_recorded_as_their_defaults():
    """The checkpoint's train_config says what the run used, with LoRA or without (as before they could be
    left unset), so that a resume or a study compares like with like."""
    for rank, flags in ((0, []), (2, ["--lora_rank=2", "--resume"])):
        cfg, _ = train.parse_args([*TINY_RUN, "--out_dir=out/x", *flags], finetune.Config)
        recorded = dataclasses.asdict(cfg)  # the checkpoint's train_config
        assert (recorded["lora_rank"], recorded["lora_alpha"], recorded["lora_dropout"]) == (rank, 16.0, 0.05)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("base")
    train.main([*TINY_RUN, f"--out_dir={out_dir}"])
    return out_dir


def fine_tune_flags(base_run, out_dir, steps):
    long = 2 * TINY_BLOCK
    return [
        *TINY_RUN,
        *(f"--init_from={base_run}", f"--block_size={long}", f"--out_dir={out_dir}", f"--max_iters={steps}"),
        *("--s2_attn", "--lora_rank=2", "--lora_dropout=0.1", "--lora_train=embed,norm", "--dropout=0.1"),
        *("--lr_decay_iters=4", "--warmup_iters=1", "--learning_rate=1e-2"),
    ]


def test_lora_s2_fine_tune_resumes_bit_identically_and_writes_a_plain_checkpoint(tmp_path, base_run, capsys):
    """4 steps of S²-Attn + LoRA + embed/norm at 2 T in one go, and 2 steps then --resume for 2 more: the
    same losses, evaluations and checkpoint, bit for bit; the checkpoint's "model" is a plain GPT's."""
    whole = finetune.main(fine_tune_flags(base_run, tmp_path / "whole", 4))
    assert "LoRA rank 2, alpha 16 + embed,norm: training" in capsys.readouterr().out
    first = finetune.main(fine_tune_flags(base_run, tmp_path / "halves", 2))
    second = finetune.main([*fine_tune_flags(base_run, tmp_path / "halves", 4), "--resume"])
    assert {**first["losses"], **second["losses"]} == whole["losses"]
    assert first["evals"] + second["evals"] == whole["evals"]
    a, b = load_checkpoint(tmp_path / "halves" / "ckpt.pt"), load_checkpoint(tmp_path / "whole" / "ckpt.pt")
    for key in ("model", "lora", "optimizer"):
        assert same(a[key], b[key]), key
    assert a["train_config"]["s2_group"] == 2 * TINY_BLOCK // 4
    model = build_model("ckpt.pt", a)  # what sample.py and lab/eval_length.py open
    assert not any(isinstance(m, lora.LoRALinear) for m in model.modules())


def test_train_py_refuses_to_resume_a_lora_run_naming_the_command_that_can(capsys, tmp_path, base_run):
    """train.py adds no adapters: its --resume of a run lab.finetune trained with LoRA would load merged
    weights into a model the adapters' state does not fit, so it stops in one line, naming the state it does
    not build and the flags it does not take, and says which command can; the checkpoint is left as it was."""
    finetune.main(fine_tune_flags(base_run, tmp_path, 2))
    capsys.readouterr()
    before = (tmp_path / "ckpt.pt").read_bytes()
    flags = [f"--init_from={base_run}", f"--block_size={2 * TINY_BLOCK}", f"--out_dir={tmp_path}", "--resume"]
    err = train_error_line(capsys, [*TINY_RUN, *flags, "--max_iters=4"], 1)
    assert "model state (lora)" in err and "lora_rank" in err and str(tmp_path) in err
    assert "resume it with the command that trained it: python -m lab.finetune " in err  # its record
    assert err.endswith(" --resume") and "--lora_rank=2" in err
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert "resuming" not in capsys.readouterr().out


def test_a_resumed_fine_tune_names_the_fine_tuning_flags_it_changed(capsys, tmp_path, base_run):
    finetune.main(fine_tune_flags(base_run, tmp_path, 2))
    capsys.readouterr()
    finetune.main([*fine_tune_flags(base_run, tmp_path, 4), "--resume", "--lora_dropout=0.2"])
    assert "changed: " in (out := capsys.readouterr().out) and "lora_dropout 0.1 -> 0.2" in out, out


def test_resuming_with_another_lora_rank_is_refused_before_it_says_it_resumes(capsys, tmp_path, base_run):
    """Adapters of rank 3 do not fit the checkpoint's of rank 2: one line naming the file and the tensors
    that do not fit, status 1, before the resume is said; the checkpoint is left as it was."""
    finetune.main(fine_tune_flags(base_run, tmp_path, 2))
    capsys.readouterr()
    before = (tmp_path / "ckpt.pt").read_bytes()
    with pytest.raises(SystemExit) as stopped:
        finetune.main([*fine_tune_flags(base_run, tmp_path, 4), "--resume", "--lora_rank=3"])
    out, err = capsys.readouterr()
    assert stopped.value.code == 1 and err.count("\n") == 1 and "resuming" not in out, out
    assert str(tmp_path / "ckpt.pt") in err and "does not fit" in err and "lora_A" in err, err
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_a_lora_fine_tune_without_a_base_is_one_line_before_any_work(capsys, tmp_path):
    """--lora_rank trains adapters on a frozen model: without --init_from (or --resume) it would train them on
    a random one; one line naming --init_from, status 2, nothing written."""
    out_dir = tmp_path / "run"
    err = finetune_error_line(capsys, [*TINY_RUN, f"--out_dir={out_dir}", "--lora_rank=4"], 2)
    assert "--lora_rank=4" in err and "--init_from=RUN" in err and not out_dir.exists()


def older_format(ckpt):
    """ckpt as lab.finetune wrote it before the adapters' state moved into the model's state_dict: "lora"
    held the settings beside the adapted Linears' exact tensors (lora_A, lora_B, base.weight)."""
    names = {key.rsplit(".", 1)[0] for key in ckpt["lora"]["state"] if key.endswith(".lora_A")}
    exact = {f"{name}.{part}" for name in names for part in ("lora_A", "lora_B", "base.weight")}
    assert set(ckpt["lora"]["state"]) == exact  # bias=False: no base.bias
    t = ckpt["train_config"]
    settings = dict(rank=t["lora_rank"], alpha=t["lora_alpha"], train=t["lora_train"])
    return ckpt | {"lora": settings | {"state": ckpt["lora"]["state"]}}


def test_a_checkpoint_of_the_older_lora_format_samples_and_resumes_bit_identically(
    tmp_path, base_run, capsys
):
    """A LoRA + S²-Attn checkpoint as the code before wrote it (settings in "lora", "model" merged) samples
    (sample.py) and resumes with python -m lab.finetune --resume to the same losses and weights, bit for
    bit, as the run made in one go."""
    whole = finetune.main(fine_tune_flags(base_run, tmp_path / "whole", 4))
    finetune.main(fine_tune_flags(base_run, tmp_path / "old", 2))
    path = tmp_path / "old" / "ckpt.pt"
    save_checkpoint(older_format(load_checkpoint(path)), path)
    (tmp_path / "old" / "best.pt").unlink()
    capsys.readouterr()
    sample.main([f"--out_dir={tmp_path / 'old'}", "--num_samples=1", "--max_new_tokens=8", "--device=cpu"])
    assert "pos=rope" in capsys.readouterr().out
    second = finetune.main([*fine_tune_flags(base_run, tmp_path / "old", 4), "--resume"])
    assert second["losses"] == {step: whole["losses"][step] for step in (3, 4)}
    a, b = load_checkpoint(path), load_checkpoint(tmp_path / "whole" / "ckpt.pt")
    assert (
        same(a["model"], b["model"]) and same(a["lora"], b["lora"]) and same(a["optimizer"], b["optimizer"])
    )
