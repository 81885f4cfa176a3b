"""Lattice LSTM over a character/word lattice (Zhang & Yang 2018), written for
ONE lattice, in two forms.

Lattices are `pcbatch.data.Lattice` arrays: nodes are the positions 0..n
between characters, character t is the edge t -> t+1 and each lexicon word over
characters b..e-1 is an edge b -> e (`word_start[e, k] = b`, `word_id[e, k]`).
The state at position e is computed from position e-1 (the character edge) and
from the start positions b of the words ending at e:

    x_e          = Ec[char_{e-1}]
    [i, f, o, u] = W_c x_e + U_c h_{e-1} + b_c;   i, f, o = sigmoid(.);  u = tanh(.)
    word cell of b -> e, with x^w = Ew[word]:
      [i^w, f^w, u^w] = W_w x^w + U_w h_b + b_w
      c^w_b           = sigmoid(f^w) * c_b + sigmoid(i^w) * tanh(u^w)
      g_b             = exp(sigmoid(W_l x_e + U_l c^w_b + b_l))       (its gate into e)
    if some word ends at e (normalised gates, as in Zhang & Yang):
      c_e = (exp(i) * u + sum_b g_b * c^w_b) / (exp(i) + sum_b g_b)
    else (a plain LSTM step):
      c_e = f * c_{e-1} + i * u
    h_e = o * tanh(c_e),     h_0 = c_0 = 0.

(The word cell reads the state at the word's start position b, i.e. before its
first character: the positions-as-nodes form of the lattice.)

`lattice_lstm(params, lat)` -> (h_n, c_n) walks the DAG in topological order
(positions 1..n) with a `for` loop, keeping every position's state in an array:
linear time, the form to use. `lattice_lstm_at(params, lat, e)` -> (h_e, c_e)
is the same recurrence written as plain recursion over positions; without
memoization it recomputes shared prefixes (exponential in the number of words),
so it is meant for small lattices (<= ~10 characters) and as a recursion
workload for fork-join; it agrees with `lattice_lstm`.

    lats = pcbatch.data.batch(pcbatch.data.random_lattices(8))
    params = init_params(jax.random.PRNGKey(0), char_vocab=100, word_vocab=1000, hidden=64)
    h, c = lattice_lstm(params, lats)                              # [8, 64]
    h, c = lattice_lstm_at(params, lats, lats.length)              # same (small lattices)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

import pcbatch
from pcbatch.models._common import MAX_DEPTH, bias, dense, embedding, split

__all__ = ["char_step", "init_params", "lattice_lstm", "lattice_lstm_at", "word_cell"]


def init_params(key: jax.Array, char_vocab: int, word_vocab: int, hidden: int, embed: int | None = None) -> dict:
    """char_embed [char_vocab, D], word_embed [word_vocab, D]; char LSTM W_c [4H, D],
    U_c [4H, H], b_c [4H]; word cell W_w [3H, D], U_w [3H, H], b_w [3H];
    word gate W_l [H, D], U_l [H, H], b_l [H]."""
    embed = hidden if embed is None else embed
    k = split(key, 8)
    return {"char_embed": embedding(k[0], char_vocab, embed), "word_embed": embedding(k[1], word_vocab, embed),
            "W_c": dense(k[2], 4 * hidden, embed), "U_c": dense(k[3], 4 * hidden, hidden),
            "b_c": bias(4 * hidden).at[hidden:2 * hidden].set(1.0),
            "W_w": dense(k[4], 3 * hidden, embed), "U_w": dense(k[5], 3 * hidden, hidden), "b_w": bias(3 * hidden),
            "W_l": dense(k[6], hidden, embed), "U_l": dense(k[7], hidden, hidden), "b_l": bias(hidden)}


def char_step(params, x, h_prev):
    """Gates of the character cell: i, f, o (sigmoid) and u (tanh)."""
    i, f, o, u = jnp.split(params["W_c"] @ x + params["U_c"] @ h_prev + params["b_c"], 4)
    return jax.nn.sigmoid(i), jax.nn.sigmoid(f), jax.nn.sigmoid(o), jnp.tanh(u)


def word_cell(params, x, word, h_b, c_b):
    """The cell of a word starting at state (h_b, c_b), and its gate into the
    end position (whose character input is x): returns (c^w, g)."""
    i_w, f_w, u_w = jnp.split(params["W_w"] @ params["word_embed"][word] + params["U_w"] @ h_b + params["b_w"], 3)
    c_w = jax.nn.sigmoid(f_w) * c_b + jax.nn.sigmoid(i_w) * jnp.tanh(u_w)
    g = jnp.exp(jax.nn.sigmoid(params["W_l"] @ x + params["U_l"] @ c_w + params["b_l"]))
    return c_w, g


@pcbatch.autobatch(in_axes=(None, 0))
def lattice_lstm(params, lat):
    """(h_n, c_n) at the last position, by a loop over positions in
    topological order; states of earlier positions live in [max_len + 1, H]
    arrays, so each word cell reads its start position's state directly."""
    hs = jnp.zeros((lat.word_start.shape[0], params["U_c"].shape[1]))
    cs = jnp.zeros((lat.word_start.shape[0], params["U_c"].shape[1]))
    for e in range(1, lat.length + 1):
        x = params["char_embed"][lat.chars[e - 1]]
        i, f, o, u = char_step(params, x, hs[e - 1])
        num = jnp.exp(i) * u
        den = jnp.exp(i)
        words = 0
        for k in range(lat.word_start.shape[1]):
            b = lat.word_start[e, k]
            if b >= 0:
                c_w, g = word_cell(params, x, lat.word_id[e, k], hs[b], cs[b])
                num = num + g * c_w
                den = den + g
                words += 1
        if words > 0:
            c = num / den
        else:
            c = f * cs[e - 1] + i * u
        h = o * jnp.tanh(c)
        hs = hs.at[e].set(h)
        cs = cs.at[e].set(c)
    return hs[lat.length], cs[lat.length]


@pcbatch.autobatch(in_axes=(None, 0, 0), max_stack_depth=MAX_DEPTH)
def lattice_lstm_at(params, lat, e):
    """(h_e, c_e) at position `e`, recursively: the state at e-1 and at the
    start of every word ending at e, then the same cell as `lattice_lstm`.
    Recomputes shared states: keep lattices small."""
    if e == 0:
        zero = jnp.zeros(params["U_c"].shape[1])
        return zero, zero
    h_prev, c_prev = lattice_lstm_at(params, lat, e - 1)
    x = params["char_embed"][lat.chars[e - 1]]
    i, f, o, u = char_step(params, x, h_prev)
    num = jnp.exp(i) * u
    den = jnp.exp(i)
    words = 0
    for k in range(lat.word_start.shape[1]):
        b = lat.word_start[e, k]
        if b >= 0:
            h_b, c_b = lattice_lstm_at(params, lat, b)
            c_w, g = word_cell(params, x, lat.word_id[e, k], h_b, c_b)
            num = num + g * c_w
            den = den + g
            words += 1
    if words > 0:
        c = num / den
    else:
        c = f * c_prev + i * u
    return o * jnp.tanh(c), c
