"""Does the default `fork="auto"` pick the faster machine? (issue 21)

    python -m benchmarks.fork_choice            # 3 programs x 4 batches (a few minutes)
    python -m benchmarks.fork_choice --quick    # fewer batches and repeats

For each program and batch it times the same autobatched function three ways,
each called eagerly and under `jax.jit`, interleaved (medians): `fork=True` (a
lane pool, independent calls in lanes of their own), `fork=False` (one lane
per example) and the default (`fork="auto"`), and prints default /
best-of-the-two (target <= 1.2x) and what the default chose.
Every result is checked against the per-example Python (`f.reference`).

Programs: `fib` (cheap scalar recursion), a scalar sum over the binarized
syntax trees of standard-library statements (real trees, cheap work per node)
and the binary Tree-LSTM (`models.nary`, H 64: a matrix product per node); in
the full run, at batch 128, also the Tree-LSTM at H 256 on `random_binary_trees`
(its pool holds 31 lanes per example: where `"auto"` measures both machines).
"""
from __future__ import annotations

import argparse
import datetime
import platform

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from pcbatch import data
from pcbatch.models import nary
from benchmarks.common import fmt_time, print_table, time_calls

TARGET = 1.2


@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch(in_axes=(0, 0))
def tree_sum(tree, node):
    left = tree.children[node, 0]
    if left < 0:
        return jnp.float32(tree.word[node] % 7)
    return tree_sum(tree, left) + 0.5 * tree_sum(tree, tree.children[node, 1])


def cases(batches: list[int]):
    """(program, batch, function, arguments) for every cell."""
    rng = np.random.default_rng(0)
    trees = data.stdlib_ast_trees(max(batches), min_leaves=4, max_leaves=60, seed=0)
    params = nary.init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    for b in batches:
        yield "fib (n < 16)", b, fib, (jnp.asarray(rng.integers(0, 16, b)),)
        t = data.batch(trees[:b])
        yield "tree sum (stdlib ASTs)", b, tree_sum, (t, t.root)
        yield "Tree-LSTM H 64 (stdlib ASTs)", b, nary.nary_tree_lstm, (params, t, t.root)
        if b == 128:
            big = nary.init_params(jax.random.PRNGKey(0), vocab=1000, hidden=256)
            r = data.batch(data.random_binary_trees(b, seed=0))
            yield "Tree-LSTM H 256 (random trees)", b, nary.nary_tree_lstm, (big, r, r.root)


def chosen(f, xs, traced: bool = False):
    """What the default chose for these arguments, called eagerly or traced."""
    if not traced:
        return f.executable(*xs)[0].fork_choice
    box = []
    jax.eval_shape(lambda *a: box.append(f.executable(*a)[0].fork_choice), *xs)
    return box[0]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    batches = [1, 64, 1024] if args.quick else [1, 16, 128, 1024]
    repeats = 3 if args.quick else 5
    print(f"# fork_choice  {datetime.datetime.now():%Y-%m-%d %H:%M}  {platform.machine()}  jax {jax.__version__}"
          f"  {jax.devices()[0].platform}")
    rows, worst = [], 0.0
    for name, b, f, xs in cases(batches):
        systems = {"fork=True": f.with_options(fork=True), "fork=False": f.with_options(fork=False),
                   "default": f}
        want = f.reference(*xs) if b <= 128 else None
        calls = {}
        for label, g in systems.items():
            for mode, h in (("eager", g), ("jit", jax.jit(g))):
                got = h(*xs)
                if want is not None:
                    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
                        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-5,
                                                   err_msg=f"{name}, batch {b}, {label}, {mode}")
                calls[label, mode] = lambda h=h: h(*xs)
        t = time_calls(calls, repeats, min_time=0.2)
        for mode in ("eager", "jit"):
            chose = chosen(f, xs, traced=mode == "jit").fork
            fork, nofork, default = (t["fork=True", mode], t["fork=False", mode], t["default", mode])
            ratio = default / min(fork, nofork)
            worst = max(worst, ratio)
            rows.append([name, str(b), mode, fmt_time(fork), fmt_time(nofork), fmt_time(default),
                         "fork" if chose else "no fork", f"{fork / nofork:.2f}x", f"{ratio:.2f}x"])
            print("  ", " | ".join(rows[-1]), flush=True)
    print()
    print_table(["program", "batch", "call", "fork=True", "fork=False", "default", "default chose", "fork/nofork time",
                 "default/best"], rows)
    print(f"\nworst default/best: {worst:.2f}x (target <= {TARGET}x): {'PASS' if worst <= TARGET else 'MISS'}")


if __name__ == "__main__":
    main()
