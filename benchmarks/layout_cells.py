"""The cells of ED-Batch's Table 2, written the way a user naturally writes
them: one weight matrix per gate (and per child), one line per gate.

`pcbatch.models` packs the gates by hand (``W @ x`` with ``W`` of shape
``[4H, D]``, then ``jnp.split``); these cells leave that to the block-layout
pass (`pcbatch.memory.layout_program`).  Used by `benchmarks/block_layout.py`
and the layout tests.

Each cell is ``(init(key, hidden), cell(params, *inputs), inputs(key, hidden))``
in `CELLS`; `tree_lstm` is an autobatched binary Tree-LSTM over
`pcbatch.data.Tree`s built from the two Tree-LSTM cells.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import node_input

sigmoid = jax.nn.sigmoid


def _mats(key: jax.Array, names: list[str], rows: int, cols: int) -> dict:
    keys = jax.random.split(key, len(names))
    return {n: jax.random.normal(k, (rows, cols), jnp.float32) / jnp.sqrt(jnp.float32(cols))
            for n, k in zip(names, keys)}


def _biases(key: jax.Array, names: list[str], n: int) -> dict:
    keys = jax.random.split(key, len(names))
    return {n_: 0.1 * jax.random.normal(k, (n,), jnp.float32) for n_, k in zip(names, keys)}


# ------------------------------------------------------------------ LSTM
def lstm_init(key: jax.Array, hidden: int) -> dict:
    k = jax.random.split(key, 3)
    g = ["i", "f", "o", "u"]
    return {**_mats(k[0], [f"W_{x}" for x in g], hidden, hidden), **_mats(k[1], [f"U_{x}" for x in g], hidden, hidden),
            **_biases(k[2], [f"b_{x}" for x in g], hidden)}


def lstm_cell(p: dict, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    i = sigmoid(p["W_i"] @ x + p["U_i"] @ h + p["b_i"])
    f = sigmoid(p["W_f"] @ x + p["U_f"] @ h + p["b_f"])
    o = sigmoid(p["W_o"] @ x + p["U_o"] @ h + p["b_o"])
    u = jnp.tanh(p["W_u"] @ x + p["U_u"] @ h + p["b_u"])
    c = f * c + i * u
    return o * jnp.tanh(c), c


# ------------------------------------------------------------------ GRU
def gru_init(key: jax.Array, hidden: int) -> dict:
    k = jax.random.split(key, 3)
    g = ["r", "z", "n"]
    return {**_mats(k[0], [f"W_{x}" for x in g], hidden, hidden), **_mats(k[1], [f"U_{x}" for x in g], hidden, hidden),
            **_biases(k[2], ["b_r", "b_z", "b_n", "b_hn"], hidden)}


def gru_cell(p: dict, x: jax.Array, h: jax.Array) -> jax.Array:
    r = sigmoid(p["W_r"] @ x + p["U_r"] @ h + p["b_r"])
    z = sigmoid(p["W_z"] @ x + p["U_z"] @ h + p["b_z"])
    n = jnp.tanh(p["W_n"] @ x + p["b_n"] + r * (p["U_n"] @ h + p["b_hn"]))
    return (1 - z) * n + z * h


# ------------------------------------------------------------------ binary Tree-LSTM
def tree_lstm_init(key: jax.Array, hidden: int) -> dict:
    k = jax.random.split(key, 5)
    g = ["i", "fl", "fr", "o", "u"]
    return {**_mats(k[0], [f"W_{x}" for x in ("i", "o", "u")], hidden, hidden),
            **_mats(k[1], [f"UL_{x}" for x in g], hidden, hidden), **_mats(k[2], [f"UR_{x}" for x in g], hidden, hidden),
            **_biases(k[3], [f"b_{x}" for x in g], hidden)}


def tree_lstm_leaf(p: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    i = sigmoid(p["W_i"] @ x + p["b_i"])
    o = sigmoid(p["W_o"] @ x + p["b_o"])
    u = jnp.tanh(p["W_u"] @ x + p["b_u"])
    c = i * u
    return o * jnp.tanh(c), c


def tree_lstm_internal(p: dict, h_l: jax.Array, c_l: jax.Array, h_r: jax.Array, c_r: jax.Array
                       ) -> tuple[jax.Array, jax.Array]:
    i = sigmoid(p["UL_i"] @ h_l + p["UR_i"] @ h_r + p["b_i"])
    f_l = sigmoid(p["UL_fl"] @ h_l + p["UR_fl"] @ h_r + p["b_fl"])
    f_r = sigmoid(p["UL_fr"] @ h_l + p["UR_fr"] @ h_r + p["b_fr"])
    o = sigmoid(p["UL_o"] @ h_l + p["UR_o"] @ h_r + p["b_o"])
    u = jnp.tanh(p["UL_u"] @ h_l + p["UR_u"] @ h_r + p["b_u"])
    c = i * u + f_l * c_l + f_r * c_r
    return o * jnp.tanh(c), c


# ------------------------------------------------------------------ binary Tree-GRU
def tree_gru_init(key: jax.Array, hidden: int) -> dict:
    k = jax.random.split(key, 4)
    g = ["rl", "rr", "z"]
    return {**_mats(k[0], ["W_z", "W_h"], hidden, hidden),
            **_mats(k[1], [f"UL_{x}" for x in g] + ["UL_h"], hidden, hidden),
            **_mats(k[2], [f"UR_{x}" for x in g] + ["UR_h"], hidden, hidden),
            **_biases(k[3], ["b_rl", "b_rr", "b_z", "b_h"], hidden)}


def tree_gru_leaf(p: dict, x: jax.Array) -> jax.Array:
    z = sigmoid(p["W_z"] @ x + p["b_z"])
    cand = jnp.tanh(p["W_h"] @ x + p["b_h"])
    return (1 - z) * cand


def tree_gru_internal(p: dict, h_l: jax.Array, h_r: jax.Array) -> jax.Array:
    r_l = sigmoid(p["UL_rl"] @ h_l + p["UR_rl"] @ h_r + p["b_rl"])
    r_r = sigmoid(p["UL_rr"] @ h_l + p["UR_rr"] @ h_r + p["b_rr"])
    z = sigmoid(p["UL_z"] @ h_l + p["UR_z"] @ h_r + p["b_z"])
    cand = jnp.tanh(p["UL_h"] @ (r_l * h_l) + p["UR_h"] @ (r_r * h_r) + p["b_h"])
    return z * (h_l + h_r) / 2 + (1 - z) * cand


# ------------------------------------------------------------------ MV-RNN
def mv_init(key: jax.Array, hidden: int) -> dict:
    k = jax.random.split(key, 3)
    return {**_mats(k[0], ["W_l", "W_r"], hidden, hidden), **_mats(k[1], ["WM_l", "WM_r"], hidden, hidden),
            **_biases(k[2], ["b"], hidden)}


def mv_cell(p: dict, a: jax.Array, A: jax.Array, b: jax.Array, B: jax.Array) -> tuple[jax.Array, jax.Array]:
    vec = jnp.tanh(p["W_l"] @ (B @ a) + p["W_r"] @ (A @ b) + p["b"])
    mat = p["WM_l"] @ A + p["WM_r"] @ B
    return vec, mat


# ------------------------------------------------------------------ elementwise only
def scalar_gates_init(key: jax.Array, hidden: int) -> dict:
    g = ["i", "f", "o", "u"]
    k = jax.random.split(key, 2)
    return {**_biases(k[0], [f"a_{x}" for x in g], hidden), **_biases(k[1], [f"b_{x}" for x in g], hidden)}


def scalar_gates(p: dict, s: jax.Array, h: jax.Array) -> jax.Array:
    """Gates driven by one scalar per example (a time or position signal):
    independent elementwise ops only, no matmul."""
    i = sigmoid(s * p["a_i"] + p["b_i"])
    f = sigmoid(s * p["a_f"] + p["b_f"])
    o = sigmoid(s * p["a_o"] + p["b_o"])
    u = jnp.tanh(s * p["a_u"] + p["b_u"])
    return o * jnp.tanh(f * h + i * u)


# ------------------------------------------------------------------ table
class Cell(NamedTuple):
    name: str
    init: Callable[[jax.Array, int], dict]
    fn: Callable[..., Any]
    inputs: tuple[str, ...]  # "s": a scalar, "v": an [H] vector, "m": an [H, H] matrix
    step: Callable[..., Any]  # the cell as a loop body (see step_program)


# Each cell as the body of a loop (`n` steps per example), so that its
# inputs are lane registers and the cell is the loop body's block.
def lstm_step(p, x, h, c, n):
    for _ in range(n):
        h, c = lstm_cell(p, x, h, c)
    return h, c


def gru_step(p, x, h, n):
    for _ in range(n):
        h = gru_cell(p, x, h)
    return h


def tree_lstm_internal_step(p, h_l, c_l, h_r, c_r, n):
    for _ in range(n):
        h_l, c_l = tree_lstm_internal(p, h_l, c_l, h_r, c_r)
    return h_l, c_l


def tree_lstm_leaf_step(p, x, n):
    c = x
    for _ in range(n):
        x, c = tree_lstm_leaf(p, x)
    return x, c


def tree_gru_internal_step(p, h_l, h_r, n):
    for _ in range(n):
        h_l = tree_gru_internal(p, h_l, h_r)
    return h_l


def tree_gru_leaf_step(p, x, n):
    for _ in range(n):
        x = tree_gru_leaf(p, x)
    return x


def scalar_gates_step(p, s, h, n):
    for _ in range(n):
        h = scalar_gates(p, s, h)
    return h


def mv_step(p, a, A, b, B, n):
    for _ in range(n):
        a, A = mv_cell(p, a, A, b, B)
    return a, A


CELLS = (
    Cell("LSTMCell", lstm_init, lstm_cell, ("v", "v", "v"), lstm_step),
    Cell("GRUCell", gru_init, gru_cell, ("v", "v"), gru_step),
    Cell("TreeLSTM-Internal", tree_lstm_init, tree_lstm_internal, ("v", "v", "v", "v"), tree_lstm_internal_step),
    Cell("TreeLSTM-Leaf", tree_lstm_init, tree_lstm_leaf, ("v",), tree_lstm_leaf_step),
    Cell("TreeGRU-Internal", tree_gru_init, tree_gru_internal, ("v", "v"), tree_gru_internal_step),
    Cell("TreeGRU-Leaf", tree_gru_init, tree_gru_leaf, ("v",), tree_gru_leaf_step),
    Cell("MVCell", mv_init, mv_cell, ("v", "m", "v", "m"), mv_step),
)
#: Not in Table 2: a block whose only groups are elementwise (for the default rule).
SCALAR_GATES = Cell("ScalarGates", scalar_gates_init, scalar_gates, ("s", "v"), scalar_gates_step)


def cell_inputs(cell: Cell, key: jax.Array, batch: int, hidden: int) -> list[jax.Array]:
    keys = jax.random.split(key, len(cell.inputs))
    shapes = {"s": (batch,), "v": (batch, hidden), "m": (batch, hidden, hidden)}
    return [jax.random.normal(k, shapes[kind], jnp.float32) / (jnp.sqrt(jnp.float32(hidden)) if kind == "m" else 1.0)
            for k, kind in zip(keys, cell.inputs)]


def step_program(cell: Cell, **options: Any) -> pcbatch.Autobatched:
    """The cell as the loop body of an autobatched function
    `f(params, *inputs, n)` (parameters shared, `n` steps per example)."""
    return pcbatch.autobatch(cell.step, in_axes=(None,) + (0,) * (len(cell.inputs) + 1), **options)


def cell_block(prog: Any) -> int:
    """The block of `step_program(...).lowered(...)` that runs the cell (the loop body)."""
    return max(range(prog.num_blocks), key=lambda b: ("body" in prog.blocks[b].label, len(prog.blocks[b].ops)))


# ------------------------------------------------------------------ end to end
def tree_lstm_params(key: jax.Array, vocab: int, hidden: int) -> dict:
    k1, k2 = jax.random.split(key)
    return {"embed": jax.random.normal(k1, (vocab, hidden), jnp.float32) / jnp.sqrt(jnp.float32(hidden)),
            **tree_lstm_init(k2, hidden)}


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=128)
def tree_lstm(params, tree, node):
    """Binary Tree-LSTM (Tai et al.) with one matrix per gate and child:
    (h, c) at `node`; a leaf reads its word's embedding."""
    if tree.children[node, 0] < 0:
        return tree_lstm_leaf(params, node_input(params, tree, node))
    h_l, c_l = tree_lstm(params, tree, tree.children[node, 0])
    h_r, c_r = tree_lstm(params, tree, tree.children[node, 1])
    return tree_lstm_internal(params, h_l, c_l, h_r, c_r)
