"""
Command-line flags for every script, from its config dataclasses: one syntax, one kind of error.

Each field of a config dataclass is a flag `--name=value` (or `--name value`), its help text the comment after
the field. `--config FILE.toml` reads the same settings from TOML files (data, never executed), in the order
given, and flags override them. A mistake (an unknown flag, an abbreviation, a bad or non-finite value, an
unknown key in a file) stops the script before any work with exit status 2 and one line naming what is valid.

    values = parse_flags(argv, "sample.py", __doc__, [("sampling", SampleConfig, None)])
    with one_line_errors("sample.py"):        # each entry point's main, once
        cfg = SampleConfig(**values)          # its own checks (ValueError): one line, status 2 too
"""

import sys

# before tomllib's import fails with a traceback
if sys.version_info < (3, 11):  # noqa: UP036
    sys.exit(f"posgpt needs Python 3.11 or newer (for tomllib); this is Python {sys.version.split()[0]}")

import argparse
import difflib
import inspect
import json
import math
import re
import tomllib
import typing
from dataclasses import MISSING, fields

from plumbing.errors import UserError, one_line_errors  # noqa: F401 (one_line_errors: the handler)


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print the whole usage block; raise so the caller prints one line
        raise UserError(message, 2)


# -----------------------------------------------------------------------------
# Values

BOOLEANS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(("false", "0", "no", "off"), False)


def parse_bool(text):
    """true/false, 1/0, yes/no, on/off in any case (`--compile=False` as nanoGPT writes it)."""
    if text.lower() not in BOOLEANS:
        raise argparse.ArgumentTypeError(
            f"expected a boolean (true/false, 1/0, yes/no, on/off), got {text!r}"
        )
    return BOOLEANS[text.lower()]


def parse_int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def parse_float(text):
    # float, not int: `--dropout=0` is 0.0; nan and inf are refused, as every range check lets a NaN through
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def parse_list(name, text, choices, everything=None):
    """A comma-separated value naming some of `choices`, each once -> tuple; `everything` names all."""
    if everything is not None and text == everything:
        return tuple(choices)
    items = tuple(text.split(","))
    if any(item not in choices for item in items) or len(set(items)) < len(items):
        either = f"{everything}, or " if everything is not None else ""
        raise ValueError(
            f"{name}={text!r}: give {either}one or more of {', '.join(choices)}, comma-separated and "
            "each once"
        )
    return items


def flag_kind(annotation):
    """(kind, argparse type, is_list) for a field annotated int, float, bool, str, list[...] or one | None."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is list:
        return flag_kind(args[0])[:2] + (True,)
    kind = next((t for t in args if t is not type(None)), annotation)
    convert = {bool: parse_bool, int: parse_int, float: parse_float}.get(kind, str)
    if type(None) not in args:
        return kind, convert, False
    return kind, lambda text: None if text.lower() == "none" else convert(not_empty(text)), False


def not_empty(text):
    # `--lengths=` would be taken for the default: say so instead
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "is empty (an unset shell variable?): give a value or leave the flag out"
        )
    return text


SEED_RANGE = range(2**63)  # what torch, numpy and Python all take (torch.manual_seed: 64 bits, numpy: >= 0)


def check_seed(name, value):
    """A usage UserError unless a seed (the flag `name`) lies in SEED_RANGE."""
    if value is not None and value not in SEED_RANGE:
        raise UserError(f"--{name}={value}: a seed is a whole number from 0 to 2**63 - 1", 2)


def field_comments(config_class):
    """{field: the comment after it} from the class's source: the --help text."""
    try:
        source = inspect.getsource(config_class)
    except (OSError, TypeError):  # no source (a frozen app): flags without help
        return {}
    return dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.+)$", source, re.MULTILINE))


def field_defaults(config_class):
    """{field: default} of the fields that have one."""
    given = [f for f in fields(config_class) if f.default is not MISSING or f.default_factory is not MISSING]
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in given}


# -----------------------------------------------------------------------------
# Flags and config files


def field_names(sections):
    return [name for _, cls, names in sections for name in (names or [f.name for f in fields(cls)])]


def build_parser(prog, description, sections, defaults, choices, positional):
    """One flag per field (sections: (title, dataclass, field names or None)), defaults SUPPRESSed so
    that parsing sees only what was given, to layer flags over the config files."""
    parser = ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --n_lay=2 is a typo, not --n_layer
        argument_default=argparse.SUPPRESS,
    )
    if "config" not in field_names(sections):  # a script whose own setting is called config has no files
        help_text = "read settings from a TOML file (several: in order, each overriding the ones before)"
        parser.add_argument("--config", metavar="FILE.toml", action="append", help=help_text)
    for title, config_class, names in sections:
        group = parser.add_argument_group(title)
        comments = field_comments(config_class)
        for name, annotation in typing.get_type_hints(config_class).items():
            if names is not None and name not in names:
                continue
            kind, convert, is_list = flag_kind(annotation)
            valid = choices.get(name)
            if valid is not None and type(None) in typing.get_args(annotation):
                valid = (*valid, None)
            kwargs = dict(nargs="?", const=True, metavar="BOOL") if kind is bool else {}  # `--compile`: true
            if is_list:
                kwargs = dict(nargs="+" if name in positional else "*", metavar=name.upper())
            help_text = f"{comments.get(name, '')} (default: {defaults.get(name)})".lstrip()
            flag = name if name in positional else f"--{name}"
            group.add_argument(flag, type=convert, choices=valid, help=help_text, **kwargs)
    return parser


def read_toml(path):
    """The table in a TOML file (skipping a UTF-8 byte-order mark, as some Windows editors write one); a
    missing or malformed file is a usage UserError."""
    try:
        with open(path, "rb") as f:
            return tomllib.loads(f.read().decode("utf-8-sig"))
    except OSError as e:
        raise UserError(f"--config {path}: {e.strerror}", 2) from None
    except UnicodeDecodeError:  # before TOMLDecodeError, a ValueError too that would not name the file
        raise UserError(f"--config {path}: not UTF-8 text, as a TOML file must be", 2) from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"--config {path}: not valid TOML: {e}", 2) from None


def read_config_file(parser, path, valid, foreign_keys=False):
    """A TOML file's settings, checked by the flags' parser; foreign_keys: ignore keys that are no flag."""
    table = read_toml(path)
    unknown = [key for key in table if key not in valid]
    if foreign_keys:
        table = {key: value for key, value in table.items() if key in valid}
    elif unknown:
        raise UserError(
            f"{path}: unknown key {', '.join(map(repr, unknown))}; valid keys: {', '.join(valid)}", 2
        )
    for key, value in table.items():
        if not isinstance(value, (str, int, float, bool)):
            raise UserError(f"{path}: {key} must be a string, number or boolean, got {value!r}", 2)
    try:  # through the flags' own converters and choices, so a file can't hold what a flag couldn't
        return vars(parser.parse_args([f"--{key}={value}" for key, value in table.items()]))
    except UserError as e:
        raise UserError(f"{path}: {e}", 2) from None


def explain(message, valid):
    """Add the valid flags to argparse's `unrecognized arguments` (and a guess at the one meant)."""
    if not message.startswith("unrecognized arguments"):
        return message
    given = message.split(":", 1)[1].split()[0].split("=")[0]
    guess = difflib.get_close_matches(given, valid, n=1, cutoff=0.7)
    hint = f" (did you mean {guess[0]}?)" if guess else ""
    return f"{message}{hint}; valid flags: {' '.join(valid)}"


def parse_flags(
    argv, prog, description, sections, defaults=None, choices=None, positional=(), foreign_keys=False
):
    """{field: value}: the dataclass defaults, then `defaults`, then each --config file, then argv's flags
    (sys.argv[1:] when None). A mistake exits with status 2 and one line naming the valid choices."""
    values = {}
    for _, config_class, names in sections:
        values |= {k: v for k, v in field_defaults(config_class).items() if names is None or k in names}
    values |= dict(defaults or {})
    parser = build_parser(prog, description, sections, values, choices or {}, positional)
    names = field_names(sections)
    valid = [name for name in names if name not in positional]
    with one_line_errors(prog):
        try:
            flags = vars(parser.parse_args(argv))
        except UserError as e:
            raise UserError(explain(str(e), [f"--{name}" for name in ["config", *valid]]), 2) from None
        from_files = {}
        if "config" in flags and "config" not in names:
            # files hold flags only: checked by a parser without the positionals
            file_sections = [(title, config_class, valid) for title, config_class, _ in sections]
            file_parser = build_parser(prog, description, file_sections, values, choices or {}, ())
            for path in flags.pop("config"):
                from_files |= read_config_file(file_parser, path, valid, foreign_keys)
        values |= from_files | flags
        for name in [name for name in values if name == "seed" or name.endswith("_seed")]:
            check_seed(name, values[name])
    return values


# LongRoPE's factors file: Hugging Face's rope_scaling keys (a Phi-3 config's block pastes in), and n-hat
ROPE_FACTORS_KEYS = ("type", "rope_type", "factor", "short_factor", "long_factor",
                     "original_max_position_embeddings", "attention_factor", "keep_first")  # fmt: skip


def read_rope_factors(path):
    """--rope_factors FILE (JSON) -> the GPTConfig fields of LongRoPE; anything else is a one-line UserError.
    short_factor and long_factor are required; GPTConfig then checks their count (one per rotated pair) and
    values (>= 1)."""
    where = f"--rope_factors {path}"
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)
    except OSError as e:
        raise UserError(f"{where}: {e.strerror}", 2) from None
    except ValueError as e:  # not UTF-8, or not JSON
        raise UserError(f"{where}: not a JSON file ({e})", 2) from None
    if not isinstance(table, dict):
        raise UserError(f"{where}: a JSON object of {', '.join(ROPE_FACTORS_KEYS)}", 2)
    if unknown := [key for key in table if key not in ROPE_FACTORS_KEYS]:
        raise UserError(
            f"{where}: unknown key {', '.join(unknown)}; valid keys: {', '.join(ROPE_FACTORS_KEYS)}", 2
        )
    if missing := [key for key in ("short_factor", "long_factor") if key not in table]:
        raise UserError(f"{where}: missing {' and '.join(missing)}, a list of factors per rotated pair", 2)
    kind = table.get("type", table.get("rope_type", "longrope"))
    if kind not in ("longrope", "su"):  # "su": Phi-3's first name for it
        raise UserError(f"{where}: type {kind!r} is not longrope", 2)
    number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    for key in ("short_factor", "long_factor"):
        if not isinstance(table[key], list) or not all(number(v) for v in table[key]):
            raise UserError(f"{where}: {key} must be a list of numbers, got {table[key]!r}", 2)
    fields_of = dict(short_factor="rope_short_factor", long_factor="rope_long_factor", factor="rope_factor",
                     original_max_position_embeddings="rope_original_len",
                     attention_factor="rope_attention_factor", keep_first="rope_keep_first")  # fmt: skip
    for key in ("factor", "attention_factor", "original_max_position_embeddings", "keep_first"):
        whole = key in ("original_max_position_embeddings", "keep_first")
        value = table.get(key)
        if value is not None and not (number(value) and (not whole or isinstance(value, int))):
            raise UserError(f"{where}: {key} must be a {'whole ' if whole else ''}number, got {value!r}", 2)
    settings = {
        fields_of[key]: value for key, value in table.items() if key in fields_of and value is not None
    }
    return settings | dict(rope_scaling="longrope")
