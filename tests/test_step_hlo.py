"""The machine's loop never calls the host, and the benchmarks' hand-written
twins agree with the generated machines (so their figures compare like with
like). `benchmarks.common.hlo_step_counts` reads the optimized HLO."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks import block_twins  # noqa: E402
from benchmarks.common import hlo_step_counts  # noqa: E402
from pcbatch.mcmc import nuts  # noqa: E402


def _logp(x):
    return -0.5 * jnp.sum(x * x)


def _nuts_hlo(progress: bool) -> dict:
    args = nuts.prepare(jnp.zeros((3, 2)), jax.random.PRNGKey(0), 0.5, None, 4, progress_every=2 if progress else 0)[0]
    # Warm-up (adaptation's blocks) where the loop must have no callback; the bar needs only one.
    warmup = 0 if progress else 2
    prog = nuts.sampler(_logp, num_samples=4 - warmup, num_warmup=warmup, max_tree_depth=3, progress=progress)
    return hlo_step_counts(jax.jit(prog).lower(*args).compile().as_text())


def test_no_host_callback_in_the_loop_unless_the_progress_bar_asks():
    plain, bar = _nuts_hlo(False), _nuts_hlo(True)
    assert plain["every step"]["fusion"] > 0 and plain["in branches"]["conditional"] + plain["every step"]["conditional"] > 0
    callbacks = lambda c: sum(c[w]["custom-call"] for w in c)  # noqa: E731
    assert callbacks(plain) == 0
    assert callbacks(bar) >= 1          # the counter sees a host callback where there is one


def test_hand_written_twins_take_the_same_steps_to_the_same_results():
    for name, case in (("leaves", block_twins.leaves_case), ("tree-lstm", block_twins.tree_lstm_case)):
        gen, hand, args = case(3)
        out, status = gen(*args)
        block_twins.check(name, out, status.steps, *jax.jit(hand)(*args)[:2])
        np.testing.assert_array_equal(np.asarray(status.overflow), False)
