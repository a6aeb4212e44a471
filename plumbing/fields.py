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

from dataclasses import field, fields


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
        require(not (error := field_error(f, getattr(obj, f.name))), error)
