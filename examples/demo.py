"""End-to-end demo: recursive single-example Python, autobatched into one XLA loop.

Run with `make demo` (or `python examples/demo.py`).
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch


@pcbatch.autobatch
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch
def collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


@pcbatch.autobatch(in_axes=(None, 0, 0, 0))
def tree_score(params, left, right, node):
    """Score of a binary tree stored as child-index arrays (-1 = leaf)."""
    if left[node] < 0:
        return jnp.tanh(params["leaf"] * node)
    a = tree_score(params, left, right, left[node])
    b = tree_score(params, left, right, right[node])
    return jnp.tanh(params["w"] @ jnp.stack([a, b]))


def random_tree(rng, leaves, size):
    """Random binary tree over `leaves` leaves, padded to `size` nodes; root is node 0."""
    left, right = -np.ones(size, np.int32), -np.ones(size, np.int32)
    frontier, nxt = [0], 1
    while len(frontier) < leaves:
        node = frontier.pop(rng.integers(len(frontier)))
        left[node], right[node] = nxt, nxt + 1
        frontier += [nxt, nxt + 1]
        nxt += 2
    return left, right


def report(name, f, *args):
    start = time.perf_counter()
    result, status = f.checked(*args)
    jax.block_until_ready(result)
    first = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(f.checked(*args)[0])
    again = time.perf_counter() - start
    expected = f.reference(*args)
    same = jax.tree_util.tree_all(jax.tree_util.tree_map(np.allclose, result, expected))
    steps, batch, peak = int(status.steps), status.blocks_run.shape[0], int(status.peak_lanes)
    work = int(status.blocks_run.sum())
    print(f"\n== {name}: batch of {batch}")
    print(f"  results      {np.asarray(result)}")
    print(f"  per-example Python agrees: {same}")
    print(f"  VM steps     {steps}  (blocks run per example: min {int(status.blocks_run.min())}, "
          f"max {int(status.blocks_run.max())})")
    forked = " (fork-join: independent calls run in lanes of their own)" if peak > batch else ""
    print(f"  lanes        at most {peak} in use{forked}; {work / steps:.1f} lanes ran a block per step on average")
    print(f"  time         first call {first * 1e3:.0f} ms (trace + compile + run), "
          f"cached call {again * 1e3:.2f} ms")


def main():
    print("pcbatch demo — recursive single-example code, batched into one lax.while_loop")
    print("\nThe block IR of fib:\n")
    print(fib.ir())
    print("Lowered to the stack machine (variable classes and stacks):\n")
    print(fib.lowered(jnp.arange(8)))

    n = jnp.array([3, 7, 4, 5, 10, 1, 0, 12])
    print(f"fib inputs: {np.asarray(n)}")
    report("fib", fib, n)

    m = jnp.array([1, 6, 27, 97, 871, 2, 3, 9])
    print(f"\ncollatz inputs: {np.asarray(m)}")
    report("collatz", collatz, m)

    rng = np.random.default_rng(0)
    trees = [random_tree(rng, int(k), 63) for k in rng.integers(2, 32, size=16)]
    left = jnp.array(np.stack([t[0] for t in trees]))
    right = jnp.array(np.stack([t[1] for t in trees]))
    params = {"leaf": jnp.float32(0.1), "w": jnp.array([0.7, -0.4])}
    print(f"\ntree_score: 16 random binary trees with 2-31 leaves (child-index arrays, shared params)")
    args = (params, left, right, jnp.zeros(16, jnp.int32))
    report("tree_score (fork-join: both children of a node at once)", tree_score, *args)
    report("tree_score, fork=False (one lane per tree, children one after another)",
           tree_score.with_options(fork=False), *args)


if __name__ == "__main__":
    main()
