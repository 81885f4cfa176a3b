"""pcbatch compiles its own calls with its XLA:CPU options
(`Tuning.cpu_xla_options`): without the tree-reduction rewrite (a reduction
over the lanes is one kernel fused with what it reduces) and with copy
insertion by region analysis (fewer copies). Inside a caller's `jax.jit` the
caller's options rule (JAX takes compiler options only at the top level)."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from corpus import collatz  # noqa: E402

collatz_steps = collatz.with_options(fork=False)


def _count(f, n, op: str) -> int:
    """Instructions `op` in the optimized HLO of `f`'s own (eager) call."""
    exe, inputs = f.executable(n)
    return exe.runner.lower(inputs, exe.new_workspace()).compile().as_text().count(f" {op}(")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the option applies to XLA:CPU")
def test_eager_calls_compile_without_the_tree_reduction_rewrite():
    n = jnp.arange(1, 200)   # > 32 lanes: the rewrite would split every reduction over them
    fused = collatz_steps.with_options(tuning=pcbatch.Tuning(cpu_xla_options=True))
    split = collatz_steps.with_options(tuning=pcbatch.Tuning(cpu_xla_options=False))
    assert _count(fused, n, "reduce-window") == 0 < _count(split, n, "reduce-window")
    assert _count(fused, n, "copy") < _count(split, n, "copy")
    want = collatz_steps.reference(n)
    for f in (fused, split):
        np.testing.assert_array_equal(f(n), want)
        np.testing.assert_array_equal(jax.jit(f)(n), want)   # traced: the caller's options
        np.testing.assert_array_equal(jax.jit(lambda: f(np.asarray(n)))(), want)   # constants inside a trace
        np.testing.assert_array_equal(f.checked(n)[0], want)


def test_cpu_xla_options_is_validated():
    with pytest.raises(pcbatch.OptionError, match="cpu_xla_options"):
        pcbatch.Tuning(cpu_xla_options=1)
    assert pcbatch.Tuning(cpu_xla_options=False).compiler_options() == {}
