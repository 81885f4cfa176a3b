"""Turns one Python statement into the function of a `Prim` op.

Each op becomes a small real Python function compiled from the user's own AST
(with the user's file and line numbers, so tracebacks point at their code). It
runs in a copy of the user's module globals, so names resolve exactly as in
the original function; globals and closure variables are both bound at
conversion time, so every machine built from one conversion (other shapes,
`f.checked`'s, a gradient's) sees the same values.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable

import jax.numpy as jnp

from pcbatch.frontend import python_ops

# Hidden names under which generated code reaches jax.numpy and python_ops.
JNP = "_pcbatch_jnp"
PY = "_pcbatch_py"


class OpCompiler:
    def __init__(self, fn: Callable, filename: str):
        # A copy: a global rebound later must not reach machines built later (`f.checked`, a gradient,
        # new shapes) while the ones built before keep the old value, as closure variables are not.
        self.globals = dict(fn.__globals__)
        self.closure: dict[str, Any] = dict(inspect.getclosurevars(fn).nonlocals)
        self.filename = filename

    def compile(self, stmt: ast.stmt, ins: tuple[str, ...], outs: tuple[str, ...]) -> Callable[..., tuple]:
        """`def op(*ins): <stmt>; return (*outs,)`."""
        args = ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in ins], kwonlyargs=[],
                             kw_defaults=[], defaults=[])
        ret = ast.Return(ast.Tuple([ast.Name(o, ast.Load()) for o in outs], ast.Load()))
        op = ast.FunctionDef("_pcbatch_op", args, [stmt, ret], [], None, None, type_params=[])
        free = sorted(self.closure) + [JNP, PY]
        make_args = ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in free], kwonlyargs=[],
                                  kw_defaults=[], defaults=[])
        make = ast.FunctionDef("_pcbatch_make", make_args, [op, ast.Return(ast.Name("_pcbatch_op", ast.Load()))],
                               [], None, None, type_params=[])
        for node in (make, op, ret, *ast.walk(ret)):
            ast.copy_location(node, stmt)
        module = ast.fix_missing_locations(ast.Module([make], type_ignores=[]))
        namespace: dict[str, Any] = {}
        exec(compile(module, self.filename, "exec"), self.globals, namespace)
        return namespace["_pcbatch_make"](**self.closure, **{JNP: jnp, PY: python_ops})

    def lookup(self, name: str) -> Any:
        """Resolve a free name the way the function body would, or raise KeyError."""
        if name in self.closure:
            return self.closure[name]
        if name in self.globals:
            return self.globals[name]
        builtins = self.globals.get("__builtins__", __builtins__)
        builtins = builtins if isinstance(builtins, dict) else vars(builtins)
        return builtins[name]


class BoolRewriter(ast.NodeTransformer):
    """`and`/`or`/`not` and chained comparisons on traced values call `bool()`,
    which JAX cannot do; over booleans they equal jnp's logical ops. Inside a
    comprehension, whose operands are often Python values (`i` from `range`),
    they call `python_ops` instead, which keeps Python's semantics there.

    `where(node)` is (filename, lineno, line) of a node, for errors."""

    def __init__(self, where: Callable[[ast.AST], tuple[str, int, str]]):
        self.where = where
        self.comprehensions = 0

    def _call(self, module: str, fn: str, *args: ast.expr) -> ast.expr:
        return ast.Call(ast.Attribute(ast.Name(module, ast.Load()), fn, ast.Load()), list(args), [])

    def _jnp(self, fn: str, *args: ast.expr) -> ast.expr:
        return self._call(JNP, fn, *args)

    @staticmethod
    def _lambda(params: list[str], body: ast.expr) -> ast.expr:
        args = ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], vararg=None, kwonlyargs=[],
                             kw_defaults=[], kwarg=None, defaults=[])
        return ast.copy_location(ast.Lambda(args, body), body)

    def _thunk(self, value: ast.expr) -> ast.expr:
        """`lambda: value`, so that python_ops evaluates it only where Python would."""
        return self._lambda([], value)

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        values = [self.visit(v) for v in node.values]
        if self.comprehensions:
            out = self._call(PY, "bool_op", ast.Constant(isinstance(node.op, ast.And)),
                             ast.Constant(self.where(node)), values[0], *map(self._thunk, values[1:]))
            return ast.copy_location(out, node)
        fn = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
        out = values[0]
        for v in values[1:]:
            out = self._jnp(fn, out, v)
        return ast.copy_location(out, node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        if isinstance(node.op, ast.Not):
            operand = self.visit(node.operand)
            out = self._call(PY, "not_", operand)  # Python's `not` on a Python value (`not (x,)`)
            return ast.copy_location(out, node)
        return self.generic_visit(node)

    def _membership(self, left: ast.expr, op: ast.cmpop, right: ast.expr) -> ast.expr | None:
        """`x in (0, 1)` over a literal tuple or list: `x == 0 or x == 1`, as
        Python's `in` compares (on a traced `x` it cannot call `bool()`; a set
        would hash `x`, which Python cannot either). Over anything else (a
        global tuple, `range(a, b)`), `python_ops` decides when the values are seen."""
        if not isinstance(op, (ast.In, ast.NotIn)):
            return None
        if not (isinstance(right, (ast.Tuple, ast.List))
                and right.elts and not any(isinstance(e, ast.Starred) for e in right.elts)):
            if (isinstance(right, ast.Call) and isinstance(right.func, ast.Name) and right.func.id == "range"
                    and 1 <= len(right.args) <= 3 and not right.keywords
                    and not any(isinstance(a, ast.Starred) for a in right.args)):
                out = self._call(PY, "in_range", left, right.func, *right.args)  # the name's value goes along
            else:
                out = self._call(PY, "contains", left, right)
            return self._call(PY, "not_", out) if isinstance(op, ast.NotIn) else out
        value = ast.Name("_pcbatch_member", ast.Load())  # `x` evaluated once, as Python does
        out = None
        for e in right.elts:
            eq = ast.Compare(value, [ast.Eq()], [e])
            out = eq if out is None else self._jnp("logical_or", out, eq)
        if isinstance(op, ast.NotIn):
            out = self._jnp("logical_not", out)
        return ast.Call(self._lambda([value.id], out), [left], [])

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        node = self.generic_visit(node)
        if len(node.ops) == 1:
            member = None if self.comprehensions else self._membership(node.left, node.ops[0], node.comparators[0])
            return node if member is None else ast.copy_location(member, node)
        if self.comprehensions:
            ops = ast.Constant(tuple(type(op).__name__ for op in node.ops))
            return ast.copy_location(self._call(PY, "compare", node.left, ops, *map(self._thunk, node.comparators)),
                                     node)
        operands = [node.left, *node.comparators]
        parts = [self._membership(operands[i], op, operands[i + 1]) or ast.Compare(operands[i], [op], [operands[i + 1]])
                 for i, op in enumerate(node.ops)]
        out = parts[0]
        for p in parts[1:]:
            out = self._jnp("logical_and", out, p)
        return ast.copy_location(out, node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
        node = self.generic_visit(node)
        if not self.comprehensions:
            return node
        out = self._call(PY, "if_exp", ast.Constant(self.where(node)), node.test, self._thunk(node.body),
                         self._thunk(node.orelse))
        return ast.copy_location(out, node)

    def visit_Call(self, node: ast.Call) -> ast.expr:
        """`max(a, b)`/`min(...)`: Python's fold (`if x > m: m = x`) on per-example
        scalars (`1 + max(height(l), height(r))`). The name's value goes along, so
        a `max` the module defines is called as it is."""
        node = self.generic_visit(node)
        if (isinstance(node.func, ast.Name) and node.func.id in ("max", "min") and node.args and not node.keywords
                and not any(isinstance(a, ast.Starred) for a in node.args)):
            out = self._call(PY, "min_max", ast.Constant(self.where(node)), node.func, *node.args)
            return ast.copy_location(out, node)
        return node

    def _comprehension(self, node: ast.expr) -> ast.expr:
        self.comprehensions += 1
        try:
            return self.generic_visit(node)
        finally:
            self.comprehensions -= 1

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    # Lambdas are user code we leave alone.
    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        return node
