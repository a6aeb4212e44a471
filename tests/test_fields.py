"""Every rule declared once (plumbing/fields.py): a bad value of each bounded or chosen field of each config,
and of each scheme's settings, is refused in one line naming it and what is valid; --help says each rule."""

import dataclasses
import re

import pytest

import sample
import train
from lab import eval_length
from lab.perf import bench
from model import GPTConfig
from plumbing.fields import check_fields, choices_of, rule_text, setting
from positions import POSITION_MODULES

# each config with its defaults (EvalConfig needs its checkpoints), and the entry point whose --help shows it
CONFIGS = {
    "TrainConfig": (lambda: train.TrainConfig(), train.main),
    "GPTConfig": (lambda: GPTConfig(), train.main),
    "SampleConfig": (lambda: sample.SampleConfig(), sample.main),
    "EvalConfig": (lambda: eval_length.EvalConfig(checkpoints=["out/x"]), eval_length.main),
    "BenchConfig": (lambda: bench.BenchConfig(), bench.main),
} | {f"{name}.Settings": (scheme.Settings, train.main) for name, scheme in POSITION_MODULES.items()}


def ruled(config):
    return [f for f in dataclasses.fields(config) if f.metadata.get("rule")]


def bad_values(f):
    """Values just outside f's rule: one past each bound, a name not among its choices, an empty path."""
    rule, whole = f.metadata["rule"], "int" in str(f.type) and "float" not in str(f.type)
    step = 1 if whole else 0.5
    bad = [rule["at_least"] - step] if "at_least" in rule else []
    bad += [rule["above"]] if "above" in rule else []
    bad += [rule["below"]] if "below" in rule else []
    bad += [rule["at_most"] + step] if "at_most" in rule else []
    bad += ["no-such-choice"] if choices_of(f) is not None else []
    bad += [""] if rule.get("path") else []
    return [[value] if "list" in str(f.type) else value for value in bad]


CASES = [
    pytest.param(name, f.name, value, id=f"{name}.{f.name}={value}")
    for name, (make, _) in CONFIGS.items()
    for f in ruled(make())
    for value in bad_values(f)
]


def test_every_config_has_rules_to_check():
    assert {name for name, _, _ in (case.values for case in CASES)} == set(CONFIGS) - {"none.Settings"} - {
        f"{name}.Settings" for name, scheme in POSITION_MODULES.items() if not ruled(scheme.Settings)
    }


@pytest.mark.parametrize("config, name, value", CASES)
def test_a_value_outside_a_fields_rule_is_one_line_naming_it(config, name, value):
    """check_fields refuses it, and so does building the config with it (its checks call check_fields)."""
    good = CONFIGS[config][0]()
    f = next(f for f in dataclasses.fields(good) if f.name == name)
    bad = object.__new__(type(good))
    bad.__dict__.update(vars(good) | {name: value})
    with pytest.raises(ValueError) as raised:
        check_fields(bad)
    message = str(raised.value)
    named = message.lstrip("-").startswith(name)  # --threads=..., --out_dir: a flag's own words
    assert "\n" not in message and named and rule_text(f).split(",")[0] in message, message
    with pytest.raises(ValueError, match=re.escape(message)):
        dataclasses.replace(good, **{name: value})


@pytest.mark.parametrize(
    "value, words", [(0, "batch_size must be >= 1 (a positive integer), got 0"), ("x", None)]
)
def test_the_wording_names_the_bound_and_the_choices(value, words):
    @dataclasses.dataclass
    class Config:
        batch_size: int = setting(12, "sequences", at_least=1)
        dtype: str = setting("auto", "autocast", choices=("auto", "float32"))
        dropout: float = setting(0.0, "p", at_least=0, below=1)

    config = Config()
    config.batch_size, config.dtype, config.dropout = (value, "auto", 0.0) if words else (12, value, 0.0)
    with pytest.raises(ValueError, match=re.escape(words or "dtype='x' is not one of auto, float32")):
        check_fields(config)
    config.batch_size, config.dtype, config.dropout = 12, "auto", 1.0
    with pytest.raises(ValueError, match=re.escape("dropout must be in [0, 1), got 1.0")):
        check_fields(config)


def flag_help(main, capsys):
    """{flag name: its --help text, whitespace collapsed} of an entry point."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    return {
        m[1]: m[2]
        for m in re.finditer(r"(?:^| )--(\w+) (?:\[?[A-Z_.]+\]? ?)*(.*?(?:default: [^)]*\)))", text)
    }


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_fields_rule_appears_in_its_help(config, capsys):
    make, main = CONFIGS[config]
    helps = flag_help(main, capsys)
    for f in filter(rule_text, ruled(make())):  # a path's rule, or a check function's, has no words
        if not (main is train.main and f.name == "vocab_size"):  # train.py's: the dataset's, no flag
            assert rule_text(f) in helps[f.name], (f.name, helps.get(f.name))
