"""train.py --init_from: a new run (step 0, fresh optimizer and schedule, its own out_dir) from a trained
run's weights, for context-extension fine-tuning. Tiny models on CPU through train.main; no mocks."""

import pytest
import torch
from helpers import train_error_line

import train
from plumbing import checkpoint
from positions import rope_frequencies

TINY = [
    "--n_layer=1",
    "--n_head=2",
    "--n_embd=16",
    "--block_size=16",
    "--batch_size=4",
    "--eval_iters=1",
    "--log_interval=1",
    "--device=cpu",
    "--compile=false",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A learned and a rope run of 2 steps each: {pos: out_dir}."""
    root = tmp_path_factory.mktemp("trained")
    for pos in ("learned", "rope"):
        train.main([*TINY, f"--pos={pos}", "--max_iters=2", "--eval_interval=2", f"--out_dir={root / pos}"])
    return {pos: root / pos for pos in ("learned", "rope")}


def weights(out_dir, name="ckpt.pt"):
    return checkpoint.load_checkpoint(out_dir / name)


def test_init_from_starts_a_new_run_from_the_weights_with_the_checkpoints_model(trained, tmp_path, capsys):
    """No model flags: the model is the checkpoint's (pos, shape); step 0 evaluates exactly the loaded
    weights, then the run trains with a fresh schedule to its own out_dir and records the extension."""
    out_dir = tmp_path / "ext"
    result = train.main(
        [
            "--init_from",
            str(trained["rope"]),
            "--block_size=32",
            "--rope_scaling=yarn",
            "--rope_factor=2",
            "--max_iters=2",
            "--eval_interval=2",
            "--device=cpu",
            "--compile=false",
            "--eval_iters=1",
            "--batch_size=4",
            f"--out_dir={out_dir}",
        ]
    )
    assert result["iter_num"] == 2 and list(result["losses"]) == [1, 2]
    saved, source = weights(out_dir), weights(trained["rope"])
    settings = saved["model_config"]["pos_settings"]
    assert settings["rope_original_len"] == 16  # YaRN scales against the length first trained on
    plain = {"rope_scaling": None, "rope_factor": 1.0, "rope_original_len": None}
    assert (
        saved["model_config"] | {"block_size": 16, "pos_settings": settings | plain} == source["model_config"]
    )
    assert saved["train_config"]["init_from"] == str(trained["rope"])
    assert "initialised from" in capsys.readouterr().out
    untrained = train.main(
        [
            "--init_from",
            str(trained["rope"]),
            "--max_iters=0",
            "--device=cpu",
            f"--out_dir={tmp_path / 'zero'}",
        ]
    )
    assert untrained["iter_num"] == 0
    assert all(torch.equal(weights(tmp_path / "zero")["model"][k], w) for k, w in source["model"].items())


def test_init_from_keeps_every_loaded_weight_and_spreads_learned_rows_by_interpolation(
    trained, tmp_path, capsys
):
    """learned at 4 x its block_size: every weight but the table is loaded unchanged, trained row i of the
    table lands on row 4 i, the rows between are linear between their neighbours, and the log says so."""
    out_dir = tmp_path / "learned_ext"
    train.main(
        [
            *TINY,
            "--pos=learned",
            "--init_from",
            str(trained["learned"]),
            "--block_size=64",
            "--max_iters=0",
            "--eval_interval=1",
            f"--out_dir={out_dir}",
        ]
    )
    assert "position table was resized from 16 to 64 rows by linear interpolation" in capsys.readouterr().out
    new, old = weights(out_dir)["model"], weights(trained["learned"])["model"]
    name = "transformer.wpe.weight"  # learned's table, GPT-2's name
    table, trained_table = new.pop(name), old.pop(name)
    assert all(torch.equal(new[k], old[k]) for k in old)
    assert table.shape == (64, 16)
    torch.testing.assert_close(table[0::4], trained_table, rtol=0, atol=0)
    torch.testing.assert_close(
        table[2:-4:4], (trained_table[:-1] + trained_table[1:]) / 2, rtol=1e-6, atol=1e-7
    )


def test_init_from_refuses_a_changed_width_or_scheme(trained, capsys):
    """Only block_size, rope_scaling, rope_factor and dropout may change: the weights must fit."""
    err = train_error_line(
        capsys, ["--init_from", str(trained["rope"]), "--n_embd=32", "--device=cpu"], status=1
    )
    assert "refusing to initialise from" in err and "--n_embd=32 but the checkpoint has 16" in err
    err = train_error_line(
        capsys, ["--init_from", str(trained["rope"]), "--pos=alibi", "--device=cpu"], status=1
    )
    assert "--pos=alibi but the checkpoint has rope" in err


def test_init_from_never_writes_into_the_folder_it_reads(trained, capsys):
    err = train_error_line(
        capsys, ["--init_from", str(trained["rope"]), f"--out_dir={trained['rope']}"], status=2
    )
    assert "same folder" in err
    err = train_error_line(capsys, ["--init_from", str(trained["rope"] / "missing")], status=2)
    assert "no such checkpoint file" in err


def test_a_yarn_fine_tune_keeps_scaling_against_the_length_first_trained_on(trained, tmp_path):
    """Fine-tuned at 2 x T with YaRN x2, the checkpoint records rope_original_len = T = 16, so the model it
    rebuilds (as sample.py and lab/eval_length.py do, with no flags) scales RoPE against 16 tokens, not the
    new 32."""
    out_dir = tmp_path / "yarn"
    train.main(
        [
            "--init_from",
            str(trained["rope"]),
            "--block_size=32",
            "--rope_scaling=yarn",
            "--rope_factor=2",
            "--max_iters=0",
            "--device=cpu",
            f"--out_dir={out_dir}",
        ]
    )
    model, _, ckpt = checkpoint.open_model(out_dir)
    settings = ckpt["model_config"]["pos_settings"]
    assert settings["rope_original_len"] == 16 and model.config.pos_settings.rope_scaling == "yarn"
    inv_freq, scale = rope_frequencies(8, scaling="yarn", factor=2.0, original_len=16)
    assert model.transformer.wpe.original_len == 16
    positions = torch.arange(32, dtype=torch.float32)
    cos = torch.cos(positions[:, None] * inv_freq[None]) * scale
    torch.testing.assert_close(
        model.transformer.wpe.cos[:32], torch.cat([cos, cos], dim=-1)
    )  # pair i: i, i + d/2
