"""The IR itself: printer, verifier, CFG clean-up and the reference interpreters."""
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.ir import (Block, Branch, ExampleFailed, Fail, Function, IRError, Jump, Prim, Program, Return, run_program,
                        run_stack_program)
from pcbatch.ir import verify_program
from pcbatch.ir.cfg import simplify


@pcbatch.autobatch(fork=False)
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch
def hailstone_max(n):
    best = n
    while n != 1:
        if n % 2 == 0:
            n = n // 2
        else:
            n = 3 * n + 1
        best = jnp.maximum(best, n)
    return best


@pcbatch.autobatch
def ping(n, acc):
    if n <= 0:
        return acc
    return pong(n - 1, acc * 2)


@pcbatch.autobatch
def pong(n, acc):
    if n <= 0:
        return acc
    return ping(n - 1, acc + 1)


PROGRAMS = [(fib, (jnp.array([0, 1, 5, 9]),)),
            (hailstone_max, (jnp.array([1, 3, 7, 27]),)),
            (ping, (jnp.array([0, 3, 6, 1]), jnp.array([1, 2, 3, 4])))]


def examples(args, i):
    return tuple(a[i] for a in args)


@pytest.mark.parametrize("f,args", PROGRAMS, ids=lambda x: getattr(x, "__name__", ""))
def test_interpreters_agree_with_python(f, args):
    expected = f.reference(*args)
    prog = f.lowered(*args)
    for i in range(args[0].shape[0]):
        assert run_program(f.ir(), *examples(args, i)) == expected[i]
        trace = run_stack_program(prog, dict(zip(prog.entry_params, examples(args, i))))
        assert trace.finished and trace.result == expected[i]


@pytest.mark.parametrize("f,args", PROGRAMS, ids=lambda x: getattr(x, "__name__", ""))
def test_machine_runs_exactly_the_blocks_the_tracer_records(f, args):
    _, status = f.checked(*args)
    traces = f.reference_trace(*args)
    np.testing.assert_array_equal(status.blocks_run, [len(t.blocks) for t in traces])
    assert int(status.steps) >= max(len(t.blocks) for t in traces)


def test_printer_is_readable():
    text = str(fib.ir())
    assert text.startswith("def fib(n):  # entry")
    assert "call fib(" in text and "branch" in text and "return" in text
    lowered = str(fib.lowered(jnp.arange(3)))
    assert "pushjump b0" in lowered and "push n" in lowered and "pop n" in lowered


@pcbatch.autobatch
def guarded(n):
    assert n != 3, "not three"
    if n < 0:
        raise ValueError("negative")
    return n * 2


def test_a_fail_prints_as_one_line_with_its_source():
    text = str(guarded.ir())
    line = guarded.fn.__code__.co_firstlineno + 4
    assert f'fail  # raise ValueError("negative")  ({__file__}:{line})' in text
    assert f'fail  # assert n != 3, "not three"  ({__file__}:{line - 2})' in text
    assert "fail  # raise" in str(guarded.lowered(jnp.arange(3)))


def test_interpreters_stop_at_a_fail():
    prog = guarded.lowered(jnp.arange(3))
    fails = {i: b.term for i, b in enumerate(prog.blocks) if isinstance(b.term, Fail)}
    for n, text in ((3, 'assert n != 3, "not three"'), (-2, 'raise ValueError("negative")')):
        trace = run_stack_program(prog, {prog.entry_params[0]: np.int32(n)})
        assert trace.finished and trace.result is None and fails[trace.failed].text == text
        assert trace.blocks[-1] == trace.failed
        with pytest.raises(ExampleFailed) as info:
            run_program(guarded.ir(), np.int32(n))
        assert info.value.fail.text == text
    ok = run_stack_program(prog, {prog.entry_params[0]: np.int32(5)})
    assert ok.failed is None and int(ok.result) == 10
    assert int(run_program(guarded.ir(), np.int32(5))) == 10


def test_verifier_accepts_a_fail_and_wants_its_text():
    ok = Function("f", ("x",), (Block("b0", (), Fail("raise E", None)),))
    verify_program(Program((ok,), "f"))
    with pytest.raises(IRError):
        verify_program(Program((Function("f", ("x",), (Block("b0", (), Fail("", None)),)),), "f"))


@pytest.mark.parametrize("f,args", PROGRAMS, ids=lambda x: getattr(x, "__name__", ""))
def test_printer_numbers_temporaries_contiguously(f, args):
    """Passes drop temporaries (fib's lowered program keeps _t1, _t3, _t5): the
    listing shows _t1.._tk, each written before it is read in its block's text."""
    import re
    for text in (str(f.ir()), str(f.lowered(*args))):
        shown = {int(n) for n in re.findall(r"\b_t(\d+)\b", text)}
        assert shown == set(range(1, len(shown) + 1)), (sorted(shown), text)
    lowered = str(fib.lowered(jnp.arange(3)))
    assert "<ret>:i32[] = _t2 + _t3" in lowered, lowered


def test_mutual_recursion_is_one_program():
    names = [fn.name for fn in ping.ir().functions]
    assert names == ["ping", "pong"]


def _prim(out, *ins):
    return Prim((out,), ins, lambda *a: (0,), "0")


def test_verifier_rejects_malformed_programs():
    bad_target = Program((Function("f", ("x",), (Block("entry", (), Jump(3)),)),), "f")
    with pytest.raises(IRError, match="missing block"):
        verify_program(bad_target)
    undefined = Program((Function("f", ("x",), (Block("entry", (), Return("y")),)),), "f")
    with pytest.raises(IRError, match="reads y"):
        verify_program(undefined)


def test_simplify_merges_chains_and_threads_empty_jumps():
    blocks = (
        Block("entry", (_prim("a"),), Jump(1)),
        Block("empty", (), Jump(2)),
        Block("cond", (_prim("c"),), Branch("c", 3, 4)),
        Block("then", (_prim("a"),), Jump(5)),
        Block("else", (), Jump(5)),
        Block("join", (), Return("a")),
        Block("unreachable", (), Return("a")),
    )
    out = simplify(blocks)
    # entry+empty+cond merge; `else` is threaded away; `then` keeps its op.
    assert [b.label for b in out] == ["entry", "then", "join"]
    assert isinstance(out[0].term, Branch) and out[0].term.false == 2


@pcbatch.autobatch
def settle(a):
    if a > 3.0:
        return a
    return settle(a + 1.0)


@pcbatch.autobatch(in_axes=(None, 0), fork=True)
def collect_then_call(children, node):
    s = 0.0
    for k in range(jnp.sum(children[node] >= 0)):
        x = collect_then_call(children, children[node, k])
        s = s + settle(x + 1.0)
    return s + 1.0


def test_a_listing_renumbers_temporaries_in_the_op_text_too():
    """The printer renumbers temporaries; an op's source text must show the same numbers
    (a function's listing has unqualified names, which the text rewrite skipped)."""
    children = jnp.asarray([[1, 2], [3, -1], [-1, -1], [-1, -1]], jnp.int32)
    text = str(collect_then_call.ir())
    lines = [line.strip() for line in text.splitlines()]
    k = next(i for i, line in enumerate(lines) if "call settle(" in line)
    out = lines[k].split(" = ")[0]
    assert lines[k + 1] == f"s = s + {out}", lines[k:k + 2]
    np.testing.assert_allclose(collect_then_call(children, jnp.zeros(1, jnp.int32)), [11.0])


def test_a_loop_fork_listing_names_only_defined_temporaries():
    """The printer renumbers `_t8` to `_t6` in op text, but not the `_t8` of `_t8%9` (a suffixed
    temporary keeps its name): the listing read `_t6%9`, which no line defined."""
    import re

    @pcbatch.autobatch(in_axes=(None, 0, 0), fork=True)
    def csum(w, children, node):
        h = jnp.tanh(w * (node + 1.0))
        for k in range(jnp.sum(children[node] >= 0)):
            h = h * 0.5 + csum(w, children, children[node, k])
        return h

    children = -jnp.ones((2, 4, 2), jnp.int32).at[:, 0, 0].set(1).at[:, 0, 1].set(2)
    text = str(csum.lowered(jnp.float32(0.3), children, jnp.zeros(2, jnp.int32)))
    defined = set(re.findall(r"^\s+([%\w]+):", text, re.M))
    suffixed = set(re.findall(r"\b(_+t\d+%\d+)", text))
    assert suffixed and suffixed <= defined, (suffixed - defined, text)
