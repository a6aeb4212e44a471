"""Command-line flags for every script, from its config dataclasses: each field a flag `--name=value` (or
`--name value`), its help the comment after the field; `--config FILE.toml` reads the same settings from TOML
files (data, never executed), in order, under the flags. A mistake stops the script before any work with exit
status 2 and one line naming what is valid.

    values = parse_flags(argv, "sample.py", __doc__, [("sampling", SampleConfig, None)])
    with one_line_errors("sample.py"):        # each entry point's main, once
        cfg = SampleConfig(**values)          # its own checks (ValueError): one line, status 2 too
"""

import sys

if sys.version_info < (3, 11):  # noqa: UP036 - before tomllib's import fails with a traceback
    sys.exit(f"posgpt needs Python 3.11 or newer (for tomllib); this is Python {sys.version.split()[0]}")

import argparse
import dataclasses
import difflib
import inspect
import math
import re
import tomllib
import typing
from dataclasses import MISSING, fields
from pathlib import Path

from model import GPTConfig
from plumbing import hardware
from plumbing.errors import UserError, one_line_errors, reading
from plumbing.fields import EMPTY, choices_of, path_error, rule_text, setting
from positions import POSITION_MODULES


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message):
        # argparse would print the whole usage block; raise so the caller prints one line
        raise UserError(message, 2)


BOOLEANS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(("false", "0", "no", "off"), False)
EXPECTED = {bool: "a boolean (true/false, 1/0, yes/no, on/off)", int: "an integer", float: "a number"}


def parse_list(name, text, choices, everything=None):
    """A comma-separated value naming some of `choices`, each once -> tuple; `everything` names all."""
    if text == everything:
        return tuple(choices)
    items = tuple(text.split(","))
    if any(item not in choices for item in items) or len(set(items)) < len(items):
        either = f"{everything}, or " if everything else ""
        give = f"give {either}one or more of {', '.join(choices)}, comma-separated and each once"
        raise ValueError(f"{name}={text!r}: {give}")
    return items


def flag_options(name, annotation, choices, positional):
    """argparse's options for a field annotated int, float, bool, str, list[...] or one | None. A bool is
    true/false, 1/0, yes/no, on/off in any case (`--compile=False` as nanoGPT writes it), `--compile` alone
    true; a float is finite (a NaN passes every range check); an optional value is `none`, or not empty
    (`--lengths=`, from an unset shell variable, would be taken for the default), nor is a list's item
    (`--compare ''`: a path, read as the current folder); an optional list is None when not given, so that
    one given empty (`--compare` and nothing: an unset variable) can be refused."""
    lists = [t for t in typing.get_args(annotation) if typing.get_origin(t) is list]
    annotation = lists[0] if lists else annotation  # list[X] | None: a list flag whose default is None
    if is_list := typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    args = typing.get_args(annotation)
    kind, optional = next((t for t in args if t is not type(None)), annotation), type(None) in args

    def convert(text):
        if (optional or is_list) and not text.strip():
            raise argparse.ArgumentTypeError(f"{EMPTY}: give a value or leave the flag out")
        if optional and text.lower() == "none":
            return None
        if kind not in EXPECTED:
            return text
        try:
            value = BOOLEANS[text.lower()] if kind is bool else kind(text)
        except (KeyError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {EXPECTED[kind]}, got {text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        return value

    options = dict(type=convert, choices=(*choices, None) if choices and optional else choices)
    if is_list:
        return options | dict(nargs="+" if positional else "*", metavar=name.upper())
    return options | (dict(nargs="?", const=True, metavar="BOOL") if kind is bool else {})


def list_flag(sections, name):
    """Whether field `name` of sections' dataclasses is a list flag (list[X], or list[X] | None)."""
    hints = [typing.get_type_hints(config_class).get(name) for _, config_class, _ in sections]
    return any(list in (typing.get_origin(h), *map(typing.get_origin, typing.get_args(h))) for h in hints)


def threads_flag():
    """Every entry point's --threads field, checked by check_fields (hardware.check_threads); the entry point
    applies it with hardware.use_threads."""
    help_text = "CPU threads, at most the cores (more: refused); auto: the cores idle now, or OMP_NUM_THREADS"
    return setting("auto", help_text, check=hardware.check_threads)


def device_flag(default="auto", help=None):
    """Every entry point's --device field: auto or a device's name (hardware.check_device_name, by
    check_fields); whether this machine has it: machine_device, as the work starts. help: its --help (None:
    the comment after the field)."""
    return setting(default, help, check=hardware.check_device_name)


def machine_device(device):
    """The device a --device names on this machine (auto: cuda, then mps, then cpu), or a usage UserError
    where it lacks it: every entry point's, before its work."""
    device = hardware.resolve_device(device)
    hardware.check_device(device)
    return device


def check_seed(name, value):
    """A usage UserError unless a seed (the flag `name`) is one torch, numpy and Python all take."""
    if value is not None and value not in range(2**63):
        raise UserError(f"--{name}={value}: a seed is a whole number from 0 to 2**63 - 1", 2)


def not_empty(text):
    """A path flag's value (--config's), refused empty by the path rule (fields.path_error)."""
    if error := path_error("", [text]):
        raise argparse.ArgumentTypeError(error.lstrip())
    return text


def build_parser(prog, description, sections, defaults, choices, positional, with_config):
    """A flag per field, --config with with_config; defaults SUPPRESSed: parsing gives only what is given."""
    parser = ArgumentParser(
        prog=prog,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # --n_lay=2 is a typo, not --n_layer
        argument_default=argparse.SUPPRESS,
    )
    if with_config:
        help_text = "read settings from a TOML file (several: in order, each overriding the ones before)"
        parser.add_argument("--config", metavar="FILE.toml", action="append", help=help_text, type=not_empty)
    for title, config_class, names in sections:
        group = parser.add_argument_group(title)
        try:  # the comment after each field is its --help (none without source: a frozen app), or its help
            comments = dict(re.findall(r"^\s+(\w+): [^#\n]*#\s*(.+)$", inspect.getsource(config_class), re.M))
        except (OSError, TypeError):
            comments = {}
        comments |= {f.name: f.metadata["help"] for f in fields(config_class) if "help" in f.metadata}
        declared = {f.name: f for f in fields(config_class)}
        for name, annotation in typing.get_type_hints(config_class).items():
            if names is None or name in names:
                rule = rule_text(declared[name])  # a setting()'s choices or bounds
                said = f"{rule + '; ' if rule else ''}default: {defaults.get(name)}"
                help_text = f"{comments.get(name, '')} ({said})".lstrip()
                allowed = choices.get(name) or choices_of(declared[name])
                options = flag_options(name, annotation, allowed, name in positional)
                group.add_argument(name if name in positional else f"--{name}", help=help_text, **options)
    return parser


def model_sections(leave_out=("vocab_size",)):
    """plumbing.cli.parse_flags' sections of a model's flags: GPTConfig's fields, then each scheme's settings,
    a group each (the registry read now)."""
    gpt = [f.name for f in dataclasses.fields(GPTConfig) if f.name not in (*leave_out, "pos_settings")]
    schemes = [(f"pos={name}'s settings", scheme.Settings, None) for name, scheme in POSITION_MODULES.items()]
    return [("model", GPTConfig, gpt), *(section for section in schemes if dataclasses.fields(section[1]))]


def section_fields(sections):
    """The dataclass fields of parse_flags' sections, a flag each."""
    return [f for _, config_class, only in sections for f in fields(config_class)
            if only is None or f.name in only]  # fmt: skip


def section_names(sections):
    """The flags' names of parse_flags' sections."""
    return [f.name for f in section_fields(sections)]


def flags_elsewhere(sections):
    """Where the flags a command lacks live, as its config class says (a class attribute flags_elsewhere,
    e.g. train.py's config: the commands that train otherwise), or None: said after an unknown flag."""
    return next((c.flags_elsewhere for _, c, _ in sections if getattr(c, "flags_elsewhere", None)), None)


def read_text(path, where, status=2):
    """A file's UTF-8 text (past a byte-order mark, as Windows editors write), or a one-line UserError."""
    with reading(where, "UTF-8 text file", status=status):  # missing, a folder, unreadable, not UTF-8
        return Path(path).read_text(encoding="utf-8-sig")


def read_config_file(parser, path, valid, foreign_keys, elsewhere=None):
    """A TOML file's settings, checked by the flags' parser; foreign_keys: ignore keys that are no flag;
    elsewhere: where the flags this command lacks live, said after an unknown key (flags_elsewhere)."""
    with reading(f"--config {path}", "TOML preset", status=2):
        table = tomllib.loads(read_text(path, f"--config {path}"))
    if not foreign_keys and (unknown := ", ".join(repr(key) for key in table if key not in valid)):
        more = f" ({elsewhere})" if elsewhere else ""
        raise UserError(f"{path}: unknown key {unknown}; valid keys: {', '.join(valid)}{more}", 2)
    table = {key: value for key, value in table.items() if key in valid}
    for key, value in table.items():
        if not isinstance(value, (str, int, float, bool)):
            raise UserError(f"{path}: {key} must be a string, number or boolean, got {value!r}", 2)
    try:  # through the flags' own converters and choices, so a file can't hold what a flag couldn't
        return vars(parser.parse_args([f"--{key}={value}" for key, value in table.items()]))
    except UserError as e:
        raise UserError(f"{path}: {e}", 2) from None


def parse_flags(
    argv, prog, doc, sections, defaults=None, choices=None, positional=(), foreign_keys=False, given=None
):
    """{field: value}: the dataclass defaults, then `defaults`, then each --config file, then argv's flags
    (sys.argv[1:] when None); sections: (title, dataclass, its field names or None for all), each field's
    help and choices its setting()'s (choices: more, by name). given: a set, filled with the names a flag or
    a --config file gave. A mistake exits with status 2 and one line naming the valid choices; an unknown
    flag or key, the valid ones, then where others live (flags_elsewhere)."""
    names, choices, given = section_names(sections), choices or {}, set() if given is None else given
    values = {f.name: f.default_factory() if f.default is MISSING else f.default
              for f in section_fields(sections)
              if (f.default, f.default_factory) != (MISSING, MISSING)}  # fmt: skip
    values |= dict(defaults or {})
    valid = [name for name in names if name not in positional]
    files = "config" not in names  # a script whose own setting is called config has no files
    parser = build_parser(prog, doc, sections, values, choices, positional, files)
    elsewhere = flags_elsewhere(sections)
    with one_line_errors(prog):
        try:
            flags = vars(parser.parse_args(argv))
        except UserError as e:
            message, flag_names = str(e), [f"--{name}" for name in ["config", *valid]]
            if message.startswith("unrecognized arguments"):  # name the valid flags, and guess the one meant
                typo = message.split(":", 1)[1].split()[0].split("=")[0]
                guess = difflib.get_close_matches(typo, flag_names, n=1, cutoff=0.7)
                hint = f" (did you mean {guess[0]}?)" if guess else ""
                message += f"{hint}; valid flags: {' '.join(flag_names)}"
                message += f" ({elsewhere})" if elsewhere else ""
            elif positional and (taken := re.match(r"argument --(\w+): invalid choice", message)):
                if list_flag(sections, taken[1]):  # it took the words after it, a positional among them
                    message += f"; --{taken[1]} takes every word after it: give {positional[0]} before it"
            raise UserError(message, 2) from None
        if files and "config" in flags:  # a file's keys are flags (a positional is none)
            file_parser = build_parser(prog, doc, sections, values, choices, (), False)
            for path in flags.pop("config"):
                from_file = read_config_file(file_parser, path, valid, foreign_keys, elsewhere)
                values |= from_file
                given.update(from_file)
        values |= flags
        given.update(flags)
        for name, value in values.items():
            if name == "seed" or name.endswith("_seed"):
                check_seed(name, value)
    return values


def read_prompt(start):
    """sample.py's --start: the prompt itself, or FILE:path to a UTF-8 file holding it."""
    path = start.removeprefix("FILE:")
    if path == start:
        return start
    if error := path_error("--start=FILE:", [path]):  # "" would read as the current folder
        raise UserError(error, 2)
    return read_text(path, f"prompt file {path}", status=1)


def check_original_len(searched, original, what):
    """A usage UserError unless LongRoPE's factors (a --rope_factors file's) were searched for `original`
    tokens, the length they extend (searched None: any): factors searched for another length scale the wrong
    rotations."""
    if None not in (searched, original) and searched != original:
        was = f"--rope_factors: its factors were searched for an original length of {searched} tokens"
        fix = f"search factors for {original} (python -m lab.experiments.longrope)"
        raise UserError(f"{was} (original_max_position_embeddings) but {what} is {original}; {fix}", 2)
