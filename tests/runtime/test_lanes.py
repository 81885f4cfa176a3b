"""`pcbatch.runtime.lanes`: the row helpers every machine shares, and the pool's
queue ranks (`pool.ranks_by_slot`), against plain NumPy on random inputs."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pcbatch.runtime.lanes import first_true, gather_rows, pad_rows, scatter_rows, take, where, with_columns
from pcbatch.runtime.pool import ranks_by_slot, slot_of


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
    # Under jit, as in the machine: the table and the array columns traced, the numbers
    # constants (one compile per example; eagerly, each of its ops compiles for every new shape).
    arrays = {c: v for c, v in values.items() if isinstance(v, np.ndarray)}
    numbers = {c: v for c, v in values.items() if c not in arrays}
    got = jax.jit(lambda t, a: with_columns(t, {**a, **numbers}))(jnp.asarray(table), arrays)
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


def test_take_equals_jax_fill_mode_gather():
    """`take` (the machines' gathers) against JAX's own fill-mode indexing: one or two index
    arrays of several shapes, a scalar index, trailing axes, indices past either end (negative
    ones are out of range, not wrapped), int and float arrays, under x64 too (uint64 compares)."""
    rng = np.random.default_rng(5)
    a = rng.normal(size=(7, 5, 3)).astype(np.float32)
    cases = [(rng.integers(-3, 10, 6).astype(np.int32),),
             (rng.integers(-2, 9, (3, 4)).astype(np.int32),),
             (rng.integers(-1, 8, 5).astype(np.int32), rng.integers(-1, 6, 5).astype(np.int32)),
             (np.int32(3), rng.integers(0, 7, 4).astype(np.int32)),
             (rng.integers(0, 9, (2, 1)).astype(np.int32), rng.integers(-1, 6, (1, 3)).astype(np.int32))]
    for x64 in (False, True):
        with jax.enable_x64(x64):
            for arr in (a, (a * 10).astype(np.int32)):
                for idx in cases:
                    for fill in (0, -7):
                        want = jnp.asarray(arr).at[idx].get(mode="fill", fill_value=fill, wrap_negative_indices=False)
                        got = jax.jit(lambda x, *i: take(x, *i, fill=fill))(arr, *idx)
                        assert got.dtype == want.dtype and got.shape == want.shape, (idx, got.shape, want.shape)
                        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(idx))
    key = jax.random.split(jax.random.key(0), 4)  # typed keys take JAX's own path
    assert take(key, jnp.array([1, 4], jnp.int32)).shape == (2,)


# Each example compiles: a few drawn, and the corners: the most places, rows and blocks
# (several words of bit fields), and one row, place and block.
@settings(max_examples=5)
@given(st.integers(0, 2**16), st.integers(1, 8), st.one_of(st.integers(1, 40), st.sampled_from([1023, 2999])),
       st.integers(1, 12))
@example(seed=7, places=8, rows=2999, blocks=12)
@example(seed=3, places=1, rows=1, blocks=1)
def test_queue_ranks_by_successor_place_equal_counting_in_python(seed, places, rows, blocks):
    """The pool's queue bookkeeping (`pool.ranks_by_slot`): each row names one of the
    block's successors by its place (or none); it gets the successor's block, its rank
    among the rows going there, and the count per block. Up to 8 places and 3,000 rows: the
    counts then need several words of bit fields."""
    rng = np.random.default_rng(seed)
    used = sorted(rng.choice(blocks, min(places, blocks), replace=False).tolist())
    successors = used + [blocks] * (places - len(used))          # padding places name no block
    slot = rng.integers(0, len(used) + 2, rows).astype(np.int32)  # past the real places: no queue
    # Under jit, as in the machine (eagerly, each of its ops compiles for every new shape).
    dest, rank, added = jax.jit(ranks_by_slot, static_argnums=2)(jnp.asarray(slot), jnp.asarray(successors, jnp.int32),
                                                                  blocks)
    want_dest, want_rank, seen = [], [], {}
    for k in slot:
        d = used[k] if k < len(used) else blocks
        want_dest.append(d)
        want_rank.append(seen.get(d, 0))
        seen[d] = seen.get(d, 0) + 1
    np.testing.assert_array_equal(np.asarray(dest), want_dest)
    queued = np.asarray(want_dest) < blocks  # a row bound nowhere is dropped: its rank is never read
    np.testing.assert_array_equal(np.asarray(rank)[queued], np.asarray(want_rank)[queued])
    np.testing.assert_array_equal(np.asarray(added), [seen.get(b, 0) for b in range(blocks)])


def test_where_equals_jnp_where_in_value_dtype_weak_type_and_shape():
    """The machines' one-`select` `where` stands in for `jnp.where` everywhere: the same
    result, dtype, weak type and broadcast shape, traced (as in a machine) and eagerly."""
    mask = np.array([[True, False, True], [False, False, True]])
    cases = [(mask, np.arange(3, dtype=np.int32), 7), (mask[0], 2.5, np.float32(-1)),
             (mask[0], jnp.asarray(2.5), np.arange(3, dtype=np.int32)),  # weak float with int: weak result
             (np.array([1, 0, 2]), np.int16(4), np.arange(3, dtype=np.int8)), (True, 1, 2),
             (mask, np.ones((2, 1), np.float32), np.zeros((1, 3), np.float32))]
    for cond, x, y in cases:
        want = jnp.where(cond, x, y)
        for got in (where(cond, x, y), jax.jit(lambda c, a, b: where(c, a, b))(cond, x, y)):
            assert got.shape == want.shape and got.dtype == want.dtype and got.weak_type == want.weak_type
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_slot_of_by_table_equals_by_comparisons():
    """A block's successors: more than two are looked up in a table, fewer compared one by one."""
    dest = np.array([0, 3, 9, 5, 12, 3, 7, 20], np.int32)
    for targets in ([3], [3, 5], [3, 5, 7], [0, 3, 5, 7, 12]):
        want = [targets.index(d) if d in targets else len(targets) for d in dest]
        np.testing.assert_array_equal(np.asarray(slot_of(jnp.asarray(dest), targets)), want)
        np.testing.assert_array_equal(np.asarray(slot_of(jnp.asarray(dest), targets, none=9)),
                                      [w if w < len(targets) else 9 for w in want])
