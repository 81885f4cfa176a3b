"""Heavy blocks: a generated machine step against a hand-written twin (issue 17, item 4).

    python -m benchmarks.block_twins            # NUTS leaves and the Tree-LSTM at batches 16, 128 (~2 min)
    python -m benchmarks.block_twins --quick

fib and collatz (`vm_overhead.py`) measure a step whose block does almost
nothing. Here the blocks carry the work users run:

* **NUTS leaves**: `leaves(x, p, eps, n)`, one chain taking `n` leapfrog
  steps on the 100-d correlated Gaussian of `benchmarks/nuts.py` with
  NUTS's leaf bookkeeping (energy error, log-sum-exp weight), `fork=False`;
  per chain `n` in [8, 64]. Its loop body is the leaf block: one gradient.
* **Tree-LSTM**: `models.nary.nary_tree_lstm` (H 64, binary stdlib-AST trees),
  `fork=False`; its cell block (`binary_lstm_cell`: a [5H, D+2H] matrix
  product per node) runs once per node.

Each has a hand-written `lax.while_loop` twin with the same control-flow graph
and the same earliest-block schedule (`benchmarks/hand_machines.py`), so both
take the same number of steps (checked) and give the same results (checked);
the time ratio is what the generated machine adds per step. Target: <= 2x.
Systems are timed interleaved, medians.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from benchmarks import hand_machines as hm
from benchmarks.common import block, fmt_time, hlo_copy_report, print_table, time_calls
from pcbatch import data
from pcbatch.mcmc import targets
from pcbatch.models import _common, nary

TARGET = 2.0
GAUSSIAN = targets.correlated_gaussian(100)


@pcbatch.autobatch(fork=False)
def leaves(x, p, eps, n):
    logp, g = jax.value_and_grad(GAUSSIAN.logdensity)(x)
    h0 = logp - 0.5 * jnp.sum(p * p)
    w = jnp.float32(-jnp.inf)
    k = 0
    while k < n:
        p = p + 0.5 * eps * g
        x = x + eps * p
        logp, g = jax.value_and_grad(GAUSSIAN.logdensity)(x)
        p = p + 0.5 * eps * g
        w = jnp.logaddexp(w, logp - 0.5 * jnp.sum(p * p) - h0)
        k = k + 1
    return x, w


# Each case: (generated: args -> (result, status), hand twin: args -> (result, steps, overflow), args).

def leaves_case(batch: int):
    rng = np.random.default_rng(0)
    args = (GAUSSIAN.draws(batch, seed=1), jnp.asarray(rng.normal(size=(batch, 100)), jnp.float32),
            jnp.full((batch,), 0.15, jnp.float32), jnp.asarray(rng.integers(8, 65, batch), jnp.int32))
    return leaves.checked, functools.partial(hm.leaves_hand, GAUSSIAN.logdensity), args


def tree_lstm_case(batch: int):
    trees = data.batch(data.stdlib_ast_trees(batch, min_leaves=4, max_leaves=60, seed=0))
    params = nary.init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    f = nary.nary_tree_lstm.with_options(fork=False)
    hand = functools.partial(hm.tree_lstm_hand, nary.binary_lstm_cell, _common.node_input, params)
    return (lambda tree, root: f.checked(params, tree, root)), hand, (trees, trees.root)


def check(name, gen_out, gen_steps, hand_out, hand_steps):
    if int(hand_steps) != int(gen_steps):
        raise AssertionError(f"{name}: hand-written twin took {int(hand_steps)} steps, generated {int(gen_steps)}")
    for a, b in zip(jax.tree_util.tree_leaves(gen_out), jax.tree_util.tree_leaves(hand_out)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5, err_msg=name)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", default="16,128")
    a = ap.parse_args(argv)
    repeats, min_time = (3, 0.05) if a.quick else (7, 0.2)
    print(f"# block_twins  {datetime.datetime.now():%Y-%m-%d %H:%M}  {platform.machine()}  jax {jax.__version__}  "
          f"load {os.getloadavg()[0]:.1f}")
    rows, hlo = [], []
    batches = [int(v) for v in a.batches.split(",")]
    for b in batches:
        cases = [("NUTS leaves (100-d Gaussian)", *leaves_case(b)), ("Tree-LSTM H 64 (stdlib ASTs)", *tree_lstm_case(b))]
        for name, g, h, xs in cases:
            g, h = jax.jit(g), jax.jit(h)
            out, status = block(g(*xs))
            hout, hsteps, _ = block(h(*xs))
            check(name, out, status.steps, hout, hsteps)
            steps = int(status.steps)
            t = time_calls({"gen": lambda: g(*xs), "hand": lambda: h(*xs)}, repeats, min_time)
            ratio = t["gen"] / t["hand"]
            rows.append([name, str(b), str(steps), fmt_time(t["gen"]), fmt_time(t["gen"] / steps),
                         fmt_time(t["hand"]), fmt_time(t["hand"] / steps), f"{ratio:.2f}x",
                         "PASS" if ratio <= TARGET else "MISS"])
            print("  ", " | ".join(rows[-1]), flush=True)
            if b == max(batches):
                hlo.append((name, hlo_copy_report(g.lower(*xs).compile().as_text()),
                            hlo_copy_report(h.lower(*xs).compile().as_text())))
    print()
    print_table(["program", "batch", "steps", "generated", "/step", "hand twin", "/step", "gen/hand",
                 f"<= {TARGET:g}x"], rows)
    print("\nWhere the time goes (optimized HLO of the whole call, largest batch):")
    for name, g, h in hlo:
        print(f"  {name}\n    generated  {g}\n    hand twin  {h}")


if __name__ == "__main__":
    main()
