"""Gradients of the TreeRNN models w.r.t. their shared parameters, on the
lane pool (fork-join: Spawn copies a parent's arguments into a child, Join
gathers the children's return values) and with one lane per example
(`fork=False`: pc and value stacks), differential against `jax.vjp` of the
per-example Python (`grad_helpers.check_vjp`).

Also: lane exhaustion (a few free lanes: forks and sequential calls on the
pool's stacks mix), where the stack cotangents and spawned/joined lanes
interleave, with the pool's updates under conditionals and masked.
"""
from __future__ import annotations

import re

import jax
import pytest

import pcbatch
from grad_helpers import assert_close, check_vjp, random_cotangent
from pcbatch.ir.core import Join, Pop
from pcbatch import data
from pcbatch.models import child_sum, nary
from weights import numpy_weights  # tests/ is on sys.path (its conftest)

VOCAB, HIDDEN = 50, 4
TREES = data.batch(data.random_binary_trees(5, min_leaves=1, max_leaves=7, vocab=VOCAB,
                                            shape=("random", "left", "balanced", "right", "frontier")))


PARAMS = {module: numpy_weights(module.init_params, VOCAB, HIDDEN) for module in (nary, child_sum)}


def args(module):
    return (PARAMS[module], TREES, TREES.root)


# model x (one lane per example | lane pool): make test runs child_sum one lane per example (below)
# and nary on the lane pool (inside jit and with lane exhaustion, below); this cell in make
# test-matrix (the one-lane gradient of two self-calls per node: tree_sum and peeky in
# test_grad_programs.py).
@pytest.mark.matrix
def test_nary_tree_lstm_one_lane_per_example():
    check_vjp(nary.nary_tree_lstm.with_options(fork=False), args(nary), positions=(0,))


def test_child_sum_calls_inside_if():
    """Children's calls inside an `if` in a constant-range loop: no fork."""
    check_vjp(child_sum.child_sum_tree_lstm, args(child_sum), positions=(0,))


# fork x grad_switch: make test runs one lane per example with conditionals (child_sum, above) and
# the lane pool with both (inside jit, below); this cell in make test-matrix.
@pytest.mark.matrix
def test_one_switch_a_step_one_lane_per_example():
    """`Tuning(grad_switch=True)` (accelerators' default): the recorder and the
    backward pick a step's block with one `lax.switch`, not a `lax.cond` each;
    one lane per example here, on the lane pool (inside jit) below."""
    f = nary.nary_tree_lstm.with_options(fork=False, lane_width=16, tuning=pcbatch.Tuning(grad_switch=True))
    check_vjp(f, args(nary), positions=(0,), seed=5)


@pytest.fixture(scope="module")
def nary_reference_vjp():
    """The per-example Python's outputs and vjp w.r.t. the parameters: run once (eagerly, op by
    op) for the two lane-pool tests below, each with a random cotangent of its own."""
    params, trees, root = args(nary)
    return jax.vjp(lambda p: nary.nary_tree_lstm.reference(p, trees, root), params)


def test_nary_tree_lstm_forked_under_jit_one_switch_a_step_no_register_copies(nary_reference_vjp):
    """The forked Tree-LSTM's gradient inside jit equals the per-example
    Python's, with the gradient pass picking a step's block by a `lax.cond`
    each (the CPU's default) and by one `lax.switch` (`grad_switch=True`).

    The recorder's per-block conditionals go (its writes are masked) and the
    backward's become one switch: of the gradient pass's 2 x (recorded blocks)
    conditionals, one stays. Either way, under a plain `jax.jit` (no region
    analysis in XLA's copy insertion) no step copies a pool-sized register:
    the backward's scatters run outside its conditionals (10 copies before).
    Each program is compiled once, for its HLO and its values."""
    params, trees, root = args(nary)
    ref_out, ref_pull = nary_reference_vjp
    h_ct, c_ct = random_cotangent(ref_out, seed=5)
    # the random cotangents as a loss: a permuted or mis-summed gradient cannot pass
    (want,) = ref_pull((h_ct, c_ct))
    counts = {}
    for switched in (False, True):
        f = nary.nary_tree_lstm.with_options(lane_width=16, tuning=pcbatch.Tuning(grad_switch=switched))
        step = jax.jit(jax.grad(lambda p: weighted(f(p, trees, root), h_ct, c_ct))).lower(params).compile()
        assert_close(step(params), want, what=f"grad_switch={switched}")
        hlo = step.as_text()
        counts[switched] = hlo.count(" conditional(")
        lanes = f.lowered(*args(nary)).lanes
        assert not re.findall(rf"= f32\[{lanes},{HIDDEN}\]\{{1,0\}} copy\(", hlo), switched
    recorded = 4  # the leaf's cell, the join's, and the sequential fallback's push of h, c and its cell
    assert counts[False] - counts[True] == 2 * recorded - 1, counts


def weighted(out, h_ct, c_ct):
    h, c = out
    return (h * h_ct).sum() + (c * c_ct).sum()


# masked x lane exhaustion: the pool's updates under conditionals (the CPU's default) are in every other
# forked gradient here; the masked updates only in this test. Its unmasked cell runs in make test-matrix.
@pytest.mark.parametrize("masked", [pytest.param(False, marks=pytest.mark.matrix), True])
def test_lane_exhaustion(masked, nary_reference_vjp):
    """A pool of 8 lanes for 5 trees: a few forks get lanes, the others run
    their calls sequentially on the pool's stacks, within one run; the pool's
    updates under conditionals (the CPU's default) and masked (accelerators')."""
    f = nary.nary_tree_lstm.with_options(max_lanes=8, lane_width=16,
                                         tuning=pcbatch.Tuning(masked_pool_updates=masked))
    # check_vjp's comparison, against the shared run of the per-example Python
    ref_out, ref_pull = nary_reference_vjp
    ct = random_cotangent(ref_out, seed=3)
    out, pull = jax.vjp(lambda p: f(p, TREES, TREES.root), PARAMS[nary])
    assert_close(out, ref_out, what="primal")
    assert_close(pull(ct), ref_pull(ct), what="cotangents")
    prog, rows = f.lowered(*args(nary)), f.tape_info(*args(nary)).rows
    joins = [b for b, blk in enumerate(prog.blocks) if blk.ops and isinstance(blk.ops[0], Join)]
    pops = [b for b, blk in enumerate(prog.blocks) if any(isinstance(op, Pop) for op in blk.ops)]
    assert sum(rows.get(b, 0) for b in joins) > 0 and sum(rows.get(b, 0) for b in pops) > 0  # both paths ran
