"""README.md is true: every ```python block runs as pasted, and the option table
matches `pcbatch.autobatch`'s signature.

The blocks run in README order in one namespace, as a reader pasting them into one
session would (later blocks use names earlier ones define). A line whose comment
shows a value (`fib(...)   # Array([ 2, 13], dtype=int32)` or `# [12., 10.]`) must
evaluate to that value. A block that imports an optional package is skipped, with
the package named, only when that package is not installed.
"""
import ast
import importlib.util
import inspect
import os
import re
from pathlib import Path

import numpy as np
import pytest

import pcbatch

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(text):
    """(first line number, source) of each ```python block, in order."""
    blocks, lines, start = [], text.splitlines(), None
    for i, line in enumerate(lines):
        if start is None and line.strip() == "```python":
            start = i + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start + 1, "\n".join(lines[start:i]) + "\n"))
            start = None
    assert start is None, f"README.md: the ```python block at line {start} is never closed"
    return blocks


BLOCKS = python_blocks(README.read_text())


def missing_imports(source):
    """Top-level packages the block imports that are not installed."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


_NUMBER = re.compile(r"-?\d+\.?\d*(?:[eE][-+]?\d+)?")


def shown_values(source):
    """(line number in block, expression, numbers) for each line `expr  # value`,
    where the value is an array printout: `Array([...], ...)` or `[...]`."""
    lines = source.splitlines()
    shown = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Expr) or node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        comment = line[node.end_col_offset:].strip()
        match = re.match(r"#\s*(Array\(\[.*?\]|\[.*?\])", comment)
        if match:
            numbers = [float(x) for x in _NUMBER.findall(match.group(1))]
            shown.append((node.lineno, ast.get_source_segment(source, node), numbers))
    return shown


def test_readme_has_python_blocks():
    # Guards the parser: if it found nothing, the tests below would pass vacuously.
    assert len(BLOCKS) >= 5
    assert any(shown_values(src) for _, src in BLOCKS)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """One namespace for all blocks (a reader's session), run in a scratch
    directory (blocks may save files); records which blocks failed."""
    cwd = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("readme"))
    try:
        yield {"namespace": {"__name__": "__readme__"}, "failed": []}
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("line,source", BLOCKS, ids=[f"line{line}" for line, _ in BLOCKS])
def test_readme_block_runs(session, line, source):
    missing = missing_imports(source)
    if missing:
        pytest.skip(f"README.md line {line}: needs {', '.join(missing)}, not installed")
    if session["failed"]:
        pytest.skip(f"an earlier README block (line {session['failed'][0]}) failed; this one may need its names")
    namespace = session["namespace"]
    try:
        # pcbatch reads a function's source (inspect), so the block goes to a file, as
        # pasted into one; blank lines first, so line numbers in errors are README.md's.
        path = Path(f"README.md-line{line}.py").resolve()
        path.write_text("\n" * (line - 1) + source)
        exec(compile(path.read_text(), str(path), "exec"), namespace)
        for offset, expr, numbers in shown_values(source):
            value = eval(compile(expr, f"README.md:{line + offset - 1}", "eval"), namespace)
            np.testing.assert_allclose(
                np.ravel(np.asarray(value, dtype=float)), numbers, rtol=1e-5,
                err_msg=f"README.md line {line + offset - 1}: `{expr}` is not what its comment shows")
    except BaseException:
        session["failed"].append(line)
        raise


# --- the option table -------------------------------------------------------

def option_table(text):
    """{option: default as written} from the table under "### Options" in README.md."""
    section = text.split("### Options", 1)[1]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def test_option_table_matches_autobatch_signature():
    table = option_table(README.read_text())
    params = {name: p for name, p in inspect.signature(pcbatch.autobatch).parameters.items() if name != "fn"}
    assert list(table) == list(params), "README.md's option table: names or order differ from autobatch's"
    for name, p in params.items():
        assert table[name] == repr(p.default), f"README.md's option table: `{name}` default is {p.default!r}"


def test_signature_line_matches_autobatch():
    # The one-line signature at the top of "## API" is a second copy of the same facts.
    text = README.read_text()
    written = re.search(r"`pcbatch\.autobatch\((.*?)\)`", text, re.S).group(1)
    args = ast.parse(f"def autobatch({written}): pass").body[0].args
    readme = {a.arg: ast.literal_eval(d) for a, d in zip(args.kwonlyargs, args.kw_defaults)}
    params = inspect.signature(pcbatch.autobatch).parameters
    assert [a.arg for a in args.args] == ["fn"] and "fn" in params
    assert readme == {n: p.default for n, p in params.items() if n != "fn"}
    assert list(readme) == [n for n in params if n != "fn"]


def test_option_table_parser_sees_every_row():
    # Guards option_table: a row it skipped would hide a missing or extra option.
    text = "### Options\n\n| option | default | meaning |\n|---|---|---|\n| `a` | `1` | x |\n| `b` | `None` | y |\n\n## Next"
    assert option_table(text) == {"a": "1", "b": "None"}
