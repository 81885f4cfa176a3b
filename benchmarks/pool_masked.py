"""The fork-join pool's step with its updates under conditionals or masked
(`pcbatch.Tuning(masked_pool_updates=...)`), on this backend.

    python -m benchmarks.pool_masked [--repeats 9] [--batch 64]

Three forked programs: fib (fork=True), the binary Tree-LSTM (`models.nary`, H 64,
random trees) and the Child-Sum Tree-LSTM written as a loop over children
(`models.child_sum_loop`, H 64, stdlib ASTs of <= 128 nodes). Each is called eagerly
(pcbatch's own jit and workspace) both ways, interleaved; the same results are
checked. Per step the compiled HLO's conditionals are counted too: XLA:GPU waits
on the host for each one, while on the CPU a skipped update costs nothing.
"""
from __future__ import annotations

import argparse

import jax
import numpy as np

import pcbatch
from benchmarks.common import fmt_time, hlo_step_counts, print_table, time_calls
from benchmarks.vm_overhead import fib, fib_inputs
from pcbatch import data
from pcbatch.models import child_sum_loop, nary


def programs(batch: int) -> dict[str, tuple[pcbatch.Autobatched, tuple]]:
    params = nary.init_params(jax.random.PRNGKey(0), vocab=100, hidden=64)
    trees = data.batch(data.random_binary_trees(batch, seed=3, min_leaves=4, max_leaves=32, max_nodes=63,
                                                vocab=100))
    ast = data.load_ast_trees("all", max_nodes=128, max_children=16, min_nodes=2)
    order = np.random.default_rng(0).permutation(len(ast.trees))[:batch]
    ast_trees = jax.device_put(data.batch([ast.trees[i] for i in order]))
    ast_params = child_sum_loop.init_params(jax.random.PRNGKey(64), len(data.AST_VOCAB), 64)
    return {
        f"fib(<=12), batch {batch}": (fib.with_options(fork=True), (fib_inputs(batch, 12),)),
        f"binary Tree-LSTM H 64, {batch} trees": (nary.nary_tree_lstm.with_options(fork=True),
                                                  (params, trees, trees.root)),
        f"Child-Sum (loop) H 64, {batch} ASTs": (
            child_sum_loop.child_sum_tree_lstm_loop.with_options(max_stack_depth=128, fork=True),
            (ast_params, ast_trees, ast_trees.root)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    print(f"# pool_masked  {jax.default_backend()}  {jax.devices()[0].device_kind}  batch {a.batch}")
    rows = []
    for name, (f, args) in programs(a.batch).items():
        ways = {m: f.with_options(tuning=pcbatch.Tuning(masked_pool_updates=m)) for m in (False, True)}
        outs = {m: jax.block_until_ready(g(*args)) for m, g in ways.items()}
        for x, y in zip(jax.tree_util.tree_leaves(outs[False]), jax.tree_util.tree_leaves(outs[True])):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        conds = {m: hlo_step_counts(jax.jit(g).lower(*args).compile().as_text())["every step"]["conditional"]
                 for m, g in ways.items()}
        times = time_calls({m: (lambda g=g: g(*args)) for m, g in ways.items()}, a.repeats, warm=True)
        rows.append([name, f"{conds[False]} / {conds[True]}", fmt_time(times[False]), fmt_time(times[True]),
                     f"{times[False] / times[True]:.2f}x", "same"])
    print_table(["program", "conds a step (conds / masked)", "under conds", "masked", "masked speedup", "results"],
                rows)


if __name__ == "__main__":
    main()
