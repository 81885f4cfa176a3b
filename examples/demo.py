"""pcbatch in one screen: a recursive function written for ONE example, run on a batch.

Run with `make demo` (or `python examples/demo.py`); add `--verbose` to also print
the program pcbatch compiled (its blocks, and the stack machine they became).
"""
import inspect
import sys
import textwrap
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


def timed(call, repeat=1):
    """The result of `call()` and its best wall-clock time over `repeat` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = jax.block_until_ready(call())
        best = min(best, time.perf_counter() - start)
    return out, best


def row(values):
    """Integers in fixed-width columns, so the batch and both results line up."""
    return "[" + " ".join(f"{int(v):4d}" for v in np.asarray(values)) + " ]"


def ms(seconds):
    return f"{seconds * 1e3:8.1f} ms"


def main(verbose=False):
    print("pcbatch demo: a recursive function written for ONE example, run on a whole batch\n")
    print("The function, as written:\n")
    print(textwrap.indent(inspect.getsource(fib.fn), "    "))

    n = jnp.array([3, 7, 4, 5, 10, 1, 0, 12])
    batch = n.shape[0]
    print(f"{f'The batch, {batch} examples:':<31}{row(n)}")
    expected, python = timed(lambda: fib.reference(n))  # the original Python, one example at a time
    print(f"Python, one example at a time: {row(expected)}")
    # The first call traces fib and compiles one XLA program for this batch shape;
    # print the label first so the wait has a caption.
    print("pcbatch, all at once:          ", end="", flush=True)
    (result, status), first = timed(lambda: fib.checked(n))
    same = "the same" if np.array_equal(result, expected) else "DIFFERENT"
    print(f"{row(result)}  ({same})\n")

    _, batched = timed(lambda: fib.checked(n), repeat=5)
    choice = fib.executable(n)[0].fork_choice  # what the default, fork="auto", chose and why
    other = fib.with_options(fork=not choice.fork)
    (_, other_status), other_first = timed(lambda: other.checked(n))
    _, other_batched = timed(lambda: other.checked(n), repeat=5)
    print("Time for the whole batch (a first call also compiles, once per batch shape):")
    print(f"  {'pcbatch, default':<29}{ms(batched)}   first call {first:5.1f} s")
    print(f"  {f'pcbatch, fork={not choice.fork}':<29}{ms(other_batched)}   first call {other_first:5.1f} s")
    print(f"  {'Python loop over examples':<29}{ms(python)}\n")

    steps, work = int(status.steps), int(status.blocks_run.sum())
    forked = status if choice.fork else other_status
    why = choice.reason.split(" (")[0]  # the plain-words part, without the numbers
    print(f"What happened: the {batch} examples ran together in one loop of {steps} steps; each step runs\n"
          f"one piece of fib (the code between two calls) for every example ready for it, {work / steps:.1f} "
          f"of {batch}\non average. fib(n - 1) and fib(n - 2) do not need each other, so fork=True runs them\n"
          f"side by side ({int(forked.steps)} steps, up to {int(forked.peak_lanes)} calls at once). The default "
          f"{'forked' if choice.fork else 'did not fork'}:\n{textwrap.fill(why + '.', 92)}")

    if verbose:
        print("\nThe blocks of fib (pcbatch's intermediate form):\n")
        print(fib.ir())
        print("Lowered to the stack machine (each variable's storage class and stack):\n")
        print(fib.lowered(n))


if __name__ == "__main__":
    main(verbose="--verbose" in sys.argv[1:] or "-v" in sys.argv[1:])
