"""A BiLSTM tagger over ONE chain (sentence), written as two loops.

Chains are `pcbatch.data.Chain` arrays (`words[:length]`, padded with -1).

    forward   (t = 0 .. n-1):   h^f_t, c^f_t = LSTM_f(E[w_t], h^f_{t-1}, c^f_{t-1})
    backward  (t = n-1 .. 0):   h^b_t, c^b_t = LSTM_b(E[w_t], h^b_{t+1}, c^b_{t+1})
    scores_t = W_tag [h^f_t; h^b_t] + b_tag                 (0 at padding, t >= n)

with the LSTM step of `pcbatch.models._common.lstm_cell` and zero initial states.

    chains = pcbatch.data.batch(pcbatch.data.random_chains(8))
    params = init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64, n_tags=10)
    scores = bilstm_tagger(params, chains)                 # [8, max_len, 10]
    tags = scores.argmax(-1)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import bias, dense, embedding, lstm_cell, lstm_params, split

__all__ = ["bilstm_tagger", "init_params"]


def init_params(key: jax.Array, vocab: int, hidden: int, n_tags: int = 10, embed: int | None = None) -> dict:
    """embed [vocab, D]; fwd / bwd LSTMs (W [4H, D], U [4H, H], b [4H]);
    W_tag [n_tags, 2H], b_tag [n_tags]."""
    embed = hidden if embed is None else embed
    k = split(key, 4)
    return {"embed": embedding(k[0], vocab, embed), "fwd": lstm_params(k[1], embed, hidden),
            "bwd": lstm_params(k[2], embed, hidden), "W_tag": dense(k[3], n_tags, 2 * hidden),
            "b_tag": bias(n_tags)}


@pcbatch.autobatch(in_axes=(None, 0))
def bilstm_tagger(params, chain):
    """Tag scores [max_len, n_tags] of one chain (zeros beyond its length)."""
    hf = jnp.zeros((chain.words.shape[0], params["fwd"]["U"].shape[1]))
    hb = jnp.zeros((chain.words.shape[0], params["bwd"]["U"].shape[1]))
    h = jnp.zeros(params["fwd"]["U"].shape[1])
    c = jnp.zeros(params["fwd"]["U"].shape[1])
    for t in range(chain.length):
        h, c = lstm_cell(params["fwd"], params["embed"][chain.words[t]], h, c)
        hf = hf.at[t].set(h)
    h = jnp.zeros(params["bwd"]["U"].shape[1])
    c = jnp.zeros(params["bwd"]["U"].shape[1])
    for t in range(chain.length - 1, -1, -1):
        h, c = lstm_cell(params["bwd"], params["embed"][chain.words[t]], h, c)
        hb = hb.at[t].set(h)
    scores = jnp.concatenate([hf, hb], axis=1) @ params["W_tag"].T + params["b_tag"]
    mask = jnp.arange(chain.words.shape[0]) < chain.length
    return jnp.where(mask[:, None], scores, 0.0)
