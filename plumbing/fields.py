"""Settings declared once: a config dataclass's field made with setting() carries its --help text and its rule
(choices, bounds) in its metadata; check_fields checks every field of an instance by its rule and words each
refusal the same way, one line naming the setting and what is valid. plumbing/cli builds each flag's help and
choices from the same metadata. Standard library only: positions.py imports it.

    @dataclass
    class Config:
        batch_size: int = setting(12, at_least=1)  # sequences per micro-batch (the comment: its --help)
        dtype: str = setting("auto", "autocast", choices=("auto", "float32"))  # or the help given
        out_dir: str = setting("out", path=True)  # a path: "" (an unset shell variable) refused
        device: str = setting("auto", check=check_device_name)  # any rule a function words

        def __post_init__(self):
            check_fields(self)  # batch_size must be >= 1 (a positive integer), got 0
"""

import json
import math
import types
import typing
from dataclasses import MISSING, field, fields


def require(ok, message):
    """A config check: a one-line ValueError unless ok."""
    if not ok:
        raise ValueError(message)


# an empty path (`--out_dir=$OUT` with OUT unset) is refused: "" would name the current folder
EMPTY = "is empty (an unset shell variable?)"


def setting(
    default, help=None, *, choices=None, at_least=None, above=None, below=None, at_most=None, path=False,
    check=None,
):  # fmt: skip
    """A dataclass field: its default, its --help text (None: the comment after the field, as plumbing/cli
    reads it), and its rule: one of `choices` (a tuple, or a function returning one, read when checked: a
    registry that grows), or a number within the bounds (at_least <= v, above < v, v < below, v <= at_most);
    a list's items each. path: a file or folder name, never empty (a list of them: not empty either, nor
    any item). check: a function of the value raising a one-line ValueError (a device's name, --threads).
    None passes every rule."""
    rule = dict(choices=choices, at_least=at_least, above=above, below=below, at_most=at_most)
    rule = {name: bound for name, bound in rule.items() if bound is not None}
    rule |= dict(path=True) if path else {}
    rule |= dict(check=check) if check else {}
    metadata = dict(rule=rule) | ({} if help is None else dict(help=help))
    if isinstance(default, list):  # each instance its own copy
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def choices_of(f):
    """A field's choices (its rule's, the function's called), or None."""
    choices = f.metadata.get("rule", {}).get("choices")
    return tuple(choices()) if callable(choices) else choices


def rule_text(f):
    """A field's rule in words, as --help shows it and check_fields' errors say it: "one of a, b", ">= 1",
    "in [0, 1)"; "" for none."""
    rule = f.metadata.get("rule", {})
    if (choices := choices_of(f)) is not None:
        return f"one of {', '.join(map(str, choices))}"
    low = ("[", rule["at_least"]) if "at_least" in rule else ("(", rule["above"]) if "above" in rule else None
    high = ("]", rule["at_most"]) if "at_most" in rule else (")", rule["below"]) if "below" in rule else None
    if low and high:
        return f"in {low[0]}{low[1]:g}, {high[1]:g}{high[0]}"
    if low:
        return f"{'>=' if low[0] == '[' else '>'} {low[1]:g}"
    if high:
        return f"{'<=' if high[0] == ']' else '<'} {high[1]:g}"
    return ""


def field_error(f, value):
    """How value breaks field f's rule, one line naming it and what is valid, or None."""
    rule = f.metadata.get("rule", {})
    if value is None or not rule:
        return None
    values = value if isinstance(value, (list, tuple)) else [value]  # a list: each item
    if rule.get("path") and (error := path_error(f"--{f.name}", values)):
        return error
    if check := rule.get("check"):
        try:
            check(value)
        except ValueError as e:
            return str(e)
    if (choices := choices_of(f)) is not None:
        wrong = [v for v in values if v not in choices]
        return f"{f.name}={wrong[0]!r} is not one of {', '.join(map(str, choices))}" if wrong else None
    low, high = rule.get("at_least", rule.get("above")), rule.get("at_most", rule.get("below"))
    fits = lambda v: (
        (low is None or (v >= low if "at_least" in rule else v > low))
        and (high is None or (v <= high if "at_most" in rule else v < high))
    )
    if all(map(fits, values)):
        return None
    whole = (
        " (a positive integer)" if rule.get("at_least") == 1 and high is None and type(value) is int else ""
    )
    return f"{f.name} must be {rule_text(f)}{whole}, got {value}"


def path_error(name, paths):
    """How the paths given as `name` (a flag) break the path rule: none given, or one empty -> one line, or
    None."""
    if not paths or any(not str(path).strip() for path in paths):
        return f"{name} {EMPTY}: give a folder or file, or leave the flag out"
    return None


def check_fields(obj):
    """Check every field of the dataclass instance obj by its setting() rule: the first broken one a
    one-line ValueError."""
    for f in fields(obj):
        require(not (error := type_error(f, getattr(obj, f.name))), error)
        require(not (error := field_error(f, getattr(obj, f.name))), error)


# The types a field's annotation declares, each as a test and in words: int, float (an int too; NaN is no
# number), str, bool, list[one of them], or any of them | None; another (a dataclass, a dict) is not checked
TYPES = {
    bool: (lambda v: isinstance(v, bool), "a boolean"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v),
        "a number",
    ),
    str: (lambda v: isinstance(v, str), "a string"),
}


def type_test(annotation):
    """(test, words) of a value of this annotation, or None where it is none of TYPES' (or a list of one)."""
    if annotation in TYPES:
        return TYPES[annotation]
    if typing.get_origin(annotation) is list and (item := type_test(typing.get_args(annotation)[0])):
        test, words = item
        return (
            lambda v: isinstance(v, (list, tuple)) and all(map(test, v)),
            f"a list of {words.split(' ', 1)[1]}s",
        )
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        tests = [type_test(a) for a in typing.get_args(annotation) if a is not type(None)]
        if len(tests) == 1 and tests[0] and type(None) in typing.get_args(annotation):
            test, words = tests[0]
            return lambda v: v is None or test(v), f"{words} or None"
    return None


def type_error(f, value):
    """How value breaks field f's declared type, one line naming it and the type, or None."""
    test = type_test(f.type)
    if test is None or test[0](value):
        return None
    return f"{f.name} must be {test[1]}, got {value!r}"


def changed_fields(obj):
    """{name: value} of the dataclass instance obj's fields not at their default."""
    default = lambda f: f.default_factory() if f.default is MISSING else f.default
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) != default(f)}


def read_json(path, what):
    """A JSON file's object, each key once; anything else a one-line ValueError naming the path, what it was
    read as and Python's reason: `f.json: not a usable WHAT (JSONDecodeError: ...)`."""

    def unique(pairs):  # json keeps the last of a repeated key without a word
        keys = [key for key, _ in pairs]
        require(
            len(set(keys)) == len(keys),
            f"{sorted({k for k in keys if keys.count(k) > 1})} given more than once",
        )
        return dict(pairs)

    try:
        with open(path, encoding="utf-8-sig") as file:  # past a byte-order mark, as Windows editors write
            table = json.load(file, object_pairs_hook=unique)
        require(isinstance(table, dict), f"a JSON object of keys, got a {type(table).__name__}")
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"{path}: not a usable {what} ({type(e).__name__}: {e})") from None
    return table


def read_settings_file(obj, name, keys, what):
    """Read the JSON file that obj's field `name` names into obj's fields (keys: the file's key -> the field
    it sets, or None: a key read, not set), then set `name` to None: obj holds the values, not the path. A key
    not in keys, or a field the file sets that obj has at another value than its default and the file's, is a
    one-line ValueError. -> the file's table"""
    path = getattr(obj, name)
    table = read_json(path, what)
    unknown = [key for key in table if key not in keys]
    require(not unknown, f"{path}: unknown key {', '.join(unknown)}; valid keys: {', '.join(keys)}")
    setting_values = {keys[key]: value for key, value in table.items() if keys[key] is not None}
    explicit = changed_fields(obj)
    twice = [n for n, value in setting_values.items() if n in explicit and explicit[n] != value]
    sets, given = (" and ".join(f"{n}={values[n]!r}" for n in twice) for values in (setting_values, explicit))
    require(not twice, f"{name}={path} sets {sets}: drop {given}, given too (each in one place)")
    for field_name, value in setting_values.items():
        setattr(obj, field_name, value)
    setattr(obj, name, None)
    return table
