"""The while loop every machine runs, with an optional recorder riding along."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def _no_observer(state: Any, block: jax.Array, lanes: jax.Array) -> jax.Array:
    return block


def while_loop_recorded(cond, step, init: Any, recorder: Any = None) -> tuple[Any, Any]:
    """`lax.while_loop(cond, body)` where `step(state, observe)` returns
    `(new_state, info)` and calls `block = observe(state, block, lanes)` once
    the step's block and the lanes it runs (dense, then `num_lanes`: none) are
    chosen, before it reads or updates anything with them.
    With a `recorder` (gradients, `grad/recorder.py`) its tape rides along:
    `recorder.before` reads the pre-step state there, and the block comes
    back data-dependent on what it wrote (every in-place update of the step
    depends on the block, so XLA reads first instead of copying the state);
    `recorder.after` sees the new state. Without one the loop is
    exactly the plain one. Returns `(final_state, tape)`."""
    if recorder is None:
        return lax.while_loop(cond, lambda s: step(s, _no_observer)[0], init), None

    def body(carry):
        state, tape = carry
        seen = {}

        def observe(state, block, lanes):
            tape_, taken, dep = recorder.before(tape, state, block, lanes)
            # The block index depends on what the recorder wrote (`dep` never
            # equals the minimum; XLA cannot know): the step's updates wait for
            # its reads. (An optimization barrier is expanded away on CPU.)
            block = jnp.where(dep == jnp.iinfo(dep.dtype).min, block + 1, block)
            seen.update(tape=tape_, taken=taken, block=block)
            return block

        new, info = step(state, observe)
        return new, recorder.after(seen["tape"], seen["taken"], new, {**info, "block": seen["block"]})

    return lax.while_loop(lambda c: cond(c[0]), body, (init, recorder.init(init)))


def block_in(block: jax.Array, blocks: list[int]) -> jax.Array:
    """Whether the (traced) chosen block is one of `blocks`."""
    return jnp.any(block == jnp.array(blocks, block.dtype)) if blocks else jnp.zeros((), bool)
