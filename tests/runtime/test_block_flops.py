"""`block_flops`: XLA's flop count of each block at a width (the arithmetic part of
`pcbatch.step_costs`' cost model)."""
import jax.numpy as jnp

import pcbatch
from pcbatch.runtime.block import block_flops


def test_block_flops_count_a_blocks_arithmetic_at_a_width():
    @pcbatch.autobatch(in_axes=(None, 0, 0))
    def walk(w, x, n):
        while n > 0:
            x = jnp.tanh(w @ x)
            n = n - 1
        return x

    prog = walk.lowered(jnp.ones((16, 16)), jnp.ones((4, 16)), jnp.array([1, 2, 3, 4]))
    flops = block_flops(prog, 8)
    assert len(flops) == prog.num_blocks
    # The loop body's matrix product on 8 rows: 8 x 16 x 16 multiply-adds; every other block far less.
    assert max(flops) >= 2 * 8 * 16 * 16
    assert sorted(flops)[-2] < 2 * 8 * 16 * 16 / 4
