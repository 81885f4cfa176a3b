"""Turns one Python statement into the function of a `Prim` op.

Each op becomes a small real Python function compiled from the user's own AST
(with the user's file and line numbers, so tracebacks point at their code). It
runs in the user's module globals, so names resolve exactly as in the
original function, and closure variables are bound at conversion time.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable

import jax.numpy as jnp

from pcbatch.ir.weak import range_counter

# Hidden names under which generated code reaches jax.numpy and a range loop's counter type.
JNP = "_pcbatch_jnp"
RANGE_COUNTER = "_pcbatch_range_counter"


class OpCompiler:
    def __init__(self, fn: Callable, filename: str):
        self.globals = fn.__globals__
        self.closure: dict[str, Any] = dict(inspect.getclosurevars(fn).nonlocals)
        self.filename = filename

    def compile(self, stmt: ast.stmt, ins: tuple[str, ...], outs: tuple[str, ...]) -> Callable[..., tuple]:
        """`def op(*ins): <stmt>; return (*outs,)`."""
        args = ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in ins], kwonlyargs=[],
                             kw_defaults=[], defaults=[])
        ret = ast.Return(ast.Tuple([ast.Name(o, ast.Load()) for o in outs], ast.Load()))
        op = ast.FunctionDef("_pcbatch_op", args, [stmt, ret], [], None, None, type_params=[])
        free = sorted(self.closure) + [JNP, RANGE_COUNTER]
        make_args = ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in free], kwonlyargs=[],
                                  kw_defaults=[], defaults=[])
        make = ast.FunctionDef("_pcbatch_make", make_args, [op, ast.Return(ast.Name("_pcbatch_op", ast.Load()))],
                               [], None, None, type_params=[])
        for node in (make, op, ret, *ast.walk(ret)):
            ast.copy_location(node, stmt)
        module = ast.fix_missing_locations(ast.Module([make], type_ignores=[]))
        namespace: dict[str, Any] = {}
        exec(compile(module, self.filename, "exec"), self.globals, namespace)
        return namespace["_pcbatch_make"](**self.closure, **{JNP: jnp, RANGE_COUNTER: range_counter})

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
    which JAX cannot do; over booleans they equal jnp's logical ops."""

    def _jnp(self, fn: str, *args: ast.expr) -> ast.expr:
        return ast.Call(ast.Attribute(ast.Name(JNP, ast.Load()), fn, ast.Load()), list(args), [])

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        values = [self.visit(v) for v in node.values]
        fn = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
        out = values[0]
        for v in values[1:]:
            out = self._jnp(fn, out, v)
        return ast.copy_location(out, node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        if isinstance(node.op, ast.Not):
            return ast.copy_location(self._jnp("logical_not", self.visit(node.operand)), node)
        return self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> ast.expr:
        node = self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        operands = [node.left, *node.comparators]
        parts = [ast.Compare(operands[i], [op], [operands[i + 1]]) for i, op in enumerate(node.ops)]
        out = parts[0]
        for p in parts[1:]:
            out = self._jnp("logical_and", out, p)
        return ast.copy_location(out, node)

    # Lambdas and comprehensions are user code we leave alone.
    def visit_Lambda(self, node: ast.Lambda) -> ast.expr:
        return node
