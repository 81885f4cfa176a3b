"""The backward pass: a reverse loop over the tape."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pcbatch.ir.core import INVARIANT, Join
from pcbatch.runtime.dtypes import index_dtype, nbytes
from pcbatch.runtime.block import block_dataflow
from pcbatch.runtime.lanes import cast_to, gather_rows, take
from pcbatch.runtime.grad.floats import add_ct, convert_ct, floats, is_float, row_mask, with_floats, zeros_of
from pcbatch.runtime.grad.plan import BlockGrad, Plan

tree_util = jax.tree_util
tree_map = tree_util.tree_map


class Backward:
    """The reverse loop over a tape (see the module docstring)."""

    def __init__(self, plan: Plan, inert: frozenset[str] = frozenset()):
        self.plan = plan
        self.inert = inert  # constants that carry no derivative (`inert.py`): plain values in the VJPs

    def block_vjp(self, g: BlockGrad, consts: dict[str, Any], inv: dict[str, Any], w: int):
        """Block `g` on `w` taped rows: cotangents in, cotangents out (padded
        to the widest bucket; out-of-range ids mark padding)."""
        p, prog = self.plan, self.plan.prog
        types, block = prog.var_types, prog.blocks[g.index]
        M, B, N = p.lanes, p.examples, p.widths[-1]
        float_writes = [s for s in g.writes if s in p.float_stacks]

        def code(regs_in, tops, joined, inv_rows, cs):
            def load(v: str) -> tuple[Any, bool]:
                if v in cs:
                    return cs[v], False
                if v in inv_rows:
                    return inv_rows[v], True
                return regs_in[v], True

            def join(op: Join) -> dict[str, Any]:
                return {v: cast_to(joined[k], types[v], None) for k, v in enumerate(op.outs)}

            env, pushed = block_dataflow(block, p.layout.stack_of, load, tops.__getitem__, join, types, w)
            return [x for v in g.reg_out for x in floats(env[v])] + [x for s in float_writes for x in floats(pushed[s])]

        def pad(x: jax.Array, fill: Any = 0) -> jax.Array:
            n = N * x.shape[0] // w
            if x.shape[0] == n:
                return x
            return jnp.concatenate([x, jnp.full((n - x.shape[0],) + x.shape[1:], fill, x.dtype)])

        def run(rows_all: dict[str, Any], cot: dict[str, Any], acc: dict[str, Any], start: jax.Array, n: jax.Array):
            rows = tree_map(lambda a: lax.dynamic_slice_in_dim(a, start, w), rows_all)
            valid = jnp.arange(w) < n
            # Padding rows repeat row 0 (a real one): no junk reaches the VJP.
            rows = tree_map(lambda a: jnp.where(row_mask(valid, a), a, a[:1]), rows)
            lane = jnp.where(valid, rows["lane"], M)
            example = rows["example"]
            cts = {v: [take(c, lane) for c in cot[v]]
                   for v in set(g.reg_in) | set(g.reg_out) | {a for _, _, a in g.spawn} if v in cot}
            extra_inv: dict[str, list] = {}
            extra_const: dict[str, list] = {}
            kids = jnp.where(valid[:, None], rows["kids"], M) if "kids" in rows else None
            spawned = jnp.where(valid[:, None], rows["spawned"], M) if "spawned" in rows else None
            for k, prm, a in g.spawn:  # 1. children's parameters -> the parent's arguments
                c = convert_ct([take(x, spawned[:, k]) for x in cot[prm]], types[prm], types[a])
                if a in cot:
                    cts[a] = add_ct(cts[a], c)
                elif prog.var_class[a] == INVARIANT:
                    extra_inv[a] = add_ct(extra_inv.get(a) or zeros_of(types[a], (w,)), c)
                elif a not in self.inert:
                    extra_const[a] = add_ct(extra_const.get(a) or zeros_of(types[a], ()),
                                          [None if x is None else jnp.sum(x, axis=0) for x in c])
            # 2. what the block wrote
            own = {s: jnp.where(valid, p.event_base[s, g.index] + start + jnp.arange(w, dtype=index_dtype()),
                                p.events[s]) for s in float_writes}
            ct_out = [x for v in g.reg_out for x in cts[v]] + [
                take(x, own[s]) for s in float_writes for x in acc[s]]
            # 3. its VJP on the rows
            inv_rows = {v: gather_rows(inv[v], example) for v in g.inv_in}
            cs = {v: consts[v] for v in g.const_in if v not in self.inert}
            fixed = {v: consts[v] for v in g.const_in if v in self.inert}
            primal = {"reg": rows["reg"], "top": rows["top"], "joined": rows.get("joined", ()),
                      "inv": inv_rows, "const": cs}
            diff = {k: {v: floats(x) for v, x in d.items()} if isinstance(d, dict) else [floats(x) for x in d]
                    for k, d in primal.items()}

            def f(dd):
                full = {k: {v: with_floats(primal[k][v], dd[k][v]) for v in primal[k]}
                        if isinstance(primal[k], dict) else tuple(with_floats(x, y) for x, y in zip(primal[k], dd[k]))
                        for k in primal}
                return code(full["reg"], full["top"], full["joined"], full["inv"], {**full["const"], **fixed})

            outs, pull = jax.vjp(f, diff)
            (ct_in,) = pull([c.astype(o.dtype) for c, o in zip(ct_out, outs)])
            out: dict[str, Any] = {"lane": pad(lane, M)}
            regs = {}
            for v, c in cts.items():
                # An assigned register's old value was not read afterwards: its cotangent restarts at 0.
                new = [jnp.zeros_like(x) for x in c] if v in g.reg_out else c
                if v in ct_in["reg"]:
                    new = add_ct(new, ct_in["reg"][v])
                regs[v] = [pad(x) for x in new]
            out["regs"] = regs
            out["acc"] = {s: (pad(jnp.where(valid, rows["wid"][s], p.events[s]), p.events[s]),
                              [pad(x) for x in ct_in["top"][s]]) for s in g.reads if s in p.float_stacks}
            if g.join is not None:
                out["join"] = [(pad(kids[:, k], M), [pad(x) for x in ct_in["joined"][k]])
                               for k in range(len(g.join.rets))]
            if g.spawn:
                out["spawned"] = pad(spawned.reshape(-1), M)
            ex = jnp.where(valid, example, B)
            out["ex"] = pad(ex, B)
            out["inv"] = {v: (pad(ex, B), [pad(x) for x in add_ct(ct_in["inv"].get(v) or zeros_of(types[v], (w,)),
                                                                  extra_inv.get(v) or [None] * len(floats(types[v])))])
                          for v in g.inv_in if is_float(types[v])}
            out["const"] = {v: add_ct(ct_in["const"].get(v) or zeros_of(types[v], ()),
                                    extra_const.get(v) or [None] * len(floats(types[v])))
                            for v in g.const_in if is_float(types[v]) and v not in self.inert}
            return out

        return run

    def block_out(self, g: BlockGrad, consts: dict[str, Any], inv: dict[str, Any]):
        """Block `g`'s VJP on its rows (at the narrowest width bucket that holds
        them): the updates `apply` makes, computed without touching the
        state, and the constants' sums with its share added (small: inside
        the branch XLA adds the VJP's scatter into them in place, where
        returned apart each step would carry a dense zero table)."""
        p = self.plan
        runs = [self.block_vjp(g, consts, inv, w) for w in p.widths]
        widths = jnp.asarray(p.widths)

        def go(cot: dict[str, Any], acc: dict[str, Any], sums: dict[str, Any], rows_all: dict[str, Any],
               start: jax.Array, n: jax.Array) -> tuple[dict[str, Any], dict[str, Any]]:
            which = jnp.minimum(jnp.searchsorted(widths, n), len(runs) - 1)
            out = lax.switch(which, runs, rows_all, cot, acc, start, n) if len(runs) > 1 else \
                runs[0](rows_all, cot, acc, start, n)
            out = dict(out)
            added = out.pop("const")
            return out, {**sums, **{v: [a + x.astype(a.dtype) for a, x in zip(sums[v], xs)] for v, xs in added.items()}}

        return go

    def apply(self, g: BlockGrad, state: dict[str, Any], out: dict[str, Any], on: jax.Array) -> dict[str, Any]:
        """Block `g`'s updates to the cotangent state, where `on` (else each
        index points past its array and every scatter drops its rows): the
        scatters run outside any conditional, in place, as XLA's copy insertion
        without region analysis (a caller's own `jax.jit`) leaves them."""
        p = self.plan
        M, B = p.lanes, p.examples
        cot, acc = dict(state["cot"]), dict(state["acc"])
        lane = jnp.where(on, out["lane"], M)
        for v, rows in out["regs"].items():
            cot[v] = [c.at[lane].set(r, mode="drop") for c, r in zip(cot[v], rows)]
        if "spawned" in out:  # the spawned lanes held someone else's values before
            spawned = jnp.where(on, out["spawned"], M)
            cot = {v: [c.at[spawned].set(0, mode="drop") for c in cs] for v, cs in cot.items()}
        for (kid, vals), r in zip(out.get("join", []), g.join.rets if g.join is not None else ()):
            if r in cot:
                kid = jnp.where(on, kid, M)
                cot[r] = [c.at[kid].add(x.astype(c.dtype), mode="drop") for c, x in zip(cot[r], vals)]
        for s, (ids, vals) in out["acc"].items():
            ids = jnp.where(on, ids, p.events[s])
            acc[s] = [a.at[ids].add(x.astype(a.dtype), mode="drop") for a, x in zip(acc[s], vals)]
        ct_inv = dict(state["inv"])
        ex = jnp.where(on, out["ex"], B)
        for v, (ex_v, vals) in out["inv"].items():
            ex_v = jnp.where(on, ex_v, B)
            ct_inv[v] = [a.at[ex_v].add(x.astype(a.dtype), mode="drop") for a, x in zip(ct_inv[v], vals)]
        used_inv = {**state["used_inv"], **{v: state["used_inv"][v].at[ex].set(True, mode="drop")
                                             for v in g.inv_in}}
        used_const = {**state["used_const"], **{v: state["used_const"][v] | on for v in g.const_in}}
        return {**state, "cot": cot, "acc": acc, "inv": ct_inv, "used_inv": used_inv, "used_const": used_const}

    def updates_inside(self) -> bool:
        """Whether, with a `lax.cond` per block, each block's updates run inside
        its conditional. There XLA copies the cotangent state a branch passes
        through (without region analysis: a caller's own `jax.jit`); outside,
        every step runs every block's scatters, masked. Inside when the
        cotangent registers are no larger than those masked scatters' rows
        (interleaved: the Child-Sum Tree-LSTM's training step, 256 lanes, H 32,
        60.5 against 65.7 ms inside; the forked binary one, 4096 lanes, H 128,
        55.8 against 47.0)."""
        p = self.plan
        types = p.prog.var_types
        row = lambda v: nbytes(floats(types[v]))  # noqa: E731 - one lane's cotangent of v
        registers = sum(p.lanes * row(v) for v in p.float_regs)
        masked = 0
        for g in p.blocks:
            touched = set(g.reg_in) | set(g.reg_out) | {a for _, _, a in g.spawn}
            touched |= set(g.join.rets) if g.join is not None else set()
            masked += p.widths[-1] * sum(row(v) for v in touched if v in p.float_regs)
        return registers <= masked

    def run(self, consts: dict[str, Any], inv: dict[str, Any], tape: dict[str, Any], ct_result: list):
        """Cotangents `(constants, invariants [examples], entry registers
        [examples])` from the result's (float leaves, `[examples, ...]`), and
        which invariants per example / constants the recorded blocks read."""
        p, prog = self.plan, self.plan.prog
        types, M, B = prog.var_types, p.lanes, p.examples
        cot = {v: zeros_of(types[v], (M,)) for v in p.float_regs}
        cot[prog.result] = [c.at[:B].set(x.astype(c.dtype)) for c, x in zip(cot[prog.result], ct_result)]
        state = {
            "t": jnp.minimum(tape.t, p.log_size),
            "cursor": tape.cursor,
            "cot": cot,
            "acc": {s: zeros_of(p.layout.stacks[s], (p.events[s],)) for s in p.float_stacks},
            "inv": {v: zeros_of(types[v], (B,)) for v in inv if is_float(types[v])},
            "const": {v: zeros_of(types[v], ()) for v in consts if is_float(types[v])},
            # which examples' invariants (and which constants) a recorded block read: see `masked_prelude`
            "used_inv": {v: jnp.zeros((B,), bool) for v in inv},
            "used_const": {v: jnp.zeros((), bool) for v in consts},
        }
        outs = [self.block_out(g, consts, inv) for g in p.blocks]
        rows_all = tape.rows
        at = jnp.zeros((), tape.cursor.dtype)
        shapes = [jax.eval_shape(go, state["cot"], state["acc"], state["const"], rows_all[g.index], at, at)[0]
                  for g, go in zip(p.blocks, outs)]

        def nothing(k: int) -> dict[str, Any]:
            """Block k's updates where it did not run (`apply` drops them)."""
            return tree_map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[k])

        def by_conds(state, block, start, n):
            for k, (g, go) in enumerate(zip(p.blocks, outs)):
                # Each cond reads the state the previous block's updates left (no-ops but one): were they
                # all to read the step's first state, XLA would copy it for the reads after a scatter.
                out, sums = lax.cond(block == g.index, go, lambda c, a, sums, r, s0, m, k=k: (nothing(k), sums),
                                     state["cot"], state["acc"], state["const"], rows_all[g.index], start, n)
                state = self.apply(g, {**state, "const": sums}, out, block == g.index)
            return state

        def by_conds_inside(state, block, start, n):  # small cotangent registers: see `updates_inside`
            for g, go in zip(p.blocks, outs):
                def taken(state, r, s0, m, g=g, go=go):
                    out, sums = go(state["cot"], state["acc"], state["const"], r, s0, m)
                    return self.apply(g, {**state, "const": sums}, out, jnp.ones((), bool))
                state = lax.cond(block == g.index, taken, lambda s, r, s0, m: s, state, rows_all[g.index], start, n)
            return state

        # One switch: every block's updates come out, all but one dropped by `apply`. The constants'
        # shares come out too, added after it: passed through, the sums a branch left alone were copied.
        shares = sorted({v for g in p.blocks for v in g.const_in if v in state["const"]} - self.inert)
        share_shapes = {v: [(x.shape, x.dtype) for x in state["const"][v]] for v in shares}

        def only(k: int):
            def branch(c, a, r, s0, m):
                # The zeros are made here: an operand all branches shared would be copied in each.
                zero = {v: [jnp.zeros(sh, dt) for sh, dt in share_shapes[v]] for v in shares}
                got, added = outs[k](c, a, zero, r[k], s0, m)
                return [got if j == k else nothing(j) for j in range(len(outs))], added
            return branch

        def by_switch(state, block, start, n):
            got, added = lax.switch(dense[block], [only(k) for k in range(len(outs))], state["cot"], state["acc"],
                                    [rows_all[g.index] for g in p.blocks], start, n)
            state = {**state, "const": {**state["const"], **{v: [a + x for a, x in zip(state["const"][v], added[v])]
                                                            for v in shares}}}
            for g, out in zip(p.blocks, got):
                state = self.apply(g, state, out, block == g.index)
            return state

        dense = jnp.asarray(p.dense)
        if p.switched and len(outs) > 1:  # the log holds recorded blocks only
            step = by_switch
        else:
            step = by_conds_inside if self.updates_inside() else by_conds

        def body(state):
            t = state["t"] - 1
            block, n = tape.log_block[t], tape.log_count[t]
            start = state["cursor"][block] - n
            return step({**state, "t": t, "cursor": state["cursor"].at[block].set(start)}, block, start, n)

        final = lax.while_loop(lambda s: s["t"] > 0, body, state)
        regs = {v: [c[:B] for c in final["cot"][v]] for v in final["cot"]}
        return final["const"], final["inv"], regs, (final["used_inv"], final["used_const"])
