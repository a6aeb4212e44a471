"""Checkpoints of every older format (tests/fixtures/ckpt_rope_without_FIELDS.pt, named by what the format
lacks: pos=rope, 1 layer x 16 dims, block_size 16, two steps of shakespeare_char): each samples, and resumes
where it holds the state --resume continues; the GPTConfig fields it lacks take the values its train.py built
with, and the reader says once that the file is older, never that it is damaged."""

import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN

import sample
import train
from model import GPT, GPTConfig
from plumbing import checkpoint
from positions import POSITION_MODULES

# the RoPE settings a file without them meant: plain RoPE, no extension, scaled against block_size
PLAIN_ROPE = dict(
    rope_scaling=None, rope_factor=1.0, rope_original_len=None, rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0, rope_fraction=1.0, nope_interval=0, nope_layers=None, rope_short_factor=None,
    rope_long_factor=None, rope_attention_factor=None, rope_keep_first=0, rope_factors=None,
)  # fmt: skip

FIXTURES = Path(__file__).parent / "fixtures"
GPT_FIELDS = [f.name for f in fields(GPTConfig)]  # today's model_config
# the fixture's name: what its format holds, oldest first
FORMATS = {
    "resume_state": "the first: no rope_original_len, no best_iter, scaler, sampler, rng or wandb_run_id",
    "original_len": "the resume state, no rope_original_len",
    "finished": "rope_original_len, no finished, no RoPE variants",
    "variants": "finished, no RoPE variants",
}
RESUMABLE = ("original_len", "finished", "variants")


@pytest.fixture
def run(tmp_path, request):
    """A run folder holding the fixture of the format the test is parametrized by, as its ckpt.pt."""
    shutil.copyfile(FIXTURES / f"ckpt_rope_without_{request.param}.pt", tmp_path / "ckpt.pt")
    return tmp_path


def older_notes(err):
    return [line for line in err.splitlines() if "is from an older version of posgpt" in line]


def test_every_format_has_its_fixture_and_each_lacks_fields_gptconfig_gained():
    for lacking in FORMATS:
        raw = torch.load(FIXTURES / f"ckpt_rope_without_{lacking}.pt", weights_only=True)["model_config"]
        settings = set(raw) - set(GPT_FIELDS)  # flat, beside the GPT's fields
        assert set(GPT_FIELDS) - set(raw) == {"pos_settings"} and raw["pos"] == "rope", lacking
        assert settings < set(POSITION_MODULES["rope"].Settings.__dataclass_fields__), lacking
        assert set(PLAIN_ROPE) - settings and set(checkpoint.current_model_config(raw)) == set(GPT_FIELDS), (
            lacking
        )
        assert (FIXTURES / f"ckpt_rope_without_{lacking}.pt").stat().st_size < 200_000


def test_the_fields_older_files_lack_default_to_the_model_those_versions_built():
    """No RoPE extension (rope_scaling None, factor 1), one scaled against block_size, every variant plain."""
    raw = dict(block_size=16, n_layer=1, n_head=2, n_embd=16, vocab_size=65, pos="rope", rope_base=10000.0)
    config = checkpoint.current_model_config(raw)
    assert config["pos_settings"] == PLAIN_ROPE | dict(rope_base=10000.0)
    model = GPT(GPTConfig(**config))
    assert model.rope_layers == (True,) and model.transformer.wpe.dim == 8


@pytest.mark.parametrize("run", list(FORMATS), indirect=True)
def test_each_older_format_samples_and_is_said_once_to_be_older(run, capsys):
    loaded, samples, _ = sample.main([f"--out_dir={run}", "--max_new_tokens=20", "--stream=false"])
    err = capsys.readouterr().err
    assert len(samples[0]) == 21 and loaded.model.config.pos_settings.rope_original_len is None
    assert len(older_notes(err)) == 1 and "damaged" not in err, err


@pytest.mark.parametrize("run", RESUMABLE, indirect=True)
def test_each_older_format_with_the_resume_state_resumes(run, capsys):
    summary = train.main([*TINY_RUN, f"--out_dir={run}", "--max_iters=3", "--resume"])
    err = capsys.readouterr().err
    assert summary["iter_num"] == 3 and list(summary["losses"]) == [3]
    assert len(older_notes(err)) == 1 and "damaged" not in err, err


@pytest.mark.parametrize("run", ["resume_state"], indirect=True)
def test_the_first_format_is_refused_a_resume_as_older_not_damaged(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main([*TINY_RUN, f"--out_dir={run}", "--max_iters=3", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1 and len(older_notes("\n".join(err))) == 1, err
    assert err[-1].startswith("train.py: error: ") and "older" in err[-1] and "damaged" not in err[-1], err
