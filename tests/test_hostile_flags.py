"""Flags and small files that cannot work are one line, a non-zero exit and no traceback, or the right result:
dataset names, seeds, empty values, a UTF-16 text, a preset with a byte-order mark, a student copy's marker,
a passkey dataset too large to draw, --wandb without a login, a default prompt outside the vocabulary. Each
case runs through the real entry point, main(argv) in-process."""

import json
import sys
from dataclasses import asdict, replace

import pytest
import torch
from helpers import TINY_RUN

import lab.course.__main__ as course_main
import sample
import train
from data.common import DATA_ROOT, ensure_prepared, load_meta
from data.passkey import prepare as passkey_prepare
from data.text import prepare as text_prepare
from lab import eval_length
from lab.finetune import __main__ as finetune
from model import GPT, GPTConfig

HUGE_SEED = str(2**64)
RUN = [*TINY_RUN, "--out_dir={never}"]
LONGER = "searched for an original length of 32 tokens (original_max_position_embeddings) but"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path}: a tiny untrained run on a vocabulary without a newline, a UTF-16 text, a student copy
    whose marker is a list."""
    folder = tmp_path_factory.mktemp("hostile")
    meta = load_meta(ensure_prepared("shakespeare_char"))
    meta["chars"] = ["\u00e9" if c == "\n" else c for c in meta["chars"]]
    config = GPTConfig.from_flat(block_size=16, vocab_size=meta["vocab_size"], n_layer=1, n_head=2, n_embd=16)
    (folder / "run").mkdir()
    torch.save(
        {"model": GPT(config).state_dict(), "model_config": asdict(config), "meta": meta},
        folder / "run" / "ckpt.pt",
    )
    (folder / "utf16.txt").write_bytes(("to be or not to be\n" * 100).encode("utf-16"))
    (folder / "copy").mkdir()
    (folder / "copy" / ".course.json").write_text(json.dumps(["ex1"]))
    (folder / "rope").mkdir()  # the shakespeare_char vocabulary, head_dim 8: LongRoPE's 4 pairs
    meta = load_meta(ensure_prepared("shakespeare_char"))
    config = replace(config, vocab_size=meta["vocab_size"])
    state = {"model": GPT(config).state_dict(), "model_config": asdict(config), "meta": meta}
    torch.save(
        state | {"train_config": {"dataset": "shakespeare_char", "max_iters": 0}}, folder / "rope" / "ckpt.pt"
    )
    factors = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "factor": 4.0}
    for name, table in [
        ("factors", factors | {"original_max_position_embeddings": 16}),
        ("longer", factors | {"original_max_position_embeddings": 32}),
        ("three", factors | {"short_factor": [1.0] * 3}),
    ]:
        (folder / f"{name}.json").write_text(json.dumps(table))
    (folder / "twice.json").write_text(json.dumps(factors)[:-1] + ', "factor": 8.0}')
    files = {name: folder / f"{name}.json" for name in ("factors", "longer", "three", "twice")}
    never = folder / "never"  # an out_dir no refused run may create
    return (
        files
        | {"run": folder / "run", "utf16": folder / "utf16.txt", "copy": folder / "copy"}
        | {"rope": folder / "rope", "never": never}
    )


# (case, entry point, argv ({name} a path of files), exit status, words the line must hold)
CASES = [
    ("empty dataset name", text_prepare, ["--input={utf16}", "--name="], 2, "plain folder name"),
    ("hidden dataset name", text_prepare, ["--input={utf16}", "--name=.x"], 2, "plain folder name"),
    ("dataset name a path", text_prepare, ["--input={utf16}", "--name=a/b"], 2, "plain folder name"),
    ("passkey name a path", passkey_prepare, ["--name=../x"], 2, "plain folder name"),
    ("train on a hidden dataset", train, [*TINY_RUN, "--dataset=.x"], 1, "unknown dataset '.x'"),
    ("UTF-16 text", text_prepare, ["--input={utf16}", "--name=never"], 2, "iconv -f utf-16 -t utf-8"),
    ("seed past 64 bits", sample, ["--out_dir={run}", f"--seed={HUGE_SEED}"], 2, "a seed is a whole number"),
    ("negative seed", train, [*TINY_RUN, "--seed=-1"], 2, "a seed is a whole number"),
    ("negative passkey seed", passkey_prepare, ["--seed=-1"], 2, "a seed is a whole number"),
    (
        "eval passkey seed",
        eval_length,
        ["{run}", f"--passkey_seed={HUGE_SEED}"],
        2,
        "a seed is a whole number",
    ),
    ("empty lengths", eval_length, ["{run}", "--lengths="], 2, "--lengths: is empty"),
    ("empty init_from", train, [*TINY_RUN, "--init_from="], 2, "is empty"),
    ("passkey too large", passkey_prepare, ["--train_samples=1000000000"], 2, "needs about"),
    ("marker not an object", course_main, ["grade", "{copy}"], 2, ".course.json: not the marker"),
    ("threads above the cores", train, [*RUN, "--threads=1000"], 2, "--threads=1000: give auto or a number"),
    (
        "threads past 64 bits",
        sample,
        ["--out_dir={rope}", "--threads=99999999999999999999"],
        2,
        "--threads=9",
    ),
    ("threads past 64 bits, eval", eval_length, ["{rope}", f"--threads={HUGE_SEED}"], 2, "--threads="),
    ("factors key twice", sample, ["--out_dir={rope}", "--rope_factors={twice}"], 2, "given more than once"),
    (
        "factors beside yarn",
        train,
        [*RUN, "--rope_factors={factors}", "--rope_scaling=yarn"],
        2,
        "drop rope_scaling=yarn",
    ),
    (
        "factors beside yarn, sample",
        sample,
        ["--out_dir={rope}", "--rope_factors={factors}", "--rope_scaling=yarn"],
        2,
        "drop rope_scaling=yarn",
    ),
    (
        "factors beside a factor, sample",
        sample,
        ["--out_dir={rope}", "--rope_factors={factors}", "--rope_factor=2"],
        2,
        "drop rope_factor=2",
    ),
    (
        "factors beside a factor",
        train,
        [*RUN, "--rope_factors={factors}", "--rope_factor=2"],
        2,
        "drop rope_factor=2",
    ),
    (
        "factors of another length, init_from",
        train,
        [*RUN, "--init_from={rope}", "--block_size=64", "--rope_factors={longer}"],
        2,
        LONGER,
    ),
    ("factors of another length, sample", sample, ["--out_dir={rope}", "--rope_factors={longer}"], 2, LONGER),
    (
        "factors of another length, eval",
        eval_length,
        ["{rope}", "--rope_factors={longer}"],
        2,
        "gives no checkpoint a longrope row: {rope} (T = 16, the factors were searched for 32)",
    ),
    ("factors of another count, eval", eval_length, ["{rope}", "--rope_factors={three}"], 2, "on {rope}: "),
    ("lora_train twice", finetune, [*RUN, "--lora_rank=2", "--lora_train=embed,embed"], 2, "each once"),
    (
        "lora_rank above n_embd",
        finetune,
        [*RUN, "--lora_rank=1000"],
        2,
        "--lora_rank=1000 is above n_embd=16",
    ),
]


@pytest.mark.parametrize("case, script, argv, status, words", CASES, ids=[c[0] for c in CASES])
def test_a_hostile_flag_or_file_is_one_line(capsys, files, case, script, argv, status, words):
    before = sorted(p.name for p in DATA_ROOT.iterdir())
    with pytest.raises(SystemExit) as exit_info:
        script.main([arg.format(**files) for arg in argv])
    out, err = capsys.readouterr()
    err = err.strip()
    assert exit_info.value.code == status and err.count("\n") == 0 and "Traceback" not in err, err
    assert "error: " in err and words.format(**files) in err, err
    assert sorted(p.name for p in DATA_ROOT.iterdir()) == before
    assert not files["never"].exists() and "threads: " not in out, out  # no run, no evaluation started


def test_a_preset_with_a_byte_order_mark_is_read(tmp_path):
    """A TOML preset saved by an editor that writes a UTF-8 byte-order mark first reads as without it."""
    preset = tmp_path / "bom.toml"
    preset.write_bytes(b"\xef\xbb\xbfmax_iters = 3\n")
    assert train.parse_args(["--config", str(preset)])[0].max_iters == 3


@pytest.mark.skipif(sys.platform == "win32", reason="~/.netrc")
def test_wandb_without_a_login_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """--wandb where wandb is installed but not logged in (no WANDB_API_KEY, no ~/.netrc entry) stops at once
    naming `wandb login` and WANDB_MODE=offline, instead of failing or prompting mid-run."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        train.main([*TINY_RUN, f"--out_dir={tmp_path / 'run'}", "--wandb"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and "wandb login" in err and "WANDB_MODE=offline" in err, err
    assert not (tmp_path / "run").exists()


def test_the_default_prompt_outside_the_vocabulary_is_named_as_the_default(files, capsys):
    """On a checkpoint whose vocabulary has no newline, sample.py without --start says that its default
    prompt, a newline, is not in the vocabulary: not that the user's prompt holds unknown characters."""
    with pytest.raises(SystemExit) as exit_info:
        sample.main([f"--out_dir={files['run']}", "--max_new_tokens=4"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 1 and "the default prompt, a newline, is not in" in err, err
    assert "give --start" in err and err.count("\n") == 0, err
