"""Plain-JAX peers of `pcbatch.models.nary.nary_tree_lstm` (the binary Tree-LSTM).

Both compute exactly what `nary_tree_lstm(params, trees, trees.root)` returns:
the root's `(h, c)`, each `[batch, H]`, with the same cell
(`pcbatch.models.nary.binary_lstm_cell`) and the same leaf input
(`node_input`: `E[word]` at a leaf, 0 at an internal node; a leaf's children
states are 0). They are the baselines of `benchmarks/treelstm.py`
(`python -m benchmarks.treelstm`, the `bench-treelstm` benchmark).

* `per_example_jit(params, trees)`: no batching at all. One jitted function
  handles ONE tree: a `lax.fori_loop` over node ids `0 .. num_nodes-1` in
  increasing order fills `[max_nodes, H]` tables of h and c from the children's
  rows (valid because node ids are topological: a child's id is smaller than
  its parent's). It is called once per tree from a Python loop; all trees of
  one padded size (`max_nodes`) share one compilation.

* `depth_batched(params, trees)`: TensorFlow Fold / DyNet style batching by
  depth. On the host (`depth_levels`, NumPy) every node gets its height (leaves
  0, an internal node 1 + the larger of its children's heights) and the
  `(example, node)` pairs of each height level are listed as flat row indices
  `example * max_nodes + node` into one `[batch * max_nodes + 1, H]` state
  table (the last row is all zeros: the "children" of leaves and of padding
  entries). On the device (`depth_batched_device`, one `jax.jit`) a Python loop
  over the levels (unrolled in the trace) runs `max_height + 1` batched cell
  steps: each gathers the level's children rows of h and c, runs
  `binary_lstm_cell` vmapped over the level's nodes and scatters the new rows
  back; the roots' rows are gathered at the end.

  Padding rule: level k's index arrays are padded to `level_width(n_k)`, where
  n_k is the number of nodes at height k in the batch: n_k rounded up to three
  significant bits (a multiple of 2^(b-3) where 2^(b-1) < n_k <= 2^b), at
  least 8; e.g. 8643 -> 10240, 300 -> 320, 5 -> 8. Pad entries read the zero row, have no word, and write
  to row `batch * max_nodes + 1`, which is out of bounds and dropped
  (`mode="drop"`). The compiled program therefore depends only on the tuple of
  padded widths (plus batch, max_nodes, H): a given batch always reuses one
  compilation, and batches with similar level profiles share one; a level of 8
  or more nodes is padded by less than 25% (padding every level to the widest
  one instead would cost ~10x the useful work on sentence-like trees at batch
  256). Level 0 (the
  leaves) is always the widest level, and a level never has more than
  `leaves / (k + 1)` nodes.

  `depth_levels` + `pack_levels` + one `jax.device_put` is the host
  preprocessing (timed separately by the benchmark); `depth_batched` = that +
  `depth_batched_device`.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from pcbatch.data import Tree
from pcbatch.models._common import node_input
from pcbatch.models.nary import binary_lstm_cell

__all__ = ["Levels", "depth_batched", "depth_batched_device", "depth_levels", "level_width",
           "node_heights", "one_tree", "pack_levels", "per_example_jit", "split_trees"]


# --------------------------------------------------------------------------
# a. per-example jit
# --------------------------------------------------------------------------

@jax.jit
def one_tree(params: dict, tree: Tree) -> tuple[jax.Array, jax.Array]:
    """(h, c) at the root of ONE (unbatched) tree, each [H]: nodes in id order."""
    max_nodes = tree.word.shape[0]
    hidden = params["U"].shape[1] // 2
    zeros = jnp.zeros((hidden,), jnp.float32)

    def body(j, tables):
        h_tab, c_tab = tables
        left, right = tree.children[j, 0], tree.children[j, 1]
        leaf = left < 0
        l, r = jnp.maximum(left, 0), jnp.maximum(right, 0)
        h_l = jnp.where(leaf, zeros, h_tab[l])
        c_l = jnp.where(leaf, zeros, c_tab[l])
        h_r = jnp.where(leaf, zeros, h_tab[r])
        c_r = jnp.where(leaf, zeros, c_tab[r])
        x = node_input(params, tree, j)
        h, c = binary_lstm_cell(params["W"], params["U"], params["b"], x, h_l, c_l, h_r, c_r)
        return h_tab.at[j].set(h), c_tab.at[j].set(c)

    init = (jnp.zeros((max_nodes, hidden), jnp.float32), jnp.zeros((max_nodes, hidden), jnp.float32))
    h_tab, c_tab = jax.lax.fori_loop(0, tree.num_nodes, body, init)
    return h_tab[tree.root], c_tab[tree.root]


def split_trees(trees: Tree) -> list[Tree]:
    """A batch as a list of single trees already on the device (so that the
    per-example loop does not pay a host-to-device copy per call)."""
    batch = int(np.shape(trees.root)[0])
    return [jax.device_put(Tree(*(np.asarray(a)[i] for a in trees))) for i in range(batch)]


def per_example_jit(params: dict, trees: Tree | list[Tree]) -> tuple[jax.Array, jax.Array]:
    """`one_tree` on each tree of the batch in a Python loop; results stacked
    into [batch, H] (as `nary_tree_lstm` returns them). `trees` is a batched
    `Tree` or the list `split_trees` makes of one."""
    items = split_trees(trees) if isinstance(trees, Tree) else trees
    outs = [one_tree(params, t) for t in items]
    return jnp.stack([h for h, _ in outs]), jnp.stack([c for _, c in outs])


# --------------------------------------------------------------------------
# b. depth-batched (TF Fold / DyNet style)
# --------------------------------------------------------------------------

class Levels(NamedTuple):
    """Host-side schedule of one batch (NumPy arrays; see the module docstring).

    Per height level k (a tuple, one entry per level): `node[k]` the flat row
    each entry writes (pad: batch*max_nodes + 1, dropped), `left[k]` /
    `right[k]` its children's rows (leaf or pad: the zero row batch*max_nodes),
    `word[k]` its word (-1: internal node or pad). `root` [batch]: each
    example's root row. `counts`: real nodes per level (before padding)."""
    node: tuple[np.ndarray, ...]
    left: tuple[np.ndarray, ...]
    right: tuple[np.ndarray, ...]
    word: tuple[np.ndarray, ...]
    root: np.ndarray
    counts: tuple[int, ...]

    @property
    def max_height(self) -> int:
        return len(self.counts) - 1

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(int(a.shape[0]) for a in self.node)


def level_width(n: int, minimum: int = 8) -> int:
    """Padded size of a level with n nodes: n rounded up to three significant
    bits (a multiple of 2^(b-3), where 2^b is the power of two >= n), at least
    `minimum`."""
    n = int(n)
    step = 1 << max(0, max(0, n - 1).bit_length() - 3)
    return max(minimum, -(-n // step) * step)


def node_heights(trees: Tree) -> np.ndarray:
    """int64 [batch, max_nodes]: each node's height (leaf 0); -1 on padding ids.
    Vectorized over the batch; nodes in id order (children first)."""
    children = np.asarray(trees.children)
    batch, max_nodes = children.shape[:2]
    rows = np.arange(batch)
    h = np.zeros((batch, max_nodes), np.int64)
    for j in range(max_nodes):
        l, r = children[:, j, 0], children[:, j, 1]
        inner = l >= 0
        if inner.any():
            hl = h[rows, np.maximum(l, 0)]
            hr = h[rows, np.maximum(r, 0)]
            h[:, j] = np.where(inner, 1 + np.maximum(hl, hr), 0)
    h[np.arange(max_nodes)[None, :] >= np.asarray(trees.num_nodes)[:, None]] = -1
    return h


def depth_levels(trees: Tree, min_width: int = 8) -> Levels:
    """The host preprocessing of `depth_batched` for a batched `Tree`."""
    children = np.asarray(trees.children)
    word = np.asarray(trees.word)
    batch, max_nodes = word.shape
    n_rows = batch * max_nodes
    zero_row, drop_row = n_rows, n_rows + 1
    heights = node_heights(trees).ravel()
    flat_children = children.reshape(n_rows, 2).astype(np.int64)
    base = np.repeat(np.arange(batch, dtype=np.int64) * max_nodes, max_nodes)
    kid_rows = np.where(flat_children >= 0, base[:, None] + flat_children, zero_row)
    flat_word = word.ravel()
    order = np.argsort(heights, kind="stable")
    order = order[heights[order] >= 0]                 # drop padding ids
    counts = np.bincount(heights[order])
    starts = np.concatenate([[0], np.cumsum(counts)])
    node, left, right, words = [], [], [], []
    for k, n in enumerate(counts):
        ids = order[starts[k]:starts[k + 1]]
        w = level_width(n, min_width)
        pad = w - n

        def padded(a, fill):
            return np.concatenate([a, np.full(pad, fill, a.dtype)]).astype(np.int32)

        node.append(padded(ids, drop_row))
        left.append(padded(kid_rows[ids, 0], zero_row))
        right.append(padded(kid_rows[ids, 1], zero_row))
        words.append(padded(flat_word[ids].astype(np.int64), -1))
    root = (np.arange(batch) * max_nodes + np.asarray(trees.root)).astype(np.int32)
    return Levels(tuple(node), tuple(left), tuple(right), tuple(words), root, tuple(int(c) for c in counts))


def pack_levels(levels: Levels) -> tuple[np.ndarray, np.ndarray]:
    """The levels as two host arrays, so that moving them to the device is two
    transfers: int32 [4, sum(widths)] (rows: node, left, right, word; levels
    side by side) and the root rows [batch]. Cut apart again with `widths`."""
    packed = np.stack([np.concatenate(part) for part in (levels.node, levels.left, levels.right, levels.word)])
    return packed.astype(np.int32), levels.root


@functools.partial(jax.jit, static_argnames=("widths", "n_rows"))
def _depth_device(params: dict, packed: jax.Array, root: jax.Array, widths: tuple[int, ...], n_rows: int):
    hidden = params["U"].shape[1] // 2
    h_tab = jnp.zeros((n_rows + 1, hidden), jnp.float32)   # row n_rows: the zero row
    c_tab = jnp.zeros((n_rows + 1, hidden), jnp.float32)
    embed = params["embed"]

    def cell(w, h_l, c_l, h_r, c_r):
        x = jnp.where(w >= 0, embed[jnp.maximum(w, 0)], 0.0)   # = node_input
        return binary_lstm_cell(params["W"], params["U"], params["b"], x, h_l, c_l, h_r, c_r)

    start = 0
    for width in widths:                                       # one batched cell step per level
        nd, l, r, w = (packed[i, start:start + width] for i in range(4))
        start += width
        h, c = jax.vmap(cell)(w, h_tab[l], c_tab[l], h_tab[r], c_tab[r])
        h_tab = h_tab.at[nd].set(h, mode="drop")
        c_tab = c_tab.at[nd].set(c, mode="drop")
    return h_tab[root], c_tab[root]


def depth_batched_device(params: dict, packed: Any, root: Any, widths: tuple[int, ...],
                         n_rows: int) -> tuple[jax.Array, jax.Array]:
    """The device part: `len(widths)` = max_height + 1 batched cell steps, one
    compilation per (widths, n_rows, shapes). `packed`, `root` from
    `pack_levels` (NumPy, or already moved with `jax.device_put`); `widths` =
    `levels.widths`; `n_rows` = batch * max_nodes."""
    return _depth_device(params, packed, root, widths=tuple(widths), n_rows=n_rows)


def depth_batched(params: dict, trees: Tree) -> tuple[jax.Array, jax.Array]:
    """(h, c) at each root, [batch, H]: host preprocessing + device steps."""
    levels = depth_levels(trees)
    packed, root = jax.device_put(pack_levels(levels))
    return depth_batched_device(params, packed, root, levels.widths, int(np.asarray(trees.word).size))
