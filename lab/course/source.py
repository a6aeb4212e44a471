"""Function bodies found by qualname ("LearnedPositions.reserve") in a module's syntax tree: where a body
starts (after its docstring) and ends, to replace it by a stub or put a solved one back. Lines are replaced
whole, so everything else stays byte for byte."""

import ast
import io
import json
import re
import tokenize


class SourceError(Exception):
    """The table names a function the source does not define, or one that cannot be cut out."""


def split_lines(text):
    """Lines with their endings, as the syntax tree counts them."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def find_function(tree, qualname):
    """The def of `qualname` ("f", "Class.method") among the module's top-level statements."""
    node, names = tree, qualname.split(".")
    for depth, name in enumerate(names):
        last = depth == len(names) - 1
        kinds = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in node.body if isinstance(n, kinds) and n.name == name), None)
        if node is None:
            raise SourceError(f"no {'function' if last else 'class'} {name!r} on the way to {qualname}")
    return node


def body_span(text, qualname):
    """(start, end, indent), 0-based: lines[start:end] are the body after the docstring (or the header), with
    the comments that close it; indent is the body's."""
    node = find_function(ast.parse(text), qualname)
    lines, first = split_lines(text), node.body[0]
    indent = re.match(r"[ \t]*", lines[first.lineno - 1]).group()
    if first.lineno == node.lineno or first.col_offset != len(indent):
        shared = "its body shares a line with its def or its docstring"
        raise SourceError(f"{qualname}: {shared}; one statement a line")
    documented = ast.get_docstring(node) is not None
    start = first.end_lineno if documented else first.lineno - 1
    while not documented and lines[start - 1].strip()[:1] in ("", "#"):  # and the comments above it
        start -= 1
    end = node.body[-1].end_lineno if len(node.body) > 1 or not documented else start
    for j in range(end, len(lines)):  # comments at the body's depth after its last statement belong to it
        stripped = lines[j].strip()
        if stripped.startswith("#") and lines[j].startswith(indent):
            end = j + 1
        elif stripped:
            break
    return start, end, indent


def body_lines(text, qualname):
    start, end, _ = body_span(text, qualname)
    return split_lines(text)[start:end]


def replace_bodies(text, bodies):
    """The source with the body of each qualname in `bodies` replaced by its lines (ending in newlines)."""
    # from the end, so that the spans before keep their line numbers (defs in classes never nest)
    spans = sorted(((*body_span(text, q)[:2], q) for q in bodies), reverse=True)
    lines = split_lines(text)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"  # so that a body replaced at the very end still ends its line
    for start, end, qualname in spans:
        lines[start:end] = bodies[qualname]
    return "".join(lines)


def stub_line(indent, message):
    return f"{indent}raise NotImplementedError({json.dumps(message)})\n"


def telling_lines(lines, shortest=24):
    """The body's lines of code (comments dropped, spaces collapsed) long enough that one quoted elsewhere
    gives the body away: `return x` is everywhere, `x1 * cos - x2 * sin` is not."""
    code = []
    for line in lines:
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
        except (tokenize.TokenError, SyntaxError):  # a line inside a longer statement
            tokens = []
        comment = next((t.start[1] for t in tokens if t.type == tokenize.COMMENT), len(line))
        code.append(" ".join(line[:comment].split()))
    return [text for text in code if len(text) >= shortest]
