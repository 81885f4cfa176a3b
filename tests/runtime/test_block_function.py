"""`block_function`: one block's ops on a width of rows, as a function of what
they read (what `pcbatch.step_costs` times)."""
import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from pcbatch.ir import Prim
from pcbatch.runtime.block import block_function


def test_block_function_runs_a_blocks_ops_on_rows():
    @pcbatch.autobatch(in_axes=(None, 0, 0))
    def walk(w, x, n):
        while n > 0:
            x = jnp.tanh(w @ x)
            n = n - 1
        return x

    prog = walk.lowered(jnp.ones((16, 16)), jnp.ones((4, 16)), jnp.array([1, 2, 3, 4]))
    made = [block_function(prog, b, 8) for b in range(prog.num_blocks)]
    for block, m in zip(prog.blocks, made):   # a block without ops of its own has no function
        assert (m is None) == (not any(isinstance(op, Prim) for op in block.ops))
    body = next(b for b, block in enumerate(prog.blocks) if any("@" in getattr(op, "text", "") for op in block.ops))
    run, specs = made[body]
    w_var = next(v for v in specs["var"] if v.endswith(".w"))
    x_var = next(v for v in specs["var"] if v.endswith(".x"))
    assert specs["var"][w_var].shape == (16, 16) and specs["var"][x_var].shape == (8, 16)  # w shared, x per row
    rng = np.random.default_rng(0)
    inputs = jax.tree_util.tree_map(lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype)
                                    if jnp.issubdtype(s.dtype, jnp.floating) else jnp.ones(s.shape, s.dtype), specs)
    env, _ = run(inputs)
    w, x = np.asarray(inputs["var"][w_var]), np.asarray(inputs["var"][x_var])
    np.testing.assert_allclose(env[x_var], np.tanh(x @ w.T), rtol=1e-5, atol=1e-6)
    # XLA counts the product's 8 x 16 x 16 multiply-adds in it.
    cost = jax.jit(run).lower(specs).cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    assert cost["flops"] >= 2 * 8 * 16 * 16
