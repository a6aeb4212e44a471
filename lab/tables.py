"""What the measuring scripts write: markdown tables, CSV cells, the line saying how a table was measured, and
the generated blocks of docs/ that a study's code fills in."""

import platform
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def fmt(value, spec, missing=""):
    """A table's or CSV's cell: value formatted by spec (".4f", ",.0f"), `missing` for None."""
    return missing if value is None else format(value, spec)


# A block of a markdown page that code writes: <!-- generated: NAME -->, the text, <!-- end generated -->; the
# text may be empty and never holds another block's marker (a block never reaches into the next one)
BODY = r"((?:(?!<!-- (?:end )?generated).)*?)"  # the text: anything but a marker, lazily
GENERATED = re.compile(r"(<!-- generated: (\S+) -->\n)" + BODY + r"(\n?<!-- end generated -->)", re.S)


def generated_blocks(text):
    """{name: text} of a markdown page's generated blocks."""
    return {name: body for _, name, body, _ in GENERATED.findall(text)}


def fill_generated(results, texts):
    """Where results is docs/: rewrite the generated blocks that texts ({name: text}) names, on every page of
    docs/ and the README."""
    fill = lambda m: f"{m[1]}{texts[m[2]]}\n<!-- end generated -->" if m[2] in texts else m[0]
    for page in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md"] if Path(results) == ROOT / "docs" else []:
        if (new := GENERATED.sub(fill, old := page.read_text(encoding="utf-8"))) != old:
            page.write_text(new, encoding="utf-8")
            print(f"wrote the generated blocks of {page}")


def measured(prog, argv, start, quick, threads=False):
    """A results table's last line: when, by which command, with what, in how long."""
    command = " ".join([prog, *(sys.argv[1:] if argv is None else argv)])
    on = platform.machine() + (f" with {torch.get_num_threads()} threads" if threads else "")
    line = f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `{command}`: torch {torch.__version__}, "
    minutes = (time.perf_counter() - start) / 60
    line += f"Python {platform.python_version()}, {on}; wall time {minutes:.1f} min"
    return line + (" (--quick: the numbers mean nothing)." if quick else ".")


def markdown_table(columns, rows):
    """A markdown table: the header row of `columns`, its rule, then one line per row of cell strings."""
    lines = ["| " + " | ".join(cells) + " |" for cells in [columns, *rows]]
    lines.insert(1, "|" + "---|" * len(columns))
    return "\n".join(lines)
