"""A plain-JAX depth-batched peer of `pcbatch.models.child_sum` on trees of any arity.

TensorFlow Fold / DyNet style batching by height, as `treelstm_baselines.depth_batched`
does for the binary Tree-LSTM: on the host (`levels`, NumPy) every node gets its height
(leaf 0; node ids are post-order, children first) and each height's `(tree, node)` pairs
become flat rows `tree * max_nodes + node` of one `[batch * max_nodes + 1, H]` state table
(the last row is zeros: a missing child); on the device (`run`, one `jax.jit` per level
profile) one batched cell step per level gathers the level's children rows
(`[width, max_children]`), sums them and scatters the new rows. Levels are padded with
`treelstm_baselines.level_width`. Same cell, weights and input as the model: the root's
`(h, c)` of every tree.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.treelstm_baselines import level_width
from pcbatch.data import Tree


class Levels(NamedTuple):
    """Per level (height 0 first): node rows, children rows `[width, C]`, words; the roots' rows."""

    node: tuple[np.ndarray, ...]
    kids: tuple[np.ndarray, ...]
    word: tuple[np.ndarray, ...]
    root: np.ndarray

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(len(n) for n in self.node)


def levels(trees: Tree, min_width: int = 8) -> Levels:
    """The host preprocessing for a batched `Tree` (children packed left, -1 = none)."""
    children = np.asarray(trees.children)
    word = np.asarray(trees.word)
    batch, max_nodes, arity = children.shape
    n_rows = batch * max_nodes
    zero_row, drop_row = n_rows, n_rows + 1
    rows = np.arange(batch)
    height = np.zeros((batch, max_nodes), np.int64)
    for j in range(max_nodes):   # children first: their heights are known
        kids = children[:, j]
        kid_h = np.where(kids >= 0, height[rows[:, None], np.maximum(kids, 0)], -1)
        height[:, j] = kid_h.max(axis=1) + 1
    height[np.arange(max_nodes)[None, :] >= np.asarray(trees.num_nodes)[:, None]] = -1
    height = height.ravel()
    base = np.repeat(np.arange(batch, dtype=np.int64) * max_nodes, max_nodes)
    flat_kids = children.reshape(n_rows, arity).astype(np.int64)
    kid_rows = np.where(flat_kids >= 0, base[:, None] + flat_kids, zero_row)
    order = np.argsort(height, kind="stable")
    order = order[height[order] >= 0]
    starts = np.concatenate([[0], np.cumsum(np.bincount(height[order]))])
    node, kids, words = [], [], []
    for k in range(len(starts) - 1):
        ids = order[starts[k]:starts[k + 1]]
        pad = level_width(len(ids), min_width) - len(ids)
        node.append(np.concatenate([ids, np.full(pad, drop_row)]).astype(np.int32))
        kids.append(np.concatenate([kid_rows[ids], np.full((pad, arity), zero_row)]).astype(np.int32))
        words.append(np.concatenate([word.ravel()[ids], np.full(pad, -1)]).astype(np.int32))
    root = (np.arange(batch) * max_nodes + np.asarray(trees.root)).astype(np.int32)
    return Levels(tuple(node), tuple(kids), tuple(words), root)


@functools.partial(jax.jit, static_argnames=("n_rows",))
def run(params: dict, lv: Levels, n_rows: int) -> tuple[jax.Array, jax.Array]:
    """The device part: one batched Child-Sum cell step per level."""
    hidden = params["U_f"].shape[0]
    h_tab = jnp.zeros((n_rows + 1, hidden), jnp.float32)
    c_tab = jnp.zeros((n_rows + 1, hidden), jnp.float32)
    for nd, ch, w in zip(lv.node, lv.kids, lv.word):
        x = jnp.where((w >= 0)[:, None], params["embed"][jnp.maximum(w, 0)], 0.0)
        h_k, c_k = h_tab[ch], c_tab[ch]                     # [width, C, H]; a missing child is the zero row
        wf_x = x @ params["W_f"].T + params["b_f"]
        f = jax.nn.sigmoid(wf_x[:, None, :] + h_k @ params["U_f"].T)
        iou = x @ params["W_iou"].T + h_k.sum(1) @ params["U_iou"].T + params["b_iou"]
        i, o, u = jnp.split(iou, 3, axis=-1)
        c = jax.nn.sigmoid(i) * jnp.tanh(u) + (f * c_k).sum(1)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        h_tab = h_tab.at[nd].set(h, mode="drop")
        c_tab = c_tab.at[nd].set(c, mode="drop")
    return h_tab[lv.root], c_tab[lv.root]


def depth_batched(params: dict, trees: Tree) -> tuple[jax.Array, jax.Array]:
    """Host levels, then the device part: what a user of the peer runs per batch."""
    lv = levels(trees)
    batch, max_nodes = np.shape(trees.word)
    return run(params, jax.device_put(lv), batch * max_nodes)
