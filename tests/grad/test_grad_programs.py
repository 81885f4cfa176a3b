"""Reverse-mode gradients of autobatched programs (`jax.grad`, `jax.vjp`,
`jax.value_and_grad`), differential against `jax.vjp` of the per-example
Python (`f.reference`), rtol 1e-5 in float32 (see `grad_helpers.check_vjp`).

Covered: the core corpus's programs with float inputs (one lane per example;
`tree_sum` forks, so it runs on the lane pool, and also with `fork=False`),
loops inside recursion, values kept on a stack across calls (Peek, Update),
shared (`in_axes=None`) parameter pytrees, non-zero
`in_axes`, keyword arguments and defaults, integer inputs (float0
cotangents), mixed int/float pytree results, `jax.jit(jax.grad(...))`, an
optax step, and `jax.test_util.check_grads` numerical checks.
"""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.test_util import check_grads

import pcbatch
from pcbatch.ir.core import Peek, Update
from grad_helpers import assert_close, check_vjp, partial_args, random_cotangent

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "core"))
from corpus import CASES_BY_NAME  # noqa: E402

FLOAT_PROGRAMS = ["poly", "tree_sum", "simulate", "newton", "halvings", "power", "dot_rec", "minmax_rec"]


# tree_sum is the one that forks: its lane pool's gradient (~4 CPU-s of compiling) runs in make
# test-matrix; make test runs tree_sum one lane per example (test_corpus_fork_false_and_jit) and the
# pool's gradients of forked programs with shared parameters in test_grad_models.py (the Tree-LSTM)
# and test_grad_errors.py (junk_fork).
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.matrix) if n == "tree_sum" else n
                                  for n in FLOAT_PROGRAMS])
def test_corpus_float_programs(name):
    case = CASES_BY_NAME[name]
    fn = case.fn.with_options(lane_width=16) if name == "tree_sum" else case.fn  # forks: one width, faster compile
    check_vjp(fn, case.args(case.batch(6)))


def test_corpus_fork_false_and_jit():
    """tree_sum without forks (pc stack and value stacks), inside jit."""
    case = CASES_BY_NAME["tree_sum"]
    check_vjp(case.fn.with_options(fork=False), case.args(case.batch(5)), jit=True)


# --- loops inside recursion, shared pytrees ------------------------------------


@pcbatch.autobatch(in_axes=(None, 0, 0))
def loop_rec(params, x, n):
    """A data-dependent loop inside each level of a recursion (one call: no fork)."""
    if n <= 0:
        return x * params["scale"]
    acc = jnp.zeros_like(x)
    i = 0
    while i < n:
        acc = acc + jnp.tanh(params["w"] * x + i * params["b"]["c"])
        i += 1
    return loop_rec(params, acc * 0.5, n - 1) + jnp.sin(acc) * params["b"]["d"]


PARAMS = {"w": np.float32(0.7), "scale": np.float32(1.5),
          "b": {"c": np.float32(0.3), "d": np.asarray([0.5, -1.0], np.float32)}}


def test_loops_inside_recursion():
    x = np.asarray([[0.5, 1.0], [2.0, -1.0], [0.1, 0.2], [-0.3, 0.4]], np.float32)
    n = np.asarray([3, 0, 5, 1], np.int32)
    check_vjp(loop_rec, (PARAMS, x, n))


def decayed(p, n, x):
    """A shared parameter the recursion passes on changed: a register, not a constant."""
    if n <= 0:
        return p * x
    return decayed(p * 0.9, n - 1, x)   # a tail call: a jump


def test_shared_parameter_passed_on_changed():
    # The entry register's cotangent of an in_axes=None parameter was dropped: its gradient was 0.
    n, x, p = jnp.asarray([0, 1, 3]), jnp.asarray([1.0, 2.0, -3.0]), jnp.float32(2.0)
    f = pcbatch.autobatch(decayed, in_axes=(None, 0, 0))
    got = jax.grad(lambda p, x: jnp.sum(f(p, n, x) * jnp.arange(1.0, 4.0)), argnums=(0, 1))(p, x)
    want = jax.grad(lambda p, x: sum(decayed(p, int(k), x[i]) * (i + 1.0) for i, k in enumerate(n)),
                    argnums=(0, 1))(p, x)
    assert_close(got, want)


@pcbatch.autobatch(fork=False)
def peeky(x, n):
    """Two dependent calls: x stays on its stack across both, y is restored
    with a Peek after the first and overwritten in place (Update). (With
    forks on, the fork pass renames y and the Update disappears.)"""
    if n <= 0:
        return jnp.sin(x)
    y = x * 1.5
    a = peeky(x * 0.5, n - 1)
    y = y + a
    b = peeky(y, n - 2)
    return a * b + x * y


def test_stack_peek_and_update():
    x, n = jnp.asarray([0.3, -0.8, 1.2, 0.7]), jnp.asarray([3, 0, 4, 1])
    ops = {type(op) for blk in peeky.lowered(x, n).blocks for op in blk.ops}
    assert {Peek, Update} <= ops
    check_vjp(peeky, (x, n))


@pcbatch.autobatch(in_axes=(None, 1, 0))
def axis_one(params, x, n):
    y = x
    for _ in range(n):
        y = jnp.tanh(params[0] @ y + params[1])
    return {"y": y, "n": n, "norm": jnp.sum(y * y)}


def test_nonzero_in_axes_pytree_params_mixed_results():
    rng = np.random.default_rng(1)   # NumPy: jax.random compiled a threefry per shape
    params = (jnp.asarray(rng.standard_normal((3, 3)), jnp.float32), jnp.asarray([0.1, 0.2, 0.3]))
    x = jnp.asarray(rng.standard_normal((3, 5)), jnp.float32)   # batch on axis 1
    n = jnp.asarray([0, 1, 2, 3, 1], jnp.int32)
    check_vjp(axis_one, (params, x, n))


@pcbatch.autobatch
def scaled(x, n, scale=2.0, shift=0.5):
    if n <= 0:
        return x * scale + shift
    return scaled(x * scale, n - 1, scale=scale, shift=shift) + jnp.sin(x)


def test_keywords_and_defaults():
    # One call (each signature compiles a forward and a backward): keywords out of order,
    # a default given (batched, differentiated) and one taken (`shift`).
    x = jnp.asarray([0.5, -1.0, 2.0])
    n = jnp.asarray([2, 0, 1])
    scale = jnp.asarray([2.0, 0.5, -1.0])
    got = jax.grad(lambda x, s: jnp.sum(scaled(n=n, scale=s, x=x)), argnums=(0, 1))(x, scale)
    want = jax.grad(lambda x, s: jnp.sum(scaled.reference(x, n, s)), argnums=(0, 1))(x, scale)
    assert_close(got, want)


def test_integer_inputs_get_float0_and_value_and_grad():
    case = CASES_BY_NAME["power"]   # the batch size of test_corpus_float_programs: value_and_grad reuses its machine
    x, n, acc = case.args(case.batch(6)) + (np.ones(6, np.float32),)
    out, pull = jax.vjp(case.fn, x, n, acc)
    cx, cn, cacc = pull(jnp.ones_like(out))
    assert cn.dtype == jax.dtypes.float0 and cn.shape == n.shape
    wx, wacc = jax.grad(lambda x, acc: jnp.sum(case.fn.reference(x, n, acc)), argnums=(0, 1))(x, acc)
    assert_close((cx, cacc), (wx, wacc))
    value, grads = jax.value_and_grad(lambda x: jnp.sum(case.fn(x, n)))(x)
    assert_close(value, jnp.sum(case.fn.reference(x, n)))
    with pytest.raises(TypeError, match="integer"):   # jax.grad's own rule for int inputs
        jax.grad(lambda n: jnp.sum(case.fn(x, n)))(n)


def test_jit_grad_and_optax_step():
    x = np.asarray([[0.5, 1.0], [2.0, -1.0], [0.1, 0.2], [-0.3, 0.4]], np.float32)
    n = np.asarray([3, 0, 5, 1], np.int32)
    params = jax.tree_util.tree_map(jnp.asarray, PARAMS)

    def loss(p, f):
        return jnp.mean((f(p, x, n) - 1.0) ** 2)

    opt = optax.adam(0.05)

    @jax.jit
    def step(p, state):
        value, g = jax.value_and_grad(loss)(p, loop_rec)
        updates, state = opt.update(g, state, p)
        return optax.apply_updates(p, updates), state, value, g

    state = opt.init(params)
    p1, state, v0, g = step(params, state)
    assert_close(g, jax.grad(loss)(params, loop_rec.reference))
    for _ in range(3):
        p1, state, v, _ = step(p1, state)
    assert float(v) < float(v0)


def test_check_grads_numerically():
    """Finite differences (jax.test_util.check_grads, reverse mode) on a
    recursive and a looping program; float32, so loose tolerances. The shapes
    of test_corpus_float_programs and test_loops_inside_recursion: their
    gradient machines are reused."""
    case = CASES_BY_NAME["newton"]
    x, iters = case.args(case.batch(6))
    x = x + 0.5   # away from the kink of maximum(x, 1)
    check_grads(partial_args(case.fn, (x, iters), (0,)), (x,), order=1, modes=["rev"], eps=1e-2, atol=5e-2,
                rtol=5e-2)
    x = jnp.asarray([[0.5, 1.0], [2.0, -1.0], [0.1, 0.2], [-0.3, 0.4]])
    n = jnp.asarray([2, 3, 0, 1])
    check_grads(partial_args(loop_rec, (PARAMS, x, n), (0, 1)), (jax.tree_util.tree_map(jnp.asarray, PARAMS), x),
                order=1, modes=["rev"], eps=1e-2, atol=5e-2, rtol=5e-2)


def test_random_cotangents_differ_from_ones():
    """The helper's cotangent is not all ones (a sum would hide permutations)."""
    ct = random_cotangent(jnp.zeros((5, 2)))
    assert np.unique(np.asarray(ct)).size == 10
