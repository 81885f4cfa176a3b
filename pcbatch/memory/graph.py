"""A run of a block's `Prim` ops as one dataflow graph of JAX primitives.

The block-layout pass (`pcbatch.memory.static`) needs to see inside the
user's straight-line code: which `dot_general`s share an operand, which
elementwise ops have equal shapes.  `trace_run` traces each Prim of a run
(per example, on its inferred types) to a jaxpr and stitches the jaxprs
together by variable, inlining `jit` calls (`jax.nn.sigmoid` is one), so that
the run becomes one flat list of primitive applications (`Node`s) over
numbered values.  Identical pure applications are merged (XLA would merge
them too; the values are the same).

`bind` evaluates one node exactly as `jax.core.eval_jaxpr` does, so code
generated from the graph computes what the Prims computed, primitive for
primitive.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from pcbatch.ir.core import CONSTANT, Prim

__all__ = ["BlockGraph", "Lit", "Node", "bind", "trace_run"]

tree_util = jax.tree_util

# Call primitives whose body is plain code: inlined so their insides can be batched.
_INLINE = frozenset({"pjit", "jit", "closed_call", "core_call"})


@dataclass(frozen=True, eq=False)
class Lit:
    """A literal (or a constant closed over by the user's code)."""

    value: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.value))

    @property
    def traced(self) -> bool:
        """A constant closed over from a caller's `jax.jit` (the user's data, say): its
        value is known only inside that trace, so it is never read as a NumPy array."""
        return isinstance(self.value, jax.core.Tracer)

    def key(self) -> tuple:
        """Equal literals have equal keys."""
        if self.traced:
            return ("lit", id(self))
        a = np.asarray(self.value)
        return ("lit", a.dtype.str, a.shape, a.tobytes()) if a.size <= 64 else ("lit", id(self))


Atom = int | Lit  # a value id, or a literal


@dataclass(frozen=True, eq=False)
class Node:
    """`outs = eqn.primitive(*ins)`; `op` is the index of the Prim (within the
    run) it was traced from."""

    index: int
    eqn: Any  # jax JaxprEqn: primitive, params, context
    ins: tuple[Atom, ...]
    outs: tuple[int, ...]
    op: int

    @property
    def primitive(self) -> str:
        return self.eqn.primitive.name

    @property
    def params(self) -> Mapping[str, Any]:
        return self.eqn.params


class Unsupported(Exception):
    """The run contains something the layout pass leaves alone (side effects)."""


@dataclass
class BlockGraph:
    """A run of Prims as one graph.

    `inputs`: variables the run reads before writing them, each with its leaf
    value ids (`input_leaves`) and tree structure; `outputs`: variables it
    writes, each with the atoms of its final value's leaves.  `avals` and
    `names` describe every value; `producer[v]` is the node computing v.
    `const` holds the values computed from machine constants (shared inputs)
    and literals only: they are the same for every lane, so a packed copy can
    be built once before the loop.
    """

    ops: tuple[Prim, ...]
    inputs: tuple[str, ...]
    input_leaves: dict[str, tuple[int, ...]]
    input_trees: dict[str, Any]
    outputs: tuple[str, ...]
    output_atoms: dict[str, tuple[Atom, ...]]
    output_trees: dict[str, Any]
    nodes: list[Node]
    avals: dict[int, Any]
    names: dict[int, str]
    producer: dict[int, int]
    const: set[int]

    def shape(self, a: Atom) -> tuple[int, ...]:
        return a.shape if isinstance(a, Lit) else tuple(self.avals[a].shape)

    def dtype(self, a: Atom) -> Any:
        if isinstance(a, Lit):
            return a.value.dtype if a.traced else np.asarray(a.value).dtype
        return self.avals[a].dtype

    def is_const(self, a: Atom) -> bool:
        return isinstance(a, Lit) or a in self.const

    def name(self, a: Atom) -> str:
        if not isinstance(a, Lit):
            return self.names[a]
        if a.traced:
            return f"<constant {a.value.dtype.name}[{','.join(map(str, a.shape))}] of the caller's jit>"
        x = np.asarray(a.value)
        return repr(x.tolist()) if x.size == 1 else f"<constant {x.dtype.name}[{','.join(map(str, x.shape))}]>"

    def evaluate(self, env: dict[int, Any], nodes: Sequence[Node]) -> None:
        """Run `nodes` (in order) on the values in `env`, adding their results."""
        for node in nodes:
            for v, x in zip(node.outs, bind(node, [read(env, a) for a in node.ins])):
                env[v] = x


def read(env: Mapping[int, Any], a: Atom) -> Any:
    return a.value if isinstance(a, Lit) else env[a]


def bind(node: Node, args: Sequence[Any]) -> list[Any]:
    """Apply a node's primitive (with its parameters) to `args`, like
    `jax.core.eval_jaxpr` does for one equation."""
    eqn = node.eqn
    params = eqn.primitive.get_bind_params(eqn.params)
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*args, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _local(var: str) -> str:
    return var.rpartition(".")[2]


def _key_name(k: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _leaf_names(var: str, t: Any) -> list[str]:
    """`p.W_i` for the leaf `p["W_i"]` of variable `p`; just `x` for an array."""
    paths = tree_util.tree_flatten_with_path(t)[0]
    base = _local(var)
    return [".".join([base] + [_key_name(k) for k in path]) for path, _ in paths]


def params_key(params: Mapping[str, Any]) -> Any:
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:
        return None


def trace_run(ops: Sequence[Prim], var_types: Mapping[str, Any], var_class: Mapping[str, str]) -> BlockGraph:
    """The graph of a run of Prims (per example, on the variables' types).

    Raises `Unsupported` if some primitive has side effects (the pass then
    leaves the run alone).
    """
    g = BlockGraph(tuple(ops), (), {}, {}, (), {}, {}, [], {}, {}, {}, set())
    env: dict[str, tuple[Atom, ...]] = {}
    inputs: list[str] = []
    cse: dict[tuple, tuple[int, ...]] = {}
    counter = [0]

    def new_value(aval: Any, name: str) -> int:
        v = counter[0]
        counter[0] += 1
        g.avals[v], g.names[v] = aval, name
        return v

    for k, op in enumerate(ops):
        for var in op.ins:
            if var not in env:  # read before written in the run: an input
                t = var_types[var]
                leaves, treedef = tree_util.tree_flatten(t)
                ids = tuple(new_value(jax.ShapeDtypeStruct(l.shape, l.dtype), n)
                            for l, n in zip(leaves, _leaf_names(var, t)))
                env[var] = ids
                inputs.append(var)
                g.input_leaves[var], g.input_trees[var] = ids, treedef
                if var_class.get(var) == CONSTANT:
                    g.const.update(ids)
        in_types = [var_types[v] for v in op.ins]
        out_types = [var_types[v] for v in op.outs]
        in_defs = [tree_util.tree_structure(t) for t in in_types]
        sizes = [d.num_leaves for d in in_defs]

        def flat_fn(*leaves, op=op, in_defs=in_defs, sizes=sizes, out_types=out_types):
            vals, i = [], 0
            for d, n in zip(in_defs, sizes):
                vals.append(tree_util.tree_unflatten(d, leaves[i:i + n]))
                i += n
            outs = op.fn(*vals)
            # As run_prim does: each output cast to its variable's (joined) dtype.
            outs = [tree_util.tree_map(lambda x, s: jnp.asarray(x, s.dtype), o, t) for o, t in zip(outs, out_types)]
            return tree_util.tree_leaves(outs)

        closed = jax.make_jaxpr(flat_fn)(*tree_util.tree_leaves(in_types))
        args = [a for v in op.ins for a in env[v]]
        base = _local(op.outs[0]) if op.outs else "_"
        first = counter[0]
        outs = _inline(g, closed.jaxpr, closed.consts, args, k, new_value, cse)
        for n, v in enumerate(range(first, counter[0])):  # intermediates: `i:0, i:1, ...` in statement `i = ...`
            g.names[v] = f"{base}:{n}"
        i = 0
        for var, t in zip(op.outs, out_types):
            n = tree_util.tree_structure(t).num_leaves
            atoms = tuple(outs[i:i + n])
            i += n
            for a, name in zip(atoms, _leaf_names(var, t)):
                if isinstance(a, int) and g.producer.get(a) is not None and g.nodes[g.producer[a]].op == k:
                    g.names[a] = name  # a value this op computed takes the variable's name
            env[var] = atoms
            g.output_trees[var] = tree_util.tree_structure(t)
    g.inputs = tuple(inputs)
    g.outputs = tuple(dict.fromkeys(v for op in ops for v in op.outs))
    g.output_atoms = {v: env[v] for v in g.outputs}
    return g


def _inline(g: BlockGraph, jaxpr: Any, consts: Sequence[Any], args: Sequence[Atom], op: int,
            new_value: Callable[[Any, str], int], cse: dict) -> list[Atom]:
    local: dict[Any, Atom] = {}
    for var, c in zip(jaxpr.constvars, consts):
        local[var] = Lit(c)
    for var, a in zip(jaxpr.invars, args):
        local[var] = a

    def atom(x: Any) -> Atom:
        return Lit(x.val) if isinstance(x, jcore.Literal) else local[x]

    for eqn in jaxpr.eqns:
        ins = tuple(atom(x) for x in eqn.invars)
        if eqn.primitive.name in _INLINE and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]
            inner_jaxpr, inner_consts = (inner.jaxpr, inner.consts) if hasattr(inner, "consts") else (inner, ())
            outs = _inline(g, inner_jaxpr, inner_consts, ins, op, new_value, cse)
            for var, a in zip(eqn.outvars, outs):
                local[var] = a
            continue
        if eqn.effects:
            raise Unsupported(f"`{eqn.primitive.name}` has side effects")
        pk = params_key(eqn.params)
        key = None if pk is None else (eqn.primitive, pk, tuple(a.key() if isinstance(a, Lit) else a for a in ins))
        if key is not None and key in cse:
            outs = cse[key]
        else:
            index = len(g.nodes)
            outs = tuple(new_value(v.aval, "") for v in eqn.outvars)
            g.nodes.append(Node(index, eqn, ins, outs, op))
            for v in outs:
                g.producer[v] = index
            if all(g.is_const(a) for a in ins):
                g.const.update(outs)
            if key is not None:
                cse[key] = outs
        for var, a in zip(eqn.outvars, outs):
            local[var] = a
    return [atom(x) for x in jaxpr.outvars]
