"""Gradients of the TreeRNN models w.r.t. their shared parameters, on the
lane pool (fork-join: Spawn copies a parent's arguments into a child, Join
gathers the children's return values) and with one lane per example
(`fork=False`: pc and value stacks), differential against `jax.vjp` of the
per-example Python (`grad_helpers.check_vjp`).

Also: lane exhaustion (no free lane: every call runs on the pool's stacks;
a few free lanes: forks and sequential calls mix), where the pool's stack
cotangents and spawned/joined lanes interleave.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from grad_helpers import check_vjp
from pcbatch import data
from pcbatch.models import child_sum, mv_rnn, nary, tree_gru

VOCAB, HIDDEN = 50, 4
TREES = data.batch(data.random_binary_trees(5, min_leaves=1, max_leaves=7, vocab=VOCAB,
                                            shape=("random", "left", "balanced", "right", "frontier")))


def args(module):
    return (module.init_params(jax.random.PRNGKey(0), VOCAB, HIDDEN), TREES, TREES.root)


@pytest.mark.parametrize("fork", [True, False])
def test_nary_tree_lstm(fork):
    f = nary.nary_tree_lstm.with_options(lane_width=16) if fork else nary.nary_tree_lstm.with_options(fork=False)
    check_vjp(f, args(nary), positions=(0,))


def test_tree_gru_forked_under_jit():
    check_vjp(tree_gru.tree_gru.with_options(lane_width=16), args(tree_gru), positions=(0,), jit=True)


def test_mv_rnn_matrix_results():
    check_vjp(mv_rnn.mv_rnn.with_options(fork=False), args(mv_rnn), positions=(0,))


def test_child_sum_calls_inside_if():
    """Children's calls inside an `if` in a constant-range loop: no fork."""
    check_vjp(child_sum.child_sum_tree_lstm, args(child_sum), positions=(0,))


@pytest.mark.parametrize("spare", [0, 3])
def test_lane_exhaustion(spare):
    """max_lanes = batch: every call sequential on the pool's stacks; + 3: some
    forks get lanes, the rest fall back, within one run."""
    f = nary.nary_tree_lstm.with_options(max_lanes=5 + spare, lane_width=16)
    check_vjp(f, args(nary), positions=(0,), seed=spare)
