"""`make demo` (examples/demo.py): right results, in at most 30 lines, IR only with --verbose."""
from __future__ import annotations

import importlib.util
import pathlib

DEMO = pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo.py"


def test_demo_is_short_and_right(capsys):
    spec = importlib.util.spec_from_file_location("demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.main(verbose=False)
    out = capsys.readouterr().out
    lines = out.rstrip("\n").splitlines()
    assert len(lines) <= 30, out
    assert "(the same)" in out and "DIFFERENT" not in out
    assert "fork=True" in out and "Python loop" in out
    assert "b0" not in out  # no IR dump without --verbose
