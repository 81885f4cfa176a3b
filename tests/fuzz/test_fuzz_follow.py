"""The random-program differential test (`test_fuzz.py`) on the plain machine
with every block a follow block (`Scheduler.follow`): each step runs the
chosen block and then every other block once, in `follow_order`, for the lanes
waiting at it (a chosen block that is followed too runs once, in its place).
The results must not change; a lane then often runs several blocks in one
step (calls, returns, stack pushes and pops included)."""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest

import pcbatch
from pcbatch.fsm import Earliest, follow_order

from .generator import LARGE, SMALL
from .test_fuzz import _examples, _run


class FollowAll(Earliest):
    """`Earliest`, and every block reachable from the entry as a follow block."""

    follow: tuple[int, ...] = ()

    def for_program(self, prog):
        bound = FollowAll()
        bound.follow = follow_order(prog.blocks, prog.entry_block)
        return bound


def following(fn, masked: bool = False):
    """`fn` with every block followed; `masked`: the follow blocks run every
    step, masked to their lanes (`Tuning.masked_follow`, the GPU's default)."""
    return fn.with_options(fork=False, tuning=pcbatch.Tuning(masked_follow=masked)).with_schedule(FollowAll())


def test_follow_order_is_a_valid_permutation():
    """Every block reachable after the start appears once, the start not at all."""
    import jax.numpy as jnp

    @pcbatch.autobatch(fork=False)
    def fib(n):
        return n if n <= 1 else fib(n - 1) + fib(n - 2)

    prog = fib.lowered(jnp.arange(3))
    for start in range(prog.num_blocks):
        order = follow_order(prog.blocks, start)
        assert start not in order and len(set(order)) == len(order)
        assert set(order) <= set(range(prog.num_blocks))


@pytest.mark.parametrize("masked", [False, True])
def test_fuzz_follow_programs(masked):
    """`make test`: 2 fixed random programs, the simplest and one random (or
    `PCBATCH_FUZZ_EXAMPLES` / 16; `make test` must stay under CI's 8 minutes, and NUTS
    runs follow blocks in every test), with the follow blocks under conditionals (the
    CPU's default) and masked (the GPU's)."""
    n = max(1, _examples(32) // 16)
    ran = _run(n, SMALL, forks=(False,), chunk=20 + 2 * masked,
               adapt=functools.partial(following, masked=masked))
    print(f"fuzz (follow): {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


@pytest.mark.slow
@pytest.mark.parametrize("masked", [False, True])
def test_fuzz_follow_long(masked):
    """`make fuzz`: PCBATCH_FUZZ_EXAMPLES / 10 large programs with every block
    followed, each way."""
    n = max(1, _examples(10_000) // 10)
    ran = _run(n, LARGE, forks=(False,), chunk=21 + 2 * masked, adapt=functools.partial(following, masked=masked))
    print(f"fuzz (follow): {ran} programs", file=sys.stderr)
    assert ran >= n, f"only {ran} of {n} generated programs ran"


def _equations(jaxpr) -> int:
    """Equations in a jaxpr and every jaxpr nested in its equations' parameters."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += _equations(inner)
    return total


def test_a_followed_block_is_compiled_once():
    """Following every block does not add a second copy of each to the
    program: a chosen block that is followed runs in its place in the follow
    order (before, the machine held each block twice, NUTS's compile included)."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from corpus import collatz

    x = jnp.arange(1, 9)
    in_place = collatz.with_options(tuning=pcbatch.Tuning(switch_max_leaves=-1))  # each block a lax.cond, as followed
    once = _equations(jax.make_jaxpr(in_place)(x).jaxpr)
    followed = _equations(jax.make_jaxpr(following(in_place))(x).jaxpr)
    assert followed < 1.3 * once, (followed, once)
    assert [int(v) for v in following(collatz)(x)] == [int(v) for v in collatz.reference(x)]


def test_masked_follow_blocks_run_without_conditionals():
    """`masked_follow=True` compiles the follow blocks without a `conditional`
    each (XLA:GPU syncs with the host on every one), and gives the same results."""
    import jax
    import jax.numpy as jnp

    sys.path.insert(0, str(Path(__file__).parents[2]))
    from benchmarks.common import hlo_step_counts
    sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
    from corpus import collatz

    x = jnp.arange(1, 9)
    conds = {}
    for masked in (False, True):
        f = following(collatz, masked=masked)
        compiled = jax.jit(f).lower(x).compile()
        counts = hlo_step_counts(compiled.as_text())
        conds[masked] = counts["every step"]["conditional"] + counts["in branches"]["conditional"]
        # The results of the program counted (an eager call would compile it once more).
        assert [int(v) for v in compiled(x)] == [int(v) for v in collatz.reference(x)]
    blocks = len(following(collatz).lowered(x).blocks)
    assert conds[True] <= conds[False] - (blocks - 1), conds
