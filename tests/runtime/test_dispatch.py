"""The machine's two ways to run a block, and masked in-place updates.

`Machine` runs a block either in the shared `lax.switch` (small state) or in
place under a `lax.cond` of its own (blocks touching large registers or
stack frames; every block when there are many small register leaves). The
switch either carries the stacks (each branch pops and pushes its own) or
leaves them outside (tops gathered before it, writes scattered after). The
thresholds are `pcbatch.Tuning` options; here they are forced so that each program
runs all-switch (both ways), all-cond and mixed, and every way must equal the original
Python run example by example. `runtime/inplace.py` folds the lane mask into
`buf.at[i].set(v)` / `dynamic_update_slice` on large registers; its programs
write rows from divergent control flow.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pcbatch
import pcbatch.runtime.machine as machine
from pcbatch.compile import machine_config
from pcbatch.ir.core import Prim
from pcbatch.runtime import run_machine
from pcbatch.runtime.inplace import masked_update

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from corpus import CASES_BY_NAME  # noqa: E402
from test_corpus import assert_same  # noqa: E402

MODES = {  # (Tuning.large_register_bytes, Tuning.switch_max_leaves, Tuning.carry_stacks)
    "switch": (1 << 40, 1 << 20, True),
    "switch_stacks_outside": (1 << 40, 1 << 20, False),
    "conds": (1, -1, None),
    "mixed": (64, 1 << 20, None),  # only blocks touching a register of >= 64 bytes (all lanes) run in place
}


@pytest.fixture(params=sorted(MODES))
def mode(request):
    return request.param


def program_modes():
    """PROGRAMS x MODES, each program in one mode (in turn, so each mode meets two or
    three programs; "mixed" bubble_sort's large array, where it differs from "switch") in
    `make test`; each cell compiles a machine, `make test-matrix` runs the rest."""
    modes = sorted(MODES)
    for k, name in enumerate(PROGRAMS):
        kept = {modes[(k + 2) % 4]}
        for mode in modes:
            yield pytest.param(name, mode, id=f"{name}-{mode}", marks=() if mode in kept else (pytest.mark.matrix,))


def in_mode(f: pcbatch.Autobatched, mode: str) -> pcbatch.Autobatched:
    large, leaves, carry = MODES[mode]
    return f.with_options(tuning=pcbatch.Tuning(large_register_bytes=large, switch_max_leaves=leaves,
                                                carry_stacks=carry))


def _heavy(f, *args) -> set[int]:
    prog = f.lowered(*args)
    return machine.Machine(prog, prog.lanes, machine_config(prog, prog.lanes, f.options)[1]).heavy


# Recursion with saves, mutual recursion, loops with early exits, pytrees,
# shared arrays, nested calls: the machine features every mode must get right.
PROGRAMS = ["fib", "ack", "is_even", "loop_mix", "digit_stats", "bsearch_rec", "tree_sum", "bubble_sort",
            "minmax_rec", "hanoi"]


@pytest.mark.parametrize("name, mode", list(program_modes()))
def test_corpus_programs_in_every_mode(name, mode):
    case = CASES_BY_NAME[name]
    f = in_mode(case.fn, mode)
    args = case.args(list(case.divergent))
    assert_same(case, f(*args), case.fn.reference(*args))
    heavy = _heavy(f, *args)
    assert (not heavy) if mode.startswith("switch") else (len(heavy) == f.lowered(*args).num_blocks if mode == "conds"
                                                 else True)


DIM = 24


@pcbatch.autobatch
def record(x, n):
    """Rows written from divergent control flow: `.at[].set` under an `if`,
    `.at[].add`, a negative index, an index past the end (dropped), and
    `dynamic_update_slice`; the buffers are also read back."""
    rows = jnp.zeros((6, DIM))
    hits = jnp.zeros((6,))
    i = 0
    while i < n:
        x = jnp.sin(x) + 0.1 * i
        if x[0] > 0:
            rows = rows.at[i % 6].set(x)
        else:
            rows = rows.at[-1].add(x)
        hits = hits.at[i].add(1.0)  # i >= 6 is out of range: dropped, as in Python-side JAX
        rows = lax.dynamic_update_slice(rows, x[None, :3] * 2.0, (i % 5, 0))
        x = x + rows[i % 6]
        i += 1
    return rows, hits, x


@pcbatch.autobatch
def saved_rows(x, depth):
    """A large buffer saved across recursive calls, then updated in place."""
    buf = jnp.zeros((4, DIM))
    if depth > 0:
        inner = saved_rows(x * 0.5, depth - 1)
        buf = buf.at[depth % 4].set(inner[0] + x)
    return buf


# `record` makes no calls: the stacks, carried through the switch or not, are never touched.
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.matrix) if m == "switch_stacks_outside" else m
                                  for m in sorted(MODES)])
def test_masked_rows_match_python(mode):
    x = jax.random.normal(jax.random.PRNGKey(0), (5, DIM))
    n = jnp.array([0, 1, 4, 9, 7])
    f = in_mode(record, mode)
    for a, b in zip(f(x, n), record.reference(x, n)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_masked_rows_saved_across_calls_match_python(mode):
    x = jax.random.normal(jax.random.PRNGKey(1), (4, DIM))
    d = jnp.array([0, 1, 3, 5])
    f = in_mode(saved_rows, mode)
    np.testing.assert_allclose(f(x, d), saved_rows.reference(x, d), rtol=1e-5, atol=1e-5)


def _types(**kw):
    return {k: jax.ShapeDtypeStruct(np.shape(v), jnp.asarray(v).dtype) for k, v in kw.items()}


def test_masked_update_recognizes_in_place_updates_only():
    types = _types(buf=np.zeros((4, 3), np.float32), i=np.int32(0), v=np.zeros(3, np.float32),
                   w=np.zeros(3, np.float32))
    ok = [(("buf",), lambda b, i, v: (b.at[i].set(v),)), (("buf",), lambda b, i, v: (b.at[i].add(v),)),
          (("buf",), lambda b, i, v: (lax.dynamic_update_slice(b, v[None], (i, 0)),)),
          (("buf", "w"), lambda b, i, v: (b.at[i].set(v), v * 2))]
    for outs, fn in ok:
        assert masked_update(Prim(outs, ("buf", "i", "v"), fn), types, {"buf"}) is not None
    not_ok = [lambda b, i, v: (b.at[i].set(v, mode="clip"),),   # no out-of-bounds drop to mask with
              lambda b, i, v: (b * 2,),                         # not an update of b
              lambda b, i, v: (b.at[i].set(v) + 1,),            # the update is not the result
              lambda b, i, v: (jnp.zeros_like(b).at[i].set(v),)]  # updates something else
    for fn in not_ok:
        assert masked_update(Prim(("buf",), ("buf", "i", "v"), fn), types, {"buf"}) is None
    # registers that are not large, or not both read and written, are left alone
    assert masked_update(Prim(("buf",), ("buf", "i", "v"), ok[0][1]), types, set()) is None
    assert masked_update(Prim(("out",), ("buf", "i", "v"), ok[0][1]), {**types, "out": types["buf"]}, {"out"}) is None


def test_masked_update_keeps_inactive_lanes():
    types = _types(buf=np.zeros((4, 3), np.float32), i=np.int32(0), v=np.zeros(3, np.float32))
    for fn in (lambda b, i, v: (b.at[i].set(v),), lambda b, i, v: (lax.dynamic_update_slice(b, v[None], (i, 0)),)):
        masked = jax.vmap(masked_update(Prim(("buf",), ("buf", "i", "v"), fn), types, {"buf"}))
        buf = jnp.arange(3 * 4 * 3, dtype=jnp.float32).reshape(3, 4, 3)
        active = jnp.array([True, False, True])
        (out,) = masked(active, buf, jnp.array([1, 2, 3]), -jnp.ones((3, 3)))
        expect = jax.vmap(fn)(buf, jnp.array([1, 2, 3]), -jnp.ones((3, 3)))[0]
        np.testing.assert_array_equal(out, jnp.where(active[:, None, None], expect, buf))


def test_carried_stacks_leave_the_switch_as_the_only_conditional():
    """`carry_stacks=True`: the stacks pass through the block switch, so a step of
    fib holds no conditional but the switch (with the stacks outside it, each
    stack's write runs under one more); the same results both ways."""
    sys.path.insert(0, str(Path(__file__).parents[2]))
    from benchmarks.common import hlo_step_counts

    case = CASES_BY_NAME["fib"]
    args = case.args(list(case.divergent))
    conds = {}
    for carry in (False, True):
        f = in_mode(case.fn, "switch" if carry else "switch_stacks_outside")
        compiled = jax.jit(f).lower(*args).compile()
        conds[carry] = hlo_step_counts(compiled.as_text())["every step"]["conditional"]
        # The results of the program counted (an eager call would compile it once more).
        assert_same(case, compiled(*args), case.fn.reference(*args))
    assert conds[True] == 1 < conds[False], conds


@pcbatch.autobatch(fork=False)
def several_live(n, x):
    a, b, c, d = x + 1.0, x * 2.0, n + 1, x - 3.0
    if n <= 0:
        return a + b + d
    return several_live(n - 1, x * 0.5) + a * b + c + d


def test_the_machine_does_not_follow_the_order_of_the_programs_variables():
    """The variables' classes come in the order of set iteration, which changes with
    PYTHONHASHSEED: the machine (and so the compilation cache's key, shared by the test
    workers and subprocesses) must not follow it."""
    n, x = jnp.array([0, 2, 1]), jnp.array([1.0, 2.0, 3.0])
    prog = several_live.lowered(n, x)
    config = machine_config(prog, 3, several_live.options)[1]

    def hlo(p):
        text = jax.jit(lambda n, x: run_machine(p, dict(zip(p.entry_params, (n, x))), 3, config)[:2]).lower(
            n, x).as_text()
        return "\n".join(line.split(" loc(")[0] for line in text.splitlines() if not line.startswith("#loc"))

    reordered = dataclasses.replace(prog, var_class=dict(reversed(list(prog.var_class.items()))))
    assert hlo(reordered) == hlo(prog)
