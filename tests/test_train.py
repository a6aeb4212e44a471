"""train.py: flags and config files, the learning rate schedule, checkpoints, and short real training runs.

All on CPU with tiny models through train.main, the code path `python train.py` takes; no mocks.
"""

import dataclasses
import json
import math
import os
import pickle
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import train_error_line

import train
from model import GPT, GPTConfig, scheme_settings
from plumbing import checkpoint, hardware, resume
from plumbing.errors import UserError
from positions import POS_SCHEMES

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=16",
    "--batch_size=4",
    "--device=cpu",
    "--compile=false",
    "--eval_iters=2",
    "--log_interval=1000",
]


class Payload:
    """A custom class: pickling it into a checkpoint makes loading it run code from this module."""


class Shell:
    """Unpickled, it would run a shell command: what a malicious checkpoint carries."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def run(tmp_path, *flags):
    return train.main([*TINY, f"--out_dir={tmp_path}", *flags])


# -----------------------------------------------------------------------------
# training runs


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_each_pos_trains_and_writes_a_loadable_checkpoint(tmp_path, pos):
    """Every scheme trains through main() and leaves a weights_only checkpoint that rebuilds the model (see
    nanoGPT issue #325)."""
    result = run(tmp_path, f"--pos={pos}", "--max_iters=3", "--eval_interval=3")
    path = Path(result["checkpoint"])
    assert path == tmp_path / "ckpt.pt" and result["iter_num"] == 3 and math.isfinite(result["best_val_loss"])
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    assert set(ckpt) == {
        "model",
        "model_config",
        "train_config",
        "iter_num",
        "best_val_loss",
        "meta",
        "optimizer",
        "best_iter",
        "scaler",
        "sampler",
        "rng",
        "wandb_run_id",
        "finished",
        "evaluated_iter",
        "command",
    }  # sampling's, resume's
    assert ckpt["model_config"]["pos"] == pos and ckpt["evaluated_iter"] == 3 and ckpt["finished"]
    assert (
        ckpt["model_config"]["vocab_size"] == ckpt["meta"]["vocab_size"] == 65
    )  # from the dataset, not the default
    assert ckpt["train_config"]["device"] == "cpu" and ckpt["best_val_loss"] == result["best_val_loss"]
    assert not [key for key in ckpt["model"] if key.startswith("_orig_mod.")]
    model = GPT(GPTConfig.from_flat(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])  # strict: every parameter name matches


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_run_compiles_with_autocast_and_saves_plain_names(tmp_path):
    """On CUDA the defaults turn on torch.compile and bf16/fp16 autocast;
    the checkpoint still has plain names."""
    result = run(
        tmp_path, "--device=cuda", "--compile=true", "--dtype=auto", "--max_iters=3", "--eval_interval=3"
    )
    ckpt = checkpoint.load_checkpoint(result["checkpoint"], map_location="cpu")
    assert ckpt["train_config"]["compile"] is True and ckpt["train_config"]["dtype"] in (
        "bfloat16",
        "float16",
    )
    assert not [key for key in ckpt["model"] if key.startswith("_orig_mod.")]
    GPT(GPTConfig.from_flat(**ckpt["model_config"])).load_state_dict(ckpt["model"])


def test_loss_decreases_on_a_short_run(tmp_path):
    """A few dozen steps take the val loss well below ln(65) = 4.17, the loss of a uniform guess."""
    result = run(
        tmp_path,
        "--max_iters=60",
        "--eval_interval=60",
        "--eval_iters=8",
        "--learning_rate=1e-2",
        "--min_lr=1e-3",
        "--warmup_iters=5",
    )
    first, last = result["evals"][0], result["evals"][-1]
    assert first["iter"] == 0 and last["iter"] == 60
    assert last["val"] < first["val"] - 0.5 and last["train"] < first["train"] - 0.5
    assert result["best_val_loss"] == last["val"]


# -----------------------------------------------------------------------------
# flags and config files


@pytest.mark.parametrize(
    "argv, names",
    [
        (["--pos=foo"], ["learned", "sinusoidal", "rope", "alibi", "none"]),
        (["--device=tpu"], ["auto", "cpu", "cuda", "mps"]),
        (["--n_layr=3"], ["did you mean --n_layer", "--pos", "--max_iters"]),
        (["--n_layer=abc"], ["--n_layer", "integer", "abc"]),
        (["--n_embd", "130", "--n_head", "4"], ["n_embd=130", "divisible", "n_head=4"]),
        (["--compile=maybe"], ["--compile", "true/false"]),
        (["--dtype=float8"], ["float32", "bfloat16", "float16"]),
        (["--grad_accum=0"], ["grad_accum", "positive integer"]),
        (["--resume=maybe"], ["--resume", "true/false"]),
    ],
)
def test_bad_flag_is_a_one_line_error_naming_the_choices(capsys, argv, names):
    """A typo or bad value stops before any work with exit status 2 and one line that says what is valid."""
    err = train_error_line(capsys, argv, status=2)
    assert all(name in err for name in names), err


def test_config_file_with_unknown_key_is_a_one_line_error(capsys, tmp_path):
    """A misspelt key in a TOML file is refused (not silently ignored), naming the file and the valid keys."""
    config = tmp_path / "bad.toml"
    config.write_text('n_layers = 3\npos = "alibi"\n')
    err = train_error_line(capsys, ["--config", str(config)], status=2)
    assert str(config) in err and "'n_layers'" in err and "n_layer" in err and "learning_rate" in err


def test_config_file_bad_value_is_a_one_line_error(capsys, tmp_path):
    """Values in a TOML file go through the same checks as flags."""
    config = tmp_path / "bad.toml"
    config.write_text('pos = "rotary"\n')
    err = train_error_line(capsys, ["--config", str(config)], status=2)
    assert str(config) in err and "rope" in err


def test_config_file_is_read_and_flags_override_it(tmp_path):
    """Precedence: defaults < --config file < flags, in either flag spelling (--x=v, --x v)."""
    config = tmp_path / "run.toml"
    config.write_text('n_layer = 3\npos = "alibi"\ndropout = 0.1\nmax_iters = 50\nbias = true\n')
    cfg, model_config = train.parse_args(["--config", str(config), "--pos=learned", "--max_iters", "7"])
    assert (model_config.n_layer, model_config.dropout, model_config.bias) == (3, 0.1, True)  # from the file
    assert model_config.pos == "learned" and cfg.max_iters == 7  # flags win
    assert model_config.n_embd == 128 and cfg.batch_size == 12  # untouched defaults: nanoGPT's CPU recipe


PAIRS = 8  # TINY's head: 32 / 2 = 16 dims, 8 rotated pairs, a LongRoPE factor each


def factors_file(tmp_path, **more):
    path = tmp_path / "factors.json"
    path.write_text(json.dumps({"short_factor": [1.0] * PAIRS, "long_factor": [2.0] * PAIRS} | more))
    return str(path)


@pytest.mark.parametrize(
    "file_keys, flags, names",
    [
        ({}, ["--rope_short_factor", *["2"] * PAIRS], "--rope_short_factor both set rope_short_factor"),
        ({}, ["--rope_long_factor", *["3"] * PAIRS], "--rope_long_factor both set rope_long_factor"),
        ({"attention_factor": 1.2}, ["--rope_attention_factor=1.5"], "both set rope_attention_factor"),
        ({"keep_first": 2}, ["--rope_keep_first=3"], "--rope_keep_first both set rope_keep_first"),
        ({"attention_factor": 1.2}, ["--config={toml}"], "both set rope_attention_factor"),  # a key: given
    ],
)
def test_a_longrope_setting_in_the_factors_file_and_a_flag_is_refused(
    capsys, tmp_path, file_keys, flags, names
):
    """--rope_factors=FILE and a flag (or --config key) setting the same LongRoPE field: one line, exit 2,
    naming both, instead of the file's value silently winning over the flag."""
    toml = tmp_path / "run.toml"
    toml.write_text("rope_attention_factor = 1.5\n")
    factors = factors_file(tmp_path, **file_keys)
    argv = [*TINY, f"--rope_factors={factors}", *(flag.format(toml=toml) for flag in flags)]
    err = train_error_line(capsys, argv, status=2)
    assert f"rope_factors={factors} sets" in err and f"drop {names.split()[-1]}=" in err, err


def test_a_longrope_setting_the_factors_file_leaves_out_is_taken_from_its_flag(tmp_path):
    """A flag for a LongRoPE field the file does not set is no conflict: the model has both."""
    factors = factors_file(tmp_path)
    _, model_config = train.parse_args([*TINY, f"--rope_factors={factors}", "--rope_attention_factor=1.5"])
    settings = model_config.pos_settings
    assert (settings.rope_scaling, settings.rope_attention_factor) == ("longrope", 1.5)
    assert settings.rope_long_factor == [2.0] * PAIRS


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--rope_factor=4"], "rope_factor=4.0 needs rope_scaling"),
        (["--rope_original_len=4"], "rope_original_len=4 needs rope_scaling"),
        (["--rope_factor=2", "--rope_scaling=none"], "rope_factor=2.0 needs rope_scaling"),
        (["--config={toml}"], "rope_factor=4.0 needs rope_scaling"),  # a --config key is given too
    ],
)
def test_a_rope_extension_setting_without_rope_scaling_is_refused(capsys, tmp_path, flags, words):
    """--rope_factor or --rope_original_len given (by a flag or --config) without --rope_scaling: a setting
    that scales nothing, refused in one line, exit 2, as sample.py refuses it; nothing is written."""
    toml = tmp_path / "run.toml"
    toml.write_text("rope_factor = 4.0\n")
    argv = [*TINY, f"--out_dir={tmp_path / 'run'}", *(flag.format(toml=toml) for flag in flags)]
    err = train_error_line(capsys, argv, status=2)
    assert words in err and "drop it" in err, err
    assert not (tmp_path / "run").exists()


def test_rope_extension_settings_with_a_scaling_or_a_checkpoints_are_accepted(tmp_path):
    """The rule is on flags given without an extension only: with --rope_scaling; at their defaults; and on
    --init_from a checkpoint whose extension sets them (a fine-tune's: rope_scaling=yarn), a new
    --rope_factor for that extension."""
    _, given = train.parse_args([*TINY, "--rope_scaling=yarn", "--rope_factor=4", "--rope_original_len=8"])
    assert (given.pos_settings.rope_factor, given.pos_settings.rope_original_len) == (4.0, 8)
    assert train.parse_args(TINY)[1].pos_settings.rope_factor == 1.0
    flat = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=65, bias=False)
    extended = GPTConfig.from_flat(**flat, rope_scaling="yarn", rope_factor=2.0, rope_original_len=16)
    meta = {"tokenizer": "char", "vocab_size": 65}
    source = tmp_path / "ctx32"
    source.mkdir()
    state = {"model": GPT(extended).state_dict(), "model_config": dataclasses.asdict(extended), "meta": meta}
    torch.save(state, source / "ckpt.pt")
    _, model_config = train.parse_args(
        [*TINY, f"--init_from={source}", "--block_size=64", "--rope_factor=4", f"--out_dir={tmp_path / 'x'}"]
    )
    settings = model_config.pos_settings
    assert (settings.rope_scaling, settings.rope_factor, settings.rope_original_len) == ("yarn", 4.0, 16)


@pytest.mark.parametrize("name", ["cpu_recipe", "shakespeare_char"])
def test_shipped_configs_parse(name):
    """The recipes in configs/ hold nanoGPT's settings."""
    cfg, model_config = train.parse_args(["--config", str(ROOT / "configs" / f"{name}.toml"), "--device=cpu"])
    shape = (
        model_config.n_layer,
        model_config.n_head,
        model_config.n_embd,
        model_config.block_size,
        cfg.batch_size,
    )
    expected = {
        "cpu_recipe": ((4, 4, 128, 64, 12), 2000, 0.0),
        "shakespeare_char": ((6, 6, 384, 256, 64), 5000, 0.2),
    }
    assert (shape, cfg.max_iters, model_config.dropout) == expected[name]
    assert cfg.lr_decay_iters == cfg.max_iters and cfg.eval_iters == 200


def test_gpt2_124m_config_is_gpt2_small_with_half_a_million_tokens_per_step():
    """configs/gpt2_124m.toml: 12 layers, 12 heads, 768 dims, context 1024, 2**19 tokens per step through
    grad_accum, which splits evenly over 1, 2, 4 or 8 GPUs."""
    cfg, model_config = train.parse_args(
        ["--config", str(ROOT / "configs" / "gpt2_124m.toml"), "--device=cpu"]
    )
    shape = (model_config.n_layer, model_config.n_head, model_config.n_embd, model_config.block_size)
    assert shape == (12, 12, 768, 1024) and cfg.dataset == "fineweb_edu"
    assert cfg.batch_size * model_config.block_size * cfg.grad_accum == 524_288
    assert all(cfg.grad_accum % gpus == 0 for gpus in (1, 2, 4, 8))
    assert (cfg.learning_rate, cfg.min_lr, cfg.beta2, cfg.lr_decay_iters) == (6e-4, 6e-5, 0.95, cfg.max_iters)


def test_dropout_zero_and_boolean_spellings_parse():
    """--dropout=0 is 0.0 (nanoGPT's configurator rejects it),
    booleans take true/false/1/0/yes/no or no value."""
    cfg, model_config = train.parse_args(["--dropout=0", "--bias=False", "--compile", "no"])
    assert model_config.dropout == 0.0 and model_config.bias is False and cfg.compile is False
    cfg, model_config = train.parse_args(["--bias", "--compile=1", "--dropout", "0.25"])
    assert model_config.bias is True and cfg.compile is True and model_config.dropout == 0.25


def test_every_config_field_has_a_flag(capsys):
    """Each field of TrainConfig and GPTConfig (but vocab_size, read from the dataset, and pos_settings, whose
    settings are flags each) and each scheme's setting is settable from the CLI."""
    with pytest.raises(SystemExit):
        train.main(["--help"])
    help_text = capsys.readouterr().out
    names = [f.name for f in dataclasses.fields(train.TrainConfig)] + [
        f.name for f in dataclasses.fields(GPTConfig)
    ]
    names += list(scheme_settings())
    assert [name for name in names if f"--{name} " not in help_text] == ["vocab_size", "pos_settings"]


def test_default_out_dir_names_dataset_and_pos():
    """Runs of different schemes go to different folders instead of overwriting one checkpoint."""
    for pos in ("rope", "learned"):
        cfg, model_config = train.parse_args([f"--pos={pos}", "--device=cpu"])
        assert resume.resolve_runtime(cfg, model_config).out_dir == f"out/shakespeare_char_{pos}"


# -----------------------------------------------------------------------------
# learning rate schedule


def test_lr_schedule_warmup_cosine_then_flat():
    """Linear warmup to the peak, half cosine to min_lr at lr_decay_iters (whatever max_iters is),
    then flat."""
    cfg = train.TrainConfig(learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, max_iters=50)
    lr = [train.get_lr(it, cfg) for it in range(200)]
    assert lr[0] == pytest.approx(1 / 11) and lr[9] == pytest.approx(10 / 11)
    assert all(a < b for a, b in zip(lr[:10], lr[1:11]))  # warmup rises to the peak
    assert lr[10] == pytest.approx(1.0)  # peak
    assert lr[60] == pytest.approx(0.55)  # halfway down the cosine: (1 + 0.1) / 2
    assert all(a >= b for a, b in zip(lr[10:110], lr[11:111]))
    assert lr[110] == pytest.approx(0.1) and set(lr[110:]) == {0.1}  # min_lr at lr_decay_iters and after
    longer = dataclasses.replace(cfg, max_iters=1000)
    assert [train.get_lr(it, longer) for it in range(200)] == lr  # max_iters plays no part


def test_lr_decay_iters_defaults_to_max_iters():
    """Without lr_decay_iters the cosine ends with the run (nanoGPT makes you set both)."""
    cfg, _ = train.parse_args(["--max_iters=300", "--warmup_iters=10"])
    assert cfg.lr_decay_iters == 300 and train.get_lr(300, cfg) == cfg.min_lr


# -----------------------------------------------------------------------------
# checkpoints


def test_atomic_save_leaves_no_temp_files_and_survives_a_failed_save(tmp_path):
    """save_checkpoint replaces the file whole;
    a save that fails midway keeps the old checkpoint and no litter."""
    path = tmp_path / "ckpt.pt"
    checkpoint.save_checkpoint({"model": {"w": torch.ones(3)}, "model_config": {}}, path)
    checkpoint.save_checkpoint({"model": {"w": torch.zeros(3)}, "model_config": {}}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    # pickling a local lambda: AttributeError up to Python 3.13, PicklingError from 3.14
    with pytest.raises((AttributeError, pickle.PicklingError)):
        checkpoint.save_checkpoint({"model": {"w": torch.ones(3)}, "unpicklable": lambda: None}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert torch.equal(checkpoint.load_checkpoint(path)["model"]["w"], torch.zeros(3))


def test_a_mapped_load_gives_the_same_checkpoint_in_either_file_format(tmp_path):
    """load_checkpoint(mmap=True), what sampling and --init_from use, returns what a full read does: for
    torch's zip format, which it maps, and for its older format, which cannot be mapped and is read whole
    instead."""
    saved = {"model": {"w": torch.randn(4, 4)}, "model_config": {"block_size": 8}}
    for name, zip_format in (("zip.pt", True), ("legacy.pt", False)):
        torch.save(saved, tmp_path / name, _use_new_zipfile_serialization=zip_format)
        mapped = checkpoint.load_checkpoint(tmp_path / name, mmap=True)
        full = checkpoint.load_checkpoint(tmp_path / name, mmap=False)
        # both get the settings this old file lacks (current_model_config); nothing else changes
        assert (
            mapped["model_config"]
            == full["model_config"]
            == checkpoint.current_model_config(saved["model_config"])
        )
        assert torch.equal(mapped["model"]["w"], saved["model"]["w"]) and torch.equal(
            full["model"]["w"], saved["model"]["w"]
        )


def corrupt_checkpoint(tmp_path, kind):
    path = tmp_path / "ckpt.pt"
    if kind == "missing":
        return path
    if kind == "payload":
        torch.save({"model": {}, "model_config": {}, "meta": Payload()}, path)
        return path
    if kind in (
        "shell",
        "shell_protocol_4",
    ):  # protocol 4: torch's unpickler stops at its FRAME opcode, unnamed
        torch.save(
            {"model": {}, "model_config": {}, "meta": Shell(tmp_path / "ran")},
            path,
            pickle_protocol=4 if kind == "shell_protocol_4" else 2,
        )
        return path
    if kind == "not_a_checkpoint":
        torch.save({"weights": torch.ones(2)}, path)
        return path
    checkpoint.save_checkpoint({"model": {"w": torch.randn(64, 64)}, "model_config": {}}, path)
    data = path.read_bytes()
    path.write_bytes(
        {"truncated": data[: len(data) // 2], "garbage": b"not a checkpoint at all", "empty": b""}[kind]
    )
    return path


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing", "no such checkpoint"),
        ("truncated", "not a usable checkpoint ("),
        ("garbage", "not a usable checkpoint (UnpicklingError: "),
        ("empty", "not a usable checkpoint (EOFError: "),
        (
            "payload",
            "(UnpicklingError: Unsupported global: GLOBAL test_train.Payload was not an allowed global",
        ),
        ("shell", f"(UnpicklingError: Trying to load unsupported GLOBAL {os.system.__module__}.system"),
        ("shell_protocol_4", "not a usable checkpoint (UnpicklingError: "),
        ("not_a_checkpoint", "not a posgpt checkpoint (no model_config entry)"),
    ],
)
@pytest.mark.parametrize("mmap", [False, True])
def test_bad_checkpoint_is_a_clear_checkpoint_error(tmp_path, kind, words, mmap):
    """load_checkpoint turns a missing, damaged or code-carrying file into one line naming the path and the
    cause (for a code-carrying one, torch.load(weights_only=True)'s refusal, never its hint to load it with
    weights_only=False),
    whether it reads the file (resuming) or maps it (sampling, evaluating, --init_from); nothing in the file
    runs."""
    path = corrupt_checkpoint(tmp_path, kind)
    with pytest.raises(UserError) as error:
        checkpoint.load_checkpoint(path, mmap=mmap)
    message = str(error.value)
    assert isinstance(error.value, ValueError) and "\n" not in message
    assert message.startswith(str(path)) and words in message, message
    assert "weights_only=False" not in message and not (tmp_path / "ran").exists()


def test_importing_train_runs_nothing():
    """`import train` (as sample.py and the tests do) parses no flags, prints nothing and writes nothing."""
    code = "import sys; sys.argv = ['train.py', '--not-a-flag']; import train"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done.stderr


# -----------------------------------------------------------------------------
# speed accounting and logs


def test_flops_per_token_is_palm_6n_plus_attention():
    """6N + 12 * n_layer * n_head * head_dim * block_size (PaLM appendix B); the learned position table is a
    lookup, not a matmul, so learned and none cost the same."""
    config = dict(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32)
    rope = GPT(GPTConfig.from_flat(**config, pos="rope"))
    assert rope.flops_per_token() == (6 * rope.num_params() + 12 * 2 * 2 * 16 * 16, None)
    learned, none = (
        GPT(GPTConfig.from_flat(**config, pos="learned")),
        GPT(GPTConfig.from_flat(**config, pos="none")),
    )
    assert learned.num_params() == none.num_params() + 16 * 32
    assert learned.flops_per_token() == none.flops_per_token()


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA A10G", None),  # not A10's 125 TFLOP/s: no guess, no MFU
        ("NVIDIA L4", 121e12),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_peak_flops_table_matches_gpu_names(name, peak):
    """MFU divides by the bf16 dense peak of the GPU torch names; a GPU missing from the table gets no MFU."""
    assert hardware.peak_flops_of(name) == peak


def test_log_is_one_line_per_interval_with_time_left_and_evaluations_say_what_they_do(tmp_path, capsys):
    """log_interval=2 over 4 steps: 2 step lines with loss, ms/iter, tok/s and time left; each evaluation
    announces itself before its result."""
    run(tmp_path, "--max_iters=4", "--eval_interval=4", "--log_interval=2")
    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if re.match(r"step \d+/4 \|", line)]
    assert len(steps) == 2 and all(
        re.search(r"ms/iter \| [\d,]+ tok/s \| \d+s left$", line) for line in steps
    ), steps
    for step in (0, 4):
        announce = lines.index(f"step {step}: evaluating on 2 batches of train and of val ...")
        assert lines[announce + 1].startswith(f"step {step}: train loss ")


def keys_missing_from_wandb_log(run_dir, keys, wait_seconds=30):
    """The keys not (yet) in an offline W&B run's log (run-<id>.wandb: protobuf records holding keys and
    values as text). wandb-core writes the log in its own process and can still be flushing it when
    run.finish() returns, so this waits up to wait_seconds for the keys to appear."""
    deadline = time.monotonic() + wait_seconds
    while True:
        log = next(run_dir.glob("run-*.wandb"), None)
        records = log.read_bytes() if log else b""
        missing = [key for key in keys if key not in records]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.1)


def test_wandb_without_its_package_is_a_one_line_error_before_any_work(tmp_path, capsys, monkeypatch):
    """--wandb where the wandb package cannot be imported stops at once with one line saying how to install
    it: before the dataset is looked at (preparing one can take hours), and before anything is written."""
    monkeypatch.setitem(
        sys.modules, "wandb", None
    )  # what importlib.util.find_spec sees for a missing package
    out_dir = tmp_path / "out"
    err = train_error_line(capsys, [*TINY, "--dataset=fineweb_edu", "--wandb", f"--out_dir={out_dir}"], 1)
    assert "--wandb needs the wandb package: pip install wandb" in err
    assert not out_dir.exists()


def test_wandb_offline_logs_config_losses_and_checkpoint_and_resume_continues_the_run(tmp_path, monkeypatch):
    """--wandb with the real wandb package in offline mode writes a run holding the config, losses, learning
    rate, tokens/s and the checkpoint path; --resume logs into the same run id."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    monkeypatch.setenv("WANDB_SILENT", "true")
    out_dir = tmp_path / "out"
    flags = [
        *TINY,
        f"--out_dir={out_dir}",
        "--eval_interval=2",
        "--log_interval=1",
        "--wandb",
        "--wandb_project=test",
    ]
    keys = (
        b"train/loss",
        b"train/lr",
        b"train/tokens_per_sec",
        b"train/tflops",
        b"eval/train_loss",
        b"eval/val_loss",
        b"best_checkpoint",
        str(out_dir / "ckpt.pt").encode(),
        b"learning_rate",
        b"n_layer",
    )
    run_id = train.main([*flags, "--max_iters=2"])["wandb_run_id"]
    assert keys_missing_from_wandb_log(next((tmp_path / "wandb").glob(f"offline-run-*-{run_id}")), keys) == []
    resumed = train.main([*flags, "--max_iters=4", "--resume"])
    assert (
        run_id
        and resumed["wandb_run_id"]
        == run_id
        == checkpoint.load_checkpoint(out_dir / "ckpt.pt")["wandb_run_id"]
    )
    # offline, each process writes a folder offline-run-<time>-<run id>, with a suffix -1, -2 ... when both
    # start within one second; inside it, the run's log run-<run id>.wandb names the run it belongs to
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) >= 1 and {log.name for run in runs for log in run.glob("*.wandb")} == {
        f"run-{run_id}.wandb"
    }
    assert keys_missing_from_wandb_log(runs[-1], keys) == []  # the resumed process logged too
