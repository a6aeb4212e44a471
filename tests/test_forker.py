"""A fork's scheme, defined here alone and registered by monkeypatching positions.POSITION_MODULES, runs
through every entry point with no other file edited: training, cached sampling, --help, checkpoints,
--init_from, the refusal of another scheme's setting, S²-Attn and LoRA. The scheme: Kerple-log (Chi et al.
2022), a learnable per-head log-distance bias -r1_h ln(1 + r2_h (i - j)), r1 and r2 positive, with one setting
of its own, the initial r2."""

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
from helpers import TINY_RUN, error_line

import positions
import sample
import train
from generation import generate_cached
from lab.finetune import __main__ as finetune
from model import GPT, GPTConfig
from plumbing.checkpoint import load_checkpoint, open_model
from positions import PositionScheme, setting

NAME, SETTING = "kerple", "kerple_r2_init"
# long-context fine-tuning flags: train.py's today (S²-Attn and LoRA), in one place to retarget
FINE_TUNE = ["--s2_attn", "--lora_rank=2"]


class KerpleLog(PositionScheme):
    """Kerple-log: head h adds -r1_h ln(1 + r2_h (i - j)) to the score of query i on key j; r1 = e^r1_log and
    r2 = e^r2_log, learned, stay positive."""

    @dataclass
    class Settings(PositionScheme.Settings):
        kerple_r2_init: float = setting(1.0, "Kerple-log's initial r2, the slope inside the log", above=0)

    def __init__(self, config):
        super().__init__(config)
        self.r2_init = config.pos_settings.kerple_r2_init
        self.r1_log = nn.Parameter(torch.zeros(config.n_head))
        self.r2_log = nn.Parameter(torch.zeros(config.n_head))
        self.init_weights()

    def init_weights(self):
        with torch.no_grad():
            self.r1_log.zero_()
            self.r2_log.fill_(math.log(self.r2_init))

    def score_bias(self, query_pos, key_pos):
        distance = (query_pos[:, None] - key_pos[None, :]).clamp(min=0).float()  # a later key: masked anyway
        r1, r2 = self.r1_log.exp()[:, None, None], self.r2_log.exp()[:, None, None]
        return (-r1 * torch.log1p(r2 * distance))[None]  # (1, n_head, n_query, n_key)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """The fork's one edit, made here: its name in the registry (every reader reads it when called)."""
    monkeypatch.setitem(positions.POSITION_MODULES, NAME, KerpleLog)
    monkeypatch.setattr(positions, "POS_SCHEMES", tuple(positions.POSITION_MODULES))


@pytest.fixture
def run(tmp_path):
    """A two-step pos=kerple run with its setting at 0.5."""
    out_dir = tmp_path / "kerple"
    train.main([*TINY_RUN, f"--pos={NAME}", f"--{SETTING}=0.5", f"--out_dir={out_dir}"])
    return out_dir


def tiny_model(r2_init=0.5):
    config = GPTConfig.from_flat(pos=NAME, block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16,
                                 kerple_r2_init=r2_init)  # fmt: skip
    return GPT(config).eval()


def test_its_bias_is_minus_r1_log_of_one_plus_r2_times_the_distance():
    scheme = tiny_model(0.5).transformer.wpe
    bias = scheme.score_bias(torch.arange(4), torch.arange(4))[0, 0]
    assert torch.allclose(bias[3, 0], torch.tensor(-math.log(1 + 0.5 * 3))) and bias[2, 2] == 0


def test_cached_sampling_matches_the_reference_and_the_uncached_logits():
    torch.manual_seed(0)
    model = tiny_model()
    prompt = torch.randint(0, 32, (2, 5), generator=torch.Generator().manual_seed(3))
    reference = model.generate(prompt, 4 * 8, temperature=0)
    assert torch.equal(generate_cached(model, prompt, 4 * 8, temperature=0), reference)
    idx = reference[:, :12]
    model.setup_cache(2, 12)
    stepped = torch.cat([model(idx[:, t : t + 1], input_pos=torch.tensor([t]))[0] for t in range(12)], dim=1)
    torch.testing.assert_close(stepped, model(idx)[0], rtol=0, atol=1e-5)


def test_help_lists_its_setting_in_a_group_of_its_own(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse's line breaks undone
    assert exit_info.value.code == 0
    assert f"pos={NAME}'s settings:" in out and f"--{SETTING} " in out and "(> 0; default: 1.0)" in out


def test_it_trains_and_its_checkpoint_records_and_restores_its_setting(run):
    ckpt = load_checkpoint(run / "ckpt.pt")
    assert ckpt["model_config"]["pos"] == NAME and ckpt["model_config"]["pos_settings"] == {SETTING: 0.5}
    assert {"transformer.wpe.r1_log", "transformer.wpe.r2_log"} <= set(ckpt["model"])
    model, _, _ = open_model(run)
    assert model.config.pos_settings == KerpleLog.Settings(kerple_r2_init=0.5)
    torch.testing.assert_close(model.transformer.wpe.r1_log, ckpt["model"]["transformer.wpe.r1_log"])
    loaded, samples, _ = sample.main([f"--out_dir={run}", "--max_new_tokens=20", "--stream=false"])
    assert len(samples[0]) == 21 and loaded.model.config.pos == NAME


def test_init_from_its_checkpoint_keeps_its_setting(run, tmp_path):
    out_dir = tmp_path / "longer"
    train.main([*TINY_RUN, f"--init_from={run}", "--block_size=16", f"--out_dir={out_dir}"])
    config = load_checkpoint(out_dir / "ckpt.pt")["model_config"]
    assert (config["pos"], config["block_size"], config["pos_settings"]) == (NAME, 16, {SETTING: 0.5})


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            [f"--pos={NAME}", "--rope_base=5"],
            f"rope_base=5.0 is a setting of pos=rope; this model has pos={NAME}",
        ),
        ([f"--pos={NAME}", "--rope_base=10000"], "rope_base=10000.0 is a setting of pos=rope"),  # the default
        (
            ["--pos=fire", f"--{SETTING}=2"],
            f"{SETTING}=2.0 is a setting of pos={NAME}; this model has pos=fire",
        ),
        ([f"--pos={NAME}", f"--{SETTING}=0"], f"{SETTING} must be > 0, got 0.0"),
    ],
)
def test_a_setting_of_another_scheme_or_out_of_bounds_is_one_line(capsys, tmp_path, argv, words):
    err = error_line(capsys, train, [*TINY_RUN, *argv, f"--out_dir={tmp_path / 'run'}"], 2)
    assert words in err, err


def test_it_trains_with_s2_attn_and_lora(tmp_path):
    base, out_dir = tmp_path / "base", tmp_path / "fine_tuned"
    train.main([*TINY_RUN, f"--pos={NAME}", "--block_size=16", f"--out_dir={base}"])  # the run to fine-tune
    argv = [*TINY_RUN, f"--init_from={base}", *FINE_TUNE, f"--out_dir={out_dir}"]
    result = finetune.main(argv)  # python -m lab.finetune: train.py's run with S²-Attn and LoRA
    assert result["iter_num"] == 2 and all(math.isfinite(loss) for loss in result["losses"].values())
    ckpt = load_checkpoint(out_dir / "ckpt.pt")
    assert ckpt["model_config"]["pos_settings"] == {SETTING: 1.0} and ckpt["train_config"]["lora_rank"] == 2
