"""`pcbatch.runtime.lanes`: the row helpers every machine shares, against plain
NumPy on random inputs."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pcbatch.runtime.lanes import first_true, gather_rows, pad_rows, scatter_rows, with_columns


@settings(max_examples=25)
@given(st.integers(0, 2**16), st.integers(1, 9), st.integers(1, 6), st.booleans())
def test_with_columns_equals_setting_each_column(seed, cols, rows, batched_lead):
    rng = np.random.default_rng(seed)
    shape = (2, rows, cols) if batched_lead else (rows, cols)
    table = rng.integers(-50, 50, shape).astype(np.int32)
    chosen = sorted(rng.choice(cols, rng.integers(0, cols + 1), replace=False).tolist())
    # Each new column is an array over the leading axes, a scalar, or a float to be cast.
    values = {}
    for c in chosen:
        kind = rng.integers(3)
        values[c] = (rng.integers(-50, 50, shape[:-1]).astype(np.int32) if kind == 0
                     else int(rng.integers(-50, 50)) if kind == 1 else np.float32(rng.integers(-50, 50)))
    want = table.copy()
    for c, v in values.items():
        want[..., c] = v
    got = with_columns(jnp.asarray(table), values)
    assert got.dtype == jnp.int32 and got.shape == table.shape
    np.testing.assert_array_equal(np.asarray(got), want)


def test_gather_scatter_pad_and_first_true():
    x = jnp.arange(12, dtype=jnp.int32).reshape(6, 2)
    ids = jnp.array([4, 0, 6], jnp.int32)  # 6: past the end (fill on read, dropped on write)
    np.testing.assert_array_equal(gather_rows(x, ids), [[8, 9], [0, 1], [0, 0]])
    y = scatter_rows(x, ids, jnp.full((3, 2), -1.0))
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(np.asarray(y)[[0, 4]], -1)
    np.testing.assert_array_equal(np.asarray(y)[[1, 2, 3, 5]], np.asarray(x)[[1, 2, 3, 5]])
    np.testing.assert_array_equal(pad_rows(jnp.array([1, 2]), 4, 7), [1, 2, 7, 7])
    mask = jnp.array([False, True, True, False, True])
    np.testing.assert_array_equal(first_true(mask, 4), [1, 2, 4, 5])
    assert jax.tree_util.tree_structure(gather_rows({"a": x}, ids)) == jax.tree_util.tree_structure({"a": x})
