"""The random-program differential test for derivatives: `jax.grad` (reverse
mode, the recorded tape) and `jax.jvp` of a `jax.jit`-compiled caller
(forward mode, the machine's linear map evaluated) of an autobatched program
== the same derivative of its per-example Python (`.reference`).

The programs and inputs come from `generator.py` (`differentiable=True`: the
entry takes a float and returns one). The loss is the sum of the
result's float leaves; the derivatives are taken with respect to every float
input. Cases whose Python result or derivative is not finite (a division by
zero, `sqrt` of a negative) and cases with tight `max_steps` /
`max_stack_depth` limits are skipped: there the derivative is NaN by design.

`test_fuzz_grad_switched_long` (slow, `make fuzz`) runs its programs with
`Tuning(grad_switch=True)` (one `lax.switch` a step in the recorder and the
backward, the accelerators' default) on the CPU; in `make test` the models'
tests and `test_x64` cover that path (a couple of random programs would often
differentiate none).

`test_fuzz_grad_programs` runs `PCBATCH_FUZZ_GRAD_EXAMPLES` programs (default
2) in `make test`; `test_fuzz_grad_long` (marked slow) runs that variable's
count (default 300) under `make fuzz`. A gradient compiles a recording and a
backward machine per program, hence the modest counts. `PCBATCH_FUZZ_SEED`
draws another sequence of programs; a progress line goes to stderr every ten.
"""
from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

from .generator import LARGE, SMALL, FuzzCase, fuzz_cases
from .test_fuzz import _load, _unload, configured


def _loss(f):
    def loss(*args):
        out = f(*args)
        return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(out) if jnp.issubdtype(x.dtype, jnp.inexact))
    return loss


def _close(got, want, what: str, case: FuzzCase) -> None:
    for k, (g, w) in enumerate(zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if not np.allclose(g, w, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{what} of input {k}: pcbatch {g.tolist()} != reference {w.tolist()}\n"
                                 + case.describe())


def check_case_grad(case: FuzzCase, grad_switch: bool | None = None) -> bool:
    """Whether the case was checked (False: skipped, see the module docstring);
    `grad_switch`: `Tuning.grad_switch` (None: the backend's default)."""
    floats = [k for k, x in enumerate(case.inputs) if np.issubdtype(np.asarray(x).dtype, np.floating)]
    if case.limits or not floats or not all(np.ndim(x) == 0 or len(x) for x in case.inputs):
        return False
    module = _load(case.source)
    try:
        fn = configured(getattr(module, case.entry), case)
        if grad_switch is not None:
            fn = fn.with_options(tuning=dataclasses.replace(fn.tuning, grad_switch=grad_switch))
        inputs = tuple(jnp.asarray(x) for x in case.inputs)
        ref_loss = _loss(fn.reference)
        value = ref_loss(*inputs)
        if not isinstance(value, jax.Array) or not jnp.issubdtype(value.dtype, jnp.inexact):
            return False  # no float result: nothing to differentiate
        want = jax.grad(ref_loss, argnums=tuple(floats))(*inputs)
        if not (np.isfinite(value) and all(np.all(np.isfinite(w)) for w in want)):
            return False
        try:
            got = jax.grad(_loss(fn), argnums=tuple(floats))(*inputs)
        except Exception as e:
            raise AssertionError(f"jax.grad through pcbatch raised {type(e).__name__}: {e}\n"
                                 + case.describe()) from e
        _close(got, want, "jax.grad", case)

        def on_floats(f):
            def g(*values):
                args = list(inputs)
                for k, v in zip(floats, values):
                    args[k] = v
                return f(*args)
            return g

        primals = tuple(inputs[k] for k in floats)
        tangents = tuple(jnp.linspace(0.5, -1.0, int(np.size(x)), dtype=x.dtype).reshape(np.shape(x))
                         for x in primals)
        _, want_dot = jax.jvp(on_floats(ref_loss), primals, tangents)
        try:
            _, got_dot = jax.jvp(on_floats(jax.jit(_loss(fn))), primals, tangents)
        except Exception as e:
            raise AssertionError(f"jax.jvp of a jitted caller raised {type(e).__name__}: {e}\n"
                                 + case.describe()) from e
        _close(got_dot, want_dot, "jax.jvp(jax.jit(...))", case)
        return True
    finally:
        _unload(module)


def _run(n: int, max_stmts: int, grad_switch: bool | None = None) -> tuple[int, int]:
    count = [0, 0]
    options = dict(max_examples=n, database=None, report_multiple_bugs=False,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                          HealthCheck.large_base_example, HealthCheck.filter_too_much])

    user_seed = os.environ.get("PCBATCH_FUZZ_SEED")
    if user_seed:
        options["derandomize"] = False

    def prop(case: FuzzCase) -> None:
        count[0] += 1
        count[1] += check_case_grad(case, grad_switch)
        if count[0] % 100 == 0:
            jax.clear_caches()
        if count[0] % 10 == 0:  # a slow run: minutes per ten programs
            print(f"fuzz grad: {count[0]} programs passed", file=sys.stderr, flush=True)

    test = settings(**options)(given(fuzz_cases(max_stmts, differentiable=True))(prop))
    if user_seed:
        test = seed(int(user_seed))(test)
    test()
    return count[0], count[1]


def _examples(default: int) -> int:
    return int(os.environ.get("PCBATCH_FUZZ_GRAD_EXAMPLES", default))


def test_fuzz_grad_programs():
    n = _examples(2)
    ran, checked = _run(n, SMALL)
    print(f"fuzz grad: {ran} programs, {checked} differentiated", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


@pytest.mark.slow
def test_fuzz_grad_switched_long():
    n = _examples(300)
    ran, checked = _run(n, LARGE, grad_switch=True)
    print(f"fuzz grad, one switch a step: {ran} programs, {checked} differentiated", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
    assert checked >= n // 4, f"only {checked} of {ran} programs had a finite float derivative to check"


@pytest.mark.slow
def test_fuzz_grad_long():
    n = _examples(300)
    ran, checked = _run(n, LARGE)
    print(f"fuzz grad: {ran} programs, {checked} differentiated", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"
    assert checked >= n // 4, f"only {checked} of {ran} programs had a finite float derivative to check"
