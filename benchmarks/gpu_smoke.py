"""First check on a GPU machine (benchmarks/gpu.sh): pcbatch compiles and runs
there and gives the per-example Python's results, plain and fork-join."""
import jax
import jax.numpy as jnp
import numpy as np

import pcbatch


@pcbatch.autobatch
def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def main() -> None:
    print("jax", jax.__version__, jax.devices())
    x = jnp.arange(12)
    want = np.asarray(fib.reference(x))
    for fork in (False, True):
        got = np.asarray(fib.with_options(fork=fork)(x))
        assert (got == want).all(), (fork, got, want)
    print("smoke ok: fib fork=False/True equal the per-example Python on", jax.devices()[0].platform)


if __name__ == "__main__":
    main()
