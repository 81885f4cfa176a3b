"""A binary TreeGRU (as in Kokkinos & Potamianos 2017), written for ONE tree.

    trees = pcbatch.data.batch(pcbatch.data.random_binary_trees(8))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    h = tree_gru(params, trees, trees.root)                  # [8, 64]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, node_input, split

__all__ = ["gru_cell", "init_params", "tree_gru"]


def init_params(key: jax.Array, vocab: int, hidden: int, embed: int | None = None) -> dict:
    """embed [vocab, D]; W [3H, D], U [3H, 2H], b [3H] (rows r_L, r_R, z: the
    gates); W_h [H, D], U_h [H, 2H], b_h [H] (the candidate)."""
    embed = hidden if embed is None else embed
    k = split(key, 5)
    return {"embed": embedding(k[0], vocab, embed),
            "W": dense(k[1], 3 * hidden, embed), "U": dense(k[2], 3 * hidden, 2 * hidden), "b": bias(3 * hidden),
            "W_h": dense(k[3], hidden, embed), "U_h": dense(k[4], hidden, 2 * hidden), "b_h": bias(hidden)}


def gru_cell(params, x, h_l, h_r):
    """The binary TreeGRU cell. With h = [h_L; h_R]:

        r_L = sigmoid(W_rL x + U_rL h + b_rL)      r_R = sigmoid(W_rR x + U_rR h + b_rR)
        z   = sigmoid(W_z x + U_z h + b_z)
        h~  = tanh(W_h x + U_h [r_L * h_L; r_R * h_R] + b_h)
        h'  = z * (h_L + h_R) / 2 + (1 - z) * h~
    """
    gates = params["W"] @ x + params["U"] @ jnp.concatenate([h_l, h_r]) + params["b"]
    r_l, r_r, z = jnp.split(jax.nn.sigmoid(gates), 3)
    cand = jnp.tanh(params["W_h"] @ x + params["U_h"] @ jnp.concatenate([r_l * h_l, r_r * h_r]) + params["b_h"])
    return z * (h_l + h_r) / 2 + (1 - z) * cand


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def tree_gru(params, tree, node):
    """h at `node` (`gru_cell`): a leaf has x = E[word] and h_L = h_R = 0
    (so h = (1 - z) * h~); an internal node has x = 0 and its children's h."""
    if tree.children[node, 0] < 0:
        zero = jnp.zeros(params["b_h"].shape[0])
        return gru_cell(params, node_input(params, tree, node), zero, zero)
    h_l = tree_gru(params, tree, tree.children[node, 0])
    h_r = tree_gru(params, tree, tree.children[node, 1])
    return gru_cell(params, node_input(params, tree, node), h_l, h_r)
