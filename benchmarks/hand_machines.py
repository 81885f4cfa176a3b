"""Hand-written `lax.while_loop` program-counter machines: the fair peers of
the machines `@pcbatch.autobatch` generates for `fib` and `collatz`, and for
two heavy blocks (`benchmarks/block_twins.py`): a NUTS leaf (leapfrog
steps in a loop) and the binary Tree-LSTM's recursion (its cell block).

They follow the *same* algorithm and the *same* control-flow graph as the
generated machine (block numbers and edges are copied from
`f.lowered(args)`), so both take exactly the same number of VM steps and the
ratio of their times is pure per-step overhead:

* one `lax.while_loop`; each iteration picks the earliest block with a ready
  lane (`min(pc)`, an unbatched index) and runs it for all lanes with
  `lax.switch`, masking every update to the lanes whose pc is that block;
* fib keeps an explicit per-lane pc, a per-lane pc stack and a per-lane value
  stack (one frame slot, holding the saved `n` across the first call and the
  partial sum across the second), with ONE stack pointer per lane;
* stack writes are scatters with `mode="drop"` (inactive lanes write to the
  out-of-range row `D`), stack reads are gathers.

Two versions of fib:

* `fib_switch` — the straightforward one: the whole state (stacks included) is
  the operand of `lax.switch` and each branch updates what it needs.
* `fib_hoisted` — what the same engineer writes after looking at a profile:
  the `[D, lanes]` stacks never enter `lax.switch`. The stack reads a block may
  need are gathered before the switch, the branch returns the small per-lane
  state plus at most one frame write `(row, value, return pc)`, and that
  scatter runs once after the switch. (XLA's default copy insertion makes
  every `conditional` branch copy every buffer it passes through; keeping the
  big stacks out of the conditional removes those copies. With copy insertion
  by region analysis, pcbatch's CPU option, the copies are gone and
  `fib_switch` is the faster from 2 lanes up: pcbatch's machine carries its
  stacks through the switch there too, `Tuning.carry_stacks`.)

collatz has no stacks, so it has one version. The heavy-block twins
(`leaves_hand`, `tree_lstm_hand`) are written the hoisted way only.

Every machine returns `(result, steps, overflow)`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# --- fib -----------------------------------------------------------------
# The generated CFG (see `fib.lowered(n)`):
#   b0 entry:   branch n <= 1 ? b1 : b2
#   b1 base:    ret = n; return
#   b2 call 1:  push n; n = n - 1; pushjump b0, return to b3
#   b3 call 2:  pop n; push ret (partial sum); n = n - 2; pushjump b0, return to b4
#   b4 add:     pop partial; ret = partial + ret; return
FIB_BLOCKS = 5


def fib_switch(n: jax.Array, depth: int = 64):
    L = n.shape[0]
    lanes = jnp.arange(L)
    HALT, D = FIB_BLOCKS, depth

    def ret_(s, a):
        sp = s["sp"] - a
        return sp, jnp.where(a, s["pcs"][jnp.maximum(sp, 0), lanes], s["pc"])

    def b0(s):
        a = s["pc"] == 0
        return {**s, "pc": jnp.where(a, jnp.where(s["n"] <= 1, 1, 2), s["pc"])}

    def b1(s):
        a = s["pc"] == 1
        sp, pc = ret_(s, a)
        return {**s, "ret": jnp.where(a, s["n"], s["ret"]), "sp": sp, "pc": pc}

    def b2(s):
        a, sp = s["pc"] == 2, s["sp"]
        ovf = a & (sp >= D)
        ok = a & ~ovf
        row = jnp.where(ok, sp, D)
        return {**s, "vals": s["vals"].at[row, lanes].set(s["n"], mode="drop"),
                "pcs": s["pcs"].at[row, lanes].set(3, mode="drop"),
                "sp": sp + ok, "n": jnp.where(ok, s["n"] - 1, s["n"]),
                "pc": jnp.where(ok, 0, jnp.where(ovf, HALT, s["pc"])), "ovf": s["ovf"] | ovf}

    def b3(s):  # the frame popped by the return is row sp: reuse it for the second call
        a, sp = s["pc"] == 3, s["sp"]
        saved_n = s["vals"][jnp.minimum(sp, D - 1), lanes]
        row = jnp.where(a, sp, D)
        return {**s, "vals": s["vals"].at[row, lanes].set(s["ret"], mode="drop"),
                "pcs": s["pcs"].at[row, lanes].set(4, mode="drop"),
                "sp": sp + a, "n": jnp.where(a, saved_n - 2, s["n"]), "pc": jnp.where(a, 0, s["pc"])}

    def b4(s):
        a = s["pc"] == 4
        partial = s["vals"][jnp.minimum(s["sp"], D - 1), lanes]
        sp, pc = ret_(s, a)
        return {**s, "ret": jnp.where(a, partial + s["ret"], s["ret"]), "sp": sp, "pc": pc}

    def body(s):
        s = lax.switch(jnp.min(s["pc"]), [b0, b1, b2, b3, b4], s)
        return {**s, "steps": s["steps"] + 1}

    s = {"pc": jnp.zeros(L, jnp.int32), "n": n.astype(jnp.int32), "ret": jnp.zeros(L, jnp.int32),
         "sp": jnp.ones(L, jnp.int32),  # row 0 of the pc stack holds the halt address
         "vals": jnp.zeros((D, L), jnp.int32), "pcs": jnp.full((D, L), HALT, jnp.int32),
         "ovf": jnp.zeros(L, bool), "steps": jnp.zeros((), jnp.int32)}
    s = lax.while_loop(lambda s: jnp.any(s["pc"] < HALT), body, s)
    return s["ret"], s["steps"], s["ovf"]


def fib_hoisted(n: jax.Array, depth: int = 64):
    L = n.shape[0]
    lanes = jnp.arange(L)
    HALT, D = FIB_BLOCKS, depth
    no_row = jnp.full((L,), D, jnp.int32)

    # Each branch: (pc, n, ret, sp, ovf, top_val, ret_pc) -> (pc, n, ret, sp, ovf, row, val, wpc)
    def b0(pc, n, ret, sp, ovf, top, rpc):
        a = pc == 0
        return jnp.where(a, jnp.where(n <= 1, 1, 2), pc), n, ret, sp, ovf, no_row, n, pc

    def b1(pc, n, ret, sp, ovf, top, rpc):
        a = pc == 1
        return jnp.where(a, rpc, pc), n, jnp.where(a, n, ret), sp - a, ovf, no_row, n, pc

    def b2(pc, n, ret, sp, ovf, top, rpc):
        a = pc == 2
        bad = a & (sp >= D)
        ok = a & ~bad
        return (jnp.where(ok, 0, jnp.where(bad, HALT, pc)), jnp.where(ok, n - 1, n), ret, sp + ok,
                ovf | bad, jnp.where(ok, sp, D), n, jnp.full((L,), 3, jnp.int32))

    def b3(pc, n, ret, sp, ovf, top, rpc):
        a = pc == 3
        return (jnp.where(a, 0, pc), jnp.where(a, top - 2, n), ret, sp + a, ovf,
                jnp.where(a, sp, D), ret, jnp.full((L,), 4, jnp.int32))

    def b4(pc, n, ret, sp, ovf, top, rpc):
        a = pc == 4
        return jnp.where(a, rpc, pc), n, jnp.where(a, top + ret, ret), sp - a, ovf, no_row, n, pc

    def body(s):
        pc, n, ret, sp, ovf, vals, pcs, steps = s
        top = vals[jnp.clip(sp, 0, D - 1), lanes]       # the frame a return just popped (b3, b4)
        rpc = pcs[jnp.clip(sp - 1, 0, D - 1), lanes]    # the return address (b1, b4)
        pc, n, ret, sp, ovf, row, val, wpc = lax.switch(
            jnp.min(pc), [b0, b1, b2, b3, b4], pc, n, ret, sp, ovf, top, rpc)
        vals = vals.at[row, lanes].set(val, mode="drop")
        pcs = pcs.at[row, lanes].set(wpc, mode="drop")
        return pc, n, ret, sp, ovf, vals, pcs, steps + 1

    s = (jnp.zeros(L, jnp.int32), n.astype(jnp.int32), jnp.zeros(L, jnp.int32), jnp.ones(L, jnp.int32),
         jnp.zeros(L, bool), jnp.zeros((D, L), jnp.int32), jnp.full((D, L), HALT, jnp.int32),
         jnp.zeros((), jnp.int32))
    s = lax.while_loop(lambda s: jnp.any(s[0] < HALT), body, s)
    return s[2], s[7], s[4]


# --- collatz ---------------------------------------------------------------
# The generated CFG (see `collatz.lowered(n)`):
#   b0 entry: steps = 0; jump b1          b4 then: n = n // 2; jump b6
#   b1 while: branch n != 1 ? b2 : b3     b5 else: n = 3 * n + 1; jump b6
#   b2 body:  branch n % 2 == 0 ? b4 : b5 b6 join: steps = steps + 1; jump b1
#   b3 exit:  return steps
COLLATZ_BLOCKS = 7


def collatz_switch(n: jax.Array):
    L = n.shape[0]
    HALT = COLLATZ_BLOCKS

    def at(b, pc):
        return pc == b

    def b0(pc, n, k):
        a = at(0, pc)
        return jnp.where(a, 1, pc), n, jnp.where(a, 0, k)

    def b1(pc, n, k):
        return jnp.where(at(1, pc), jnp.where(n != 1, 2, 3), pc), n, k

    def b2(pc, n, k):
        return jnp.where(at(2, pc), jnp.where(n % 2 == 0, 4, 5), pc), n, k

    def b3(pc, n, k):
        return jnp.where(at(3, pc), HALT, pc), n, k

    def b4(pc, n, k):
        a = at(4, pc)
        return jnp.where(a, 6, pc), jnp.where(a, n // 2, n), k

    def b5(pc, n, k):
        a = at(5, pc)
        return jnp.where(a, 6, pc), jnp.where(a, 3 * n + 1, n), k

    def b6(pc, n, k):
        a = at(6, pc)
        return jnp.where(a, 1, pc), n, jnp.where(a, k + 1, k)

    def body(s):
        pc, n, k, steps = s
        pc, n, k = lax.switch(jnp.min(pc), [b0, b1, b2, b3, b4, b5, b6], pc, n, k)
        return pc, n, k, steps + 1

    s = (jnp.zeros(L, jnp.int32), n.astype(jnp.int32), jnp.zeros(L, jnp.int32), jnp.zeros((), jnp.int32))
    s = lax.while_loop(lambda s: jnp.any(s[0] < HALT), body, s)
    return s[2], s[3], jnp.zeros(L, bool)


def sel(a, new, old):
    """`new` in the lanes where `a` (one flag per lane), else `old` (any trailing shape)."""
    return jnp.where(a.reshape(a.shape + (1,) * (new.ndim - 1)), new, old)


# --- NUTS leaves (benchmarks/block_twins.py) ---------------------------------
# The generated CFG (see `block_twins.leaves.lowered(...)`):
#   b0 entry:  logp, g = grad(x); h0 = logp - |p|^2/2; w = -inf; k = 0; jump b1
#   b1 header: branch k < n ? b2 : b3
#   b2 body:   one leapfrog step, w = logaddexp(w, -energy error); k += 1; jump b1
#   b3 exit:   return (x, w)
LEAVES_BLOCKS = 4


def leaves_hand(logdensity, x, p, eps, n):
    L = x.shape[0]
    HALT = LEAVES_BLOCKS
    grad = jax.vmap(jax.value_and_grad(logdensity))

    def at(b, pc):
        return pc == b

    def b0(pc, x, p, g, h0, w, k):
        a = at(0, pc)
        logp, g0 = grad(x)
        return (jnp.where(a, 1, pc), x, p, sel(a, g0, g), jnp.where(a, logp - 0.5 * jnp.sum(p * p, -1), h0),
                jnp.where(a, -jnp.inf, w), jnp.where(a, 0, k))

    def b1(pc, x, p, g, h0, w, k):
        return jnp.where(at(1, pc), jnp.where(k < n, 2, 3), pc), x, p, g, h0, w, k

    def b2(pc, x, p, g, h0, w, k):
        a = at(2, pc)
        e = eps[:, None]
        p1 = p + 0.5 * e * g
        x1 = x + e * p1
        logp, g1 = grad(x1)
        p1 = p1 + 0.5 * e * g1
        w1 = jnp.logaddexp(w, logp - 0.5 * jnp.sum(p1 * p1, -1) - h0)
        return jnp.where(a, 1, pc), sel(a, x1, x), sel(a, p1, p), sel(a, g1, g), h0, jnp.where(a, w1, w), k + a

    def b3(pc, x, p, g, h0, w, k):
        return jnp.where(at(3, pc), HALT, pc), x, p, g, h0, w, k

    def body(s):
        *state, steps = s
        state = lax.switch(jnp.min(state[0]), [b0, b1, b2, b3], *state)
        return (*state, steps + 1)

    z = jnp.zeros(L, x.dtype)
    s = (jnp.zeros(L, jnp.int32), x, p, jnp.zeros_like(x), z, z, jnp.zeros(L, jnp.int32), jnp.zeros((), jnp.int32))
    s = lax.while_loop(lambda s: jnp.any(s[0] < HALT), body, s)
    return (s[1], s[5]), s[7], jnp.zeros(L, bool)


# --- binary Tree-LSTM, fork=False (benchmarks/block_twins.py) ---------------
# The generated CFG (see `models.nary.nary_tree_lstm.with_options(fork=False).lowered(...)`):
#   b0 entry:  left, right = children[node]; branch left < 0 ? b1 : b2
#   b1 leaf:   h_l, c_l, h_r, c_r = 0; jump b5
#   b2 call 1: push node, right; node = left; pushjump b0, return to b3
#   b3 call 2: pop right; h_l, c_l = ret; push h_l, c_l; node = right; pushjump b0, return to b4
#   b4 join:   pop h_l, c_l, node; h_r, c_r = ret; jump b5
#   b5 cell:   ret = cell(x[node], h_l, c_l, h_r, c_r); return
# One frame per call (node, right, h_l, c_l, return pc) with one stack pointer
# per lane; frames are read before `lax.switch` and written after it.
TREE_LSTM_BLOCKS = 6


def tree_lstm_hand(cell, node_input, params, tree, root, depth: int = 64):
    L = root.shape[0]
    H = params["U"].shape[1] // 2
    lanes = jnp.arange(L)
    HALT, D = TREE_LSTM_BLOCKS, depth
    no_row = jnp.full((L,), D, jnp.int32)
    one_input = lambda t, node: node_input(params, t, node)
    inputs = jax.vmap(one_input)
    cells = jax.vmap(lambda x, hl, cl, hr, cr: cell(params["W"], params["U"], params["b"], x, hl, cl, hr, cr))

    # state: pc, node, left, right, h_l, c_l, h_r, c_r, ret_h, ret_c, sp
    # top: the frame a return just popped (node, right, h, c); rpc: the return address
    # each branch also returns one frame write: (row, node, right, h, c, pc)
    def keep(st):
        return (no_row, st[1], st[3], st[4], st[5], st[0])

    def b0(st, top, rpc):
        pc, node, left, right = st[:4]
        a = pc == 0
        kids = tree.children[lanes, node]
        left, right = jnp.where(a, kids[:, 0], left), jnp.where(a, kids[:, 1], right)
        return (jnp.where(a, jnp.where(left < 0, 1, 2), pc), node, left, right, *st[4:]), keep(st)

    def b1(st, top, rpc):
        a = st[0] == 1
        z = jnp.zeros((L, H), st[4].dtype)
        hl, cl, hr, cr = (sel(a, z, v) for v in st[4:8])
        return (jnp.where(a, 5, st[0]), *st[1:4], hl, cl, hr, cr, *st[8:]), keep(st)

    def b2(st, top, rpc):
        pc, node, left, right, *rest = st
        sp = st[10]
        a = pc == 2
        write = (jnp.where(a, sp, D), node, right, st[4], st[5], jnp.full((L,), 3, jnp.int32))
        return (jnp.where(a, 0, pc), jnp.where(a, left, node), left, right, *rest[:-1], sp + a), write

    def b3(st, top, rpc):
        pc, node, left, right, hl, cl, hr, cr, rh, rc, sp = st
        a = pc == 3
        t_node, t_right = top[0], top[1]
        hl, cl = sel(a, rh, hl), sel(a, rc, cl)
        write = (jnp.where(a, sp, D), t_node, t_right, hl, cl, jnp.full((L,), 4, jnp.int32))
        return (jnp.where(a, 0, pc), jnp.where(a, t_right, node), left, jnp.where(a, t_right, right),
                hl, cl, hr, cr, rh, rc, sp + a), write

    def b4(st, top, rpc):
        pc, node, left, right, hl, cl, hr, cr, rh, rc, sp = st
        a = pc == 4
        return (jnp.where(a, 5, pc), jnp.where(a, top[0], node), left, right, sel(a, top[2], hl),
                sel(a, top[3], cl), sel(a, rh, hr), sel(a, rc, cr), rh, rc, sp), keep(st)

    def b5(st, top, rpc):
        pc, node, left, right, hl, cl, hr, cr, rh, rc, sp = st
        a = pc == 5
        h, c = cells(inputs(tree, node), hl, cl, hr, cr)
        return (jnp.where(a, rpc, pc), node, left, right, hl, cl, hr, cr, sel(a, h, rh), sel(a, c, rc),
                sp - a), keep(st)

    def body(s):
        st, frames, steps = s
        sp = st[10]
        row = jnp.clip(sp, 0, D - 1)
        top = tuple(f[row, lanes] for f in frames[:4])
        rpc = frames[4][jnp.clip(sp - 1, 0, D - 1), lanes]
        st, (wrow, *vals) = lax.switch(jnp.min(st[0]), [b0, b1, b2, b3, b4, b5], st, top, rpc)
        frames = tuple(f.at[wrow, lanes].set(v, mode="drop") for f, v in zip(frames, vals))
        return st, frames, steps + 1

    i32 = lambda: jnp.zeros(L, jnp.int32)
    zh = jnp.zeros((L, H), params["W"].dtype)
    st = (i32(), root.astype(jnp.int32), i32(), i32(), zh, zh, zh, zh, zh, zh, jnp.ones(L, jnp.int32))
    frames = (jnp.zeros((D, L), jnp.int32), jnp.zeros((D, L), jnp.int32), jnp.zeros((D, L, H), zh.dtype),
              jnp.zeros((D, L, H), zh.dtype), jnp.full((D, L), HALT, jnp.int32))
    st, frames, steps = lax.while_loop(lambda s: jnp.any(s[0][0] < HALT), body, (st, frames, jnp.zeros((), jnp.int32)))
    return (st[8], st[9]), steps, jnp.zeros(L, bool)
