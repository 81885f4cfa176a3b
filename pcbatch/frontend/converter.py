"""Python `ast` of one function -> its block IR (Figure 2).

One `visit_*` method per supported statement; expressions are flattened so
that calls to autobatched functions and control-flow expressions (`x if c else
y`, short-circuit `and`/`or`) become their own ops and blocks, and everything
else stays a `Prim` of the user's own source.
"""
from __future__ import annotations

import ast
import copy
import inspect
import linecache
import textwrap
import warnings
from dataclasses import astuple, dataclass, field
from typing import Any, Callable, Optional

from pcbatch.errors import Loc, MaybeUnboundWarning, UnsupportedSyntaxError
from pcbatch.frontend.compile_ops import PY, BoolRewriter, OpCompiler
from pcbatch.ir.cfg import simplify
from pcbatch.ir.core import Block, Branch, Call, Fail, Function, Jump, Op, Prim, Return
from pcbatch.ir.dataflow import maybe_unbound

# resolve(obj) -> (IR name, signature) when obj is an autobatched function.
Resolver = Callable[[Any], Optional[tuple[str, inspect.Signature]]]

_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

_HINTS: dict[type, tuple[str, str]] = {
    ast.Try: ("`try` is not supported", "JAX values do not raise; check conditions explicitly and branch with `if`."),
    ast.With: ("`with` is not supported", "move the context manager outside the autobatched function."),
    ast.AsyncWith: ("`async with` is not supported", "use plain synchronous code."),
    ast.AsyncFor: ("`async for` is not supported", "use `for i in range(...)`."),
    ast.Global: ("`global` is not supported", "pass the value in as an argument and return the new value."),
    ast.Nonlocal: ("`nonlocal` is not supported", "pass the value in as an argument and return the new value."),
    ast.Delete: ("`del` is not supported", "just stop using the variable."),
    ast.Import: ("`import` inside an autobatched function is not supported", "import at module level."),
    ast.ImportFrom: ("`import` inside an autobatched function is not supported", "import at module level."),
    ast.ClassDef: ("a class definition inside an autobatched function is not supported", "define it at module level."),
    ast.FunctionDef: ("a nested `def` is not supported",
                      "define the helper at module level (decorate it with @pcbatch.autobatch if it "
                      "has data-dependent control flow or recursion)."),
    ast.AsyncFunctionDef: ("a nested `async def` is not supported", "define it at module level."),
    ast.Match: ("`match` is not supported", "use `if`/`elif`/`else`."),
}


@dataclass
class _Block:
    label: str
    ops: list[Op] = field(default_factory=list)
    term: Any = None
    loc: Loc | None = None


def _assigned_names(stmts: list[ast.stmt]) -> set[str]:
    """Names the function body binds (Python's rule for what is local)."""
    out: set[str] = set()

    def targets(t: ast.expr) -> None:
        for n in ast.walk(t):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                out.add(n.id)

    for node in stmts:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign):
                for t in sub.targets:
                    targets(t)
            elif isinstance(sub, (ast.AugAssign, ast.AnnAssign, ast.For)):
                targets(sub.target)
    return out


def _free_loads(node: ast.AST) -> list[str]:
    """Names read by `node`, in order, not counting names bound inside lambdas or comprehensions."""
    seen: list[str] = []

    def visit(n: ast.AST, bound: frozenset[str]) -> None:
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id not in bound and n.id not in seen:
                seen.append(n.id)
            return
        if isinstance(n, ast.Lambda):  # its defaults are read where it is defined
            a = n.args
            for d in a.defaults + [d for d in a.kw_defaults if d is not None]:
                visit(d, bound)
            visit(n.body, bound | _binders(n))
            return
        if isinstance(n, _SCOPES):
            # Python evaluates the first iterable in the enclosing scope (`[x for x in x]`),
            # each later part with the targets bound so far.
            inner = bound
            for gen in n.generators:
                visit(gen.iter, inner)
                inner = inner | {t.id for t in ast.walk(gen.target) if isinstance(t, ast.Name)}
                for cond in gen.ifs:
                    visit(cond, inner)
            for part in (n.key, n.value) if isinstance(n, ast.DictComp) else (n.elt,):
                visit(part, inner)
            return
        for child in ast.iter_child_nodes(n):
            visit(child, bound)

    visit(node, frozenset())
    return seen


def _store_names(target: ast.expr) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _is_boolish(node: ast.expr) -> bool:
    """Expressions whose value is a boolean, so `and`/`or` equal logical ops."""
    if isinstance(node, ast.Compare):
        return True
    if isinstance(node, ast.Constant):
        return isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.BoolOp):
        return all(_is_boolish(v) for v in node.values)
    return False


def _source(fn: Callable) -> tuple[ast.FunctionDef, str, list[str]]:
    try:
        lines, start = inspect.getsourcelines(fn)
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    except (OSError, TypeError) as e:
        raise UnsupportedSyntaxError(
            f"cannot read the source of {fn!r}", Loc(fn.__code__.co_filename, fn.__code__.co_firstlineno),
            "pcbatch needs the function's source: define it in a file (or a notebook cell), not via exec.",
        ) from e
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, start - 1)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise UnsupportedSyntaxError(
            "pcbatch.autobatch needs a function defined with `def`", Loc(filename, start, lines[0]),
            "write `def f(...):` instead of a lambda.")
    all_lines = linecache.getlines(filename) or []
    if len(all_lines) < fdef.end_lineno:  # e.g. source from a notebook cell
        all_lines = [""] * (start - 1) + lines
    return fdef, filename, all_lines


def _lambda_params(a: ast.arguments) -> list[ast.arg]:
    return a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]


def _binders(node: ast.AST) -> set[str]:
    """The names a lambda or comprehension binds in its own scope."""
    if isinstance(node, ast.Lambda):
        return {p.arg for p in _lambda_params(node.args)}
    return {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}


def _visit_scope(node: ast.AST, outside: Callable[[Any], Any], inside: Callable[[Any], Any]) -> ast.AST:
    """Visits a lambda's or comprehension's parts: with `outside` what Python evaluates
    in the enclosing scope (a lambda's defaults, a comprehension's first iterable),
    with `inside` the rest."""
    if isinstance(node, ast.Lambda):
        a = node.args
        a.defaults = [outside(d) for d in a.defaults]
        a.kw_defaults = [d if d is None else outside(d) for d in a.kw_defaults]
        node.body = inside(node.body)
        return node
    for k, g in enumerate(node.generators):
        g.target = inside(g.target)
        g.iter = (inside if k else outside)(g.iter)
        g.ifs = [inside(c) for c in g.ifs]
    for part in ("key", "value") if isinstance(node, ast.DictComp) else ("elt",):
        setattr(node, part, inside(getattr(node, part)))
    return node


class _Renamer(ast.NodeTransformer):
    """Renames variables (`rename`: old -> new), except inside a nested scope that binds the old name."""

    def __init__(self, rename: dict[str, str]):
        self.rename = rename

    def binders(self, node: ast.AST) -> ast.AST:
        """Renames the variables `node` (a lambda or comprehension) binds, in its own scope."""
        if isinstance(node, ast.Lambda):
            for p in _lambda_params(node.args):
                p.arg = self.rename.get(p.arg, p.arg)
        return _visit_scope(node, lambda n: n, self.visit)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.rename.get(node.id, node.id)
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, _SCOPES):
            return super().generic_visit(node)
        inner = _Renamer({k: v for k, v in self.rename.items() if k not in _binders(node)})
        return _visit_scope(node, self.visit, inner.visit)


class _LambdaInliner(ast.NodeTransformer):
    """Replaces each read of `name` by a copy of `fn`: only as a call's function or argument.

    The copy must read `fn`'s free variables (`k` in `lambda v: v * k`) in the
    function's scope, as Python's closure does: an inner scope around the call
    that binds one of them (`tree_map(lambda k: scale(k), t)`, `[add(i) for i in
    range(3)]`) has that variable renamed first, else the copy would read it."""

    def __init__(self, name: str, fn: ast.Lambda, conv: "Converter"):
        self.name, self.fn, self.conv = name, fn, conv
        self.free = set(_free_loads(fn))

    def _is_it(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == self.name and isinstance(node.ctx, ast.Load)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        swap = lambda n: ast.copy_location(copy.deepcopy(self.fn), n) if self._is_it(n) else self.visit(n)  # noqa: E731
        node.func = swap(node.func)
        node.args = [swap(a) for a in node.args]
        node.keywords = [ast.copy_location(ast.keyword(k.arg, swap(k.value)), k) for k in node.keywords]
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if self._is_it(node):
            raise self.conv.unsupported(node, f"`{self.name}` holds a lambda: it can be called or passed to a "
                                              "call, not used as a value", "call it, e.g. `y = f(x)`.")
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        if not isinstance(node, _SCOPES):
            return super().generic_visit(node)
        bound = _binders(node)
        if self.name in bound:  # its own variable of that name
            return _visit_scope(node, self.visit, lambda n: n)
        clash = bound & self.free
        if clash:
            _Renamer({v: self.conv.fresh_name(v) for v in sorted(clash)}).binders(node)
        return _visit_scope(node, self.visit, self.visit)


class Converter:
    """Builds one `Function` from a Python function."""

    def __init__(self, fn: Callable, name: str, resolve: Resolver, constants: dict[str, Any] | None = None):
        self.fdef, self.filename, self.lines = _source(fn)
        self.name = name
        self.resolve = resolve
        self.compiler = OpCompiler(fn, self.filename)
        self.compiler.closure.update(constants or {})
        self.params = tuple(p for p in self._params() if p not in (constants or {}))
        self.locals = set(self.params) | _assigned_names(self.fdef.body)
        self.temp_prefix = "_t"
        while any(v.startswith(self.temp_prefix) for v in self.locals):
            self.temp_prefix = "_" + self.temp_prefix
        self.ntemps = 0
        self.names = {n.id for n in ast.walk(self.fdef) if isinstance(n, ast.Name)} | {
            n.arg for n in ast.walk(self.fdef) if isinstance(n, ast.arg)}
        self._inline_named_lambdas()
        self.blocks: list[_Block] = []
        self.cur: int | None = None
        self.loops: list[tuple[int, int]] = []  # (continue target, break target)
        self.bool_rewriter = BoolRewriter(lambda n: astuple(self.loc(n)))

    # --- helpers ---------------------------------------------------------

    def loc(self, node: ast.AST) -> Loc:
        lineno = getattr(node, "lineno", self.fdef.lineno)
        line = self.lines[lineno - 1] if 0 < lineno <= len(self.lines) else ""
        return Loc(self.filename, lineno, line.rstrip("\n"))

    def unsupported(self, node: ast.AST, message: str, hint: str = "") -> UnsupportedSyntaxError:
        if "Supported Python" not in hint:
            hint = f"{hint} See README.md, 'Supported Python'.".strip()
        return UnsupportedSyntaxError(message, self.loc(node), hint)

    def temp(self) -> str:
        self.ntemps += 1
        name = f"{self.temp_prefix}{self.ntemps}"
        self.locals.add(name)
        return name

    def fresh_name(self, name: str) -> str:
        """A name for a renamed lambda parameter or comprehension variable that the function does not use."""
        k = 1
        while f"{name}_{k}" in self.names:
            k += 1
        self.names.add(f"{name}_{k}")
        return f"{name}_{k}"

    def new_block(self, label: str, loc: Loc | None = None) -> int:
        self.blocks.append(_Block(label, loc=loc))
        return len(self.blocks) - 1

    def here(self, node: ast.AST) -> _Block:
        """The block being filled; code after a return/break starts an unreachable one."""
        if self.cur is None:
            self.cur = self.new_block("dead", self.loc(node))
        return self.blocks[self.cur]

    def terminate(self, term: Any) -> None:
        if self.cur is not None:
            self.blocks[self.cur].term = term
        self.cur = None

    def emit(self, node: ast.AST, op: Op) -> None:
        block = self.here(node)
        if block.loc is None:
            block.loc = self.loc(node)
        block.ops.append(op)

    def emit_stmt(self, stmt: ast.stmt, outs: tuple[str, ...], text: str) -> None:
        """A statement with no autobatched calls left in it becomes one Prim."""
        stmt = self.bool_rewriter.visit(stmt)
        ins = tuple(n for n in _free_loads(stmt) if n in self.locals)
        fn = self.compiler.compile(stmt, ins, outs)
        self.emit(stmt, Prim(outs, ins, fn, text, self.loc(stmt)))

    def assign(self, target: str, value: ast.expr, node: ast.AST) -> None:
        stmt = ast.copy_location(ast.Assign([ast.Name(target, ast.Store())], value), node)
        self.emit_stmt(stmt, (target,), ast.unparse(value))

    def snapshot(self, expr: ast.expr) -> str:
        """`expr`'s value now, in a variable that later assignments do not change."""
        name = self.atom(expr)
        if name.startswith(self.temp_prefix):
            return name
        t = self.temp()
        self.assign(t, ast.Name(name, ast.Load()), expr)
        return t

    def atom(self, expr: ast.expr) -> str:
        """Evaluate `expr` into a variable and return its name."""
        flat = self.flatten(expr)
        if isinstance(flat, ast.Name) and flat.id in self.locals:
            return flat.id
        t = self.temp()
        self.assign(t, flat, expr)
        return t

    # --- expressions -----------------------------------------------------

    def resolve_callee(self, func: ast.expr) -> Optional[tuple[str, inspect.Signature]]:
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name) or func.id in self.locals:
            return None
        try:
            obj = self.compiler.lookup(func.id)
            for attr in reversed(parts):
                obj = getattr(obj, attr)
        except (KeyError, AttributeError):
            return None
        return self.resolve(obj)

    def flatten(self, node: ast.expr) -> ast.expr:
        """Hoist autobatched calls and control-flow expressions out of `node`."""
        if isinstance(node, ast.Call):
            callee = self.resolve_callee(node.func)
            if callee is not None:
                return ast.copy_location(ast.Name(self.call(node, *callee), ast.Load()), node)
        if isinstance(node, ast.IfExp):
            return ast.copy_location(ast.Name(self.if_expr(node), ast.Load()), node)
        if isinstance(node, ast.BoolOp) and not (
            _is_boolish(node) and not any(self.has_batched_call(v) for v in node.values[1:])
        ):
            return ast.copy_location(ast.Name(self.short_circuit(node), ast.Load()), node)
        if isinstance(node, ast.Compare) and any(self.has_batched_call(c) for c in node.comparators[1:]):
            return ast.copy_location(ast.Name(self.chained_compare(node), ast.Load()), node)
        if isinstance(node, ast.NamedExpr):
            raise self.unsupported(node, "the walrus operator `:=` is not supported",
                                   "assign on a separate line.")
        if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            raise self.unsupported(node, "generators and `await` are not supported",
                                   "return the values instead of yielding them.")
        if isinstance(node, _SCOPES):
            if self.has_batched_call(node):
                raise self.unsupported(node, "a call to an autobatched function inside a lambda or "
                                             "comprehension is not supported",
                                       "write the loop as `for i in range(n):` in the function body.")
            if isinstance(node, ast.Lambda) and any(isinstance(n, (ast.IfExp, ast.BoolOp)) for n in ast.walk(node)):
                raise self.unsupported(node, "a lambda with control flow is not supported",
                                       "define a module-level function, or use jnp.where.")
            return node
        for name, value in ast.iter_fields(node):
            if isinstance(value, ast.expr):
                setattr(node, name, self.flatten(value))
            elif isinstance(value, list):
                setattr(node, name, [self.flatten(v) if isinstance(v, ast.expr) else v for v in value])
        if isinstance(node, ast.Call):  # a keyword's value is an expression too (`add(a=x, b=y or 7)`)
            for k in node.keywords:
                k.value = self.flatten(k.value)
        return node

    def has_batched_call(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and self.resolve_callee(n.func) is not None for n in ast.walk(node))

    def call(self, node: ast.Call, callee: str, sig: inspect.Signature, out: str | None = None) -> str:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise self.unsupported(node, "`*args`/`**kwargs` in a call to an autobatched function are not supported",
                                   "pass each argument explicitly.")
        placeholders = list(range(len(node.args)))
        try:
            bound = sig.bind(*placeholders, **{k.arg: k.value for k in node.keywords})
        except TypeError as e:
            raise self.unsupported(node, f"call to `{callee}` does not match its signature {sig}: {e}",
                                   f"pass exactly the parameters `{callee}{sig}` takes.") from e
        args: list[str] = []
        for pname, param in sig.parameters.items():
            if pname in bound.arguments:
                value = bound.arguments[pname]
                args.append(self.atom(node.args[value] if isinstance(value, int) else value))
            else:
                t = self.temp()
                default = param.default
                self.emit(node, Prim((t,), (), lambda d=default: (d,), repr(default), self.loc(node)))
                args.append(t)
        out = out or self.temp()
        self.emit(node, Call(out, callee, tuple(args), self.loc(node)))
        return out

    def if_expr(self, node: ast.IfExp) -> str:
        out = self.temp()
        cond = self.atom(node.test)
        then_b, else_b, join = (self.new_block(s, self.loc(node)) for s in ("ifexp.then", "ifexp.else", "ifexp.join"))
        self.terminate(Branch(cond, then_b, else_b, self.loc(node)))
        for block, value in ((then_b, node.body), (else_b, node.orelse)):
            self.cur = block
            self.assign(out, self.flatten(value), value)
            self.terminate(Jump(join))
        self.cur = join
        return out

    def short_circuit(self, node: ast.BoolOp) -> str:
        """`a and b`: b only where a is truthy; the value is the last operand evaluated."""
        out = self.temp()
        join = self.new_block("boolop.join", self.loc(node))
        self.assign(out, self.flatten(node.values[0]), node.values[0])
        for value in node.values[1:]:
            nxt = self.new_block("boolop.next", self.loc(value))
            is_and = isinstance(node.op, ast.And)
            self.terminate(Branch(out, nxt if is_and else join, join if is_and else nxt, self.loc(value)))
            self.cur = nxt
            self.assign(out, self.flatten(value), value)
        self.terminate(Jump(join))
        self.cur = join
        return out

    def chained_compare(self, node: ast.Compare) -> str:
        """`a < b < f(c)` is `a < b and b < f(c)` with `b` evaluated once: a later
        comparison (and its call) only where the earlier ones hold."""
        out = self.temp()
        join = self.new_block("compare.join", self.loc(node))
        left = self.atom(node.left)
        for k, (op, right) in enumerate(zip(node.ops, node.comparators)):
            if k:
                nxt = self.new_block("compare.next", self.loc(right))
                self.terminate(Branch(out, nxt, join, self.loc(right)))
                self.cur = nxt
            value = self.atom(right)
            test = ast.Compare(ast.Name(left, ast.Load()), [op], [ast.Name(value, ast.Load())])
            self.assign(out, ast.copy_location(test, node), node)
            left = value
        self.terminate(Jump(join))
        self.cur = join
        return out

    # --- statements ------------------------------------------------------

    def convert(self) -> Function:
        self.cur = self.new_block("entry", self.loc(self.fdef))
        body = self.fdef.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # docstring
        self.statements(body)
        if self.cur is not None:  # falling off the end returns None
            self.visit_Return(ast.copy_location(ast.Return(None), self.fdef.body[-1]))
        blocks = simplify(tuple(Block(b.label, tuple(b.ops), b.term, b.loc) for b in self.blocks))
        for var, loc in maybe_unbound(blocks, self.params):
            if not var.startswith(self.temp_prefix):
                warnings.warn_explicit(
                    f"`{var}` may be read before it is assigned (on some path through `{self.name}` no "
                    f"assignment reaches this line): where an example takes that path, Python raises "
                    f"UnboundLocalError and pcbatch's value is unspecified. Assign `{var}` on every path "
                    f"before this line (e.g. before the `if` or loop).", MaybeUnboundWarning,
                    loc.filename, loc.lineno)
        a = self.fdef.args
        node = {p.arg: p for p in a.posonlyargs + a.args + a.kwonlyargs}
        return Function(self.name, self.params, blocks, self.loc(self.fdef),
                        tuple(self.loc(node[p]) for p in self.params))

    def _inline_named_lambdas(self) -> None:
        """`sq = lambda v: v * v` is a name for code, not a per-example value: each call
        `sq(x)` (or `tree_map(sq, t)`) becomes the lambda itself, which reads the
        variables it uses when it is called, as Python's does. Only for a lambda
        assigned once, by a statement of the function's own body, and used after it."""
        body = self.fdef.body
        stores: dict[str, int] = {}
        for n in ast.walk(self.fdef):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                stores[n.id] = stores.get(n.id, 0) + 1
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Lambda)):
                continue
            name, fn = stmt.targets[0].id, stmt.value
            if stores.get(name) != 1 or name in self.params or name in _free_loads(fn):
                raise self.unsupported(stmt, f"a lambda assigned to `{name}` is supported only when `{name}` is "
                                             "assigned once and the lambda does not call itself",
                                       "define a module-level function (decorate it with @pcbatch.autobatch if "
                                       "it recurses).")
            defaults = self._bind_lambda_defaults(fn)
            if any(isinstance(n, (ast.IfExp, ast.BoolOp)) for n in ast.walk(fn)):
                raise self.unsupported(fn, "a lambda with control flow is not supported",
                                       "define a module-level function, or use jnp.where.")
            _LambdaInliner(name, fn, self).visit(ast.Module(body[i + 1:], []))
            self.locals.discard(name)  # no longer assigned: its calls are the lambda itself
            body[i] = defaults or ast.copy_location(ast.Pass(), stmt)
        body[:] = [s for part in body for s in (part if isinstance(part, list) else [part])]
        for n in ast.walk(self.fdef):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda):
                raise self.unsupported(n, "a lambda assigned to a variable is supported only by a statement of "
                                          "the function's own body (not inside `if`, loops or tuples)",
                                       "assign it at the top of the function, or define a module-level function.")

    def _bind_lambda_defaults(self, fn: ast.Lambda) -> list[ast.stmt]:
        """Python evaluates a lambda's defaults where it is defined: each default that
        reads a local (or calls an autobatched function) is assigned to a temporary there,
        which the inlined copies read. Defaults of constants and globals stay in place
        (static values, e.g. an `axis=0`)."""
        a = fn.args
        stmts: list[ast.stmt] = []

        def bind(d: ast.expr | None) -> ast.expr | None:
            if d is None or not (self.locals & set(_free_loads(d)) or self.has_batched_call(d)):
                return d
            t = self.temp()
            stmts.append(ast.copy_location(ast.Assign([ast.Name(t, ast.Store())], d), d))
            return ast.copy_location(ast.Name(t, ast.Load()), d)

        a.defaults = [bind(d) for d in a.defaults]
        a.kw_defaults = [bind(d) for d in a.kw_defaults]
        return stmts

    def _params(self) -> tuple[str, ...]:
        a = self.fdef.args
        if a.vararg or a.kwarg:
            raise self.unsupported(self.fdef, "`*args` and `**kwargs` parameters are not supported",
                                   "name each parameter (pytrees such as tuples and dicts are fine).")
        return tuple(p.arg for p in a.posonlyargs + a.args + a.kwonlyargs)

    def statements(self, stmts: list[ast.stmt]) -> None:
        for stmt in stmts:
            visit = getattr(self, f"visit_{type(stmt).__name__}", None)
            if visit is None:
                message, hint = _HINTS.get(type(stmt), (f"`{type(stmt).__name__}` statements are not supported", ""))
                raise self.unsupported(stmt, message, hint)
            visit(stmt)

    def check_target(self, target: ast.expr) -> None:
        for n in ast.walk(target):
            if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.ctx, ast.Store):
                raise self.unsupported(n, "assigning to an element or attribute is not supported (JAX arrays are immutable)",
                                       "write `x = x.at[i].set(v)` for arrays, or build a new tuple/dict.")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self.check_target(t)
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            callee = self.resolve_callee(node.value.func)
            if callee is not None:  # `x = f(...)`: the call writes x directly
                self.call(node.value, *callee, out=node.targets[0].id)
                return
        value = self.flatten(node.value)
        outs = tuple(dict.fromkeys(n for t in node.targets for n in _store_names(t)))
        self.emit_stmt(ast.copy_location(ast.Assign(node.targets, value), node), outs,
                       ast.unparse(value))

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_target(node.target)
        name = node.target.id  # check_target leaves only a Name
        value = ast.BinOp(ast.Name(name, ast.Load()), node.op, self.flatten(node.value))
        self.assign(name, ast.copy_location(value, node), node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit_Assign(ast.copy_location(ast.Assign([node.target], node.value), node))

    def visit_Expr(self, node: ast.Expr) -> None:
        value = self.flatten(node.value)
        if not isinstance(value, (ast.Name, ast.Constant)):
            self.emit_stmt(ast.copy_location(ast.Expr(value), node), (), ast.unparse(value))

    def visit_Pass(self, node: ast.Pass) -> None:
        pass

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value if node.value is not None else ast.copy_location(ast.Constant(None), node)
        var = self.atom(value)
        self.here(node)
        self.terminate(Return(var, self.loc(node)))

    def statement_text(self, node: ast.stmt) -> str:
        """`node` as the user wrote it where it is the only statement on its line
        (comments dropped), else as `ast.unparse` writes it."""
        line = self.loc(node).line.strip()
        try:
            parsed = ast.parse(line).body if node.lineno == node.end_lineno else []
        except SyntaxError:
            parsed = []
        if len(parsed) == 1 and type(parsed[0]) is type(node):
            return ast.get_source_segment(line, parsed[0]) or ast.unparse(node)
        return ast.unparse(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        """The example fails here (reported per example, quoting this line); the
        raised value is never built: only the line says what Python would raise."""
        self.here(node)
        self.terminate(Fail(self.statement_text(node), self.loc(node)))

    def visit_Assert(self, node: ast.Assert) -> None:
        """A branch to a block that fails (the message is not evaluated: the
        error quotes the line)."""
        known = self.constant_test(node.test)
        if known is False:  # `assert False`: a raise
            self.here(node)
            self.terminate(Fail(self.statement_text(node), self.loc(node)))
        elif known is None:
            self.fail_unless(node.test, self.statement_text(node), node)

    def fail_unless(self, test: ast.expr, text: str, node: ast.AST) -> None:
        """Go on where `test` holds; elsewhere the example fails (a `Fail` quoting `text`)."""
        cond = self.atom(test)
        ok = self.new_block("ok", self.loc(node))
        fail = self.new_block("fail", self.loc(node))
        self.here(node)
        self.terminate(Branch(cond, ok, fail, self.loc(node)))
        self.cur = fail
        self.terminate(Fail(text, self.loc(node)))
        self.cur = ok

    def constant_test(self, test: ast.expr) -> bool | None:
        """The truth value of a literal condition (`while True:`), else None."""
        return bool(test.value) if isinstance(test, ast.Constant) else None

    def visit_If(self, node: ast.If) -> None:
        if self.constant_test(node.test) is not None:  # `if True:` needs no branch
            self.statements(node.body if self.constant_test(node.test) else node.orelse)
            return
        cond = self.atom(node.test)
        then_b = self.new_block("if.then", self.loc(node.body[0]))
        else_b = self.new_block("if.else", self.loc(node.orelse[0]) if node.orelse else None)
        join = self.new_block("if.join")
        self.here(node)
        self.terminate(Branch(cond, then_b, else_b, self.loc(node)))
        for block, body in ((then_b, node.body), (else_b, node.orelse)):
            self.cur = block
            self.statements(body)
            self.terminate(Jump(join))
        self.cur = join

    def visit_While(self, node: ast.While) -> None:
        if node.orelse:
            raise self.unsupported(node, "`while ... else` is not supported", "use a flag variable.")
        header = self.new_block("while.header", self.loc(node))
        body = self.new_block("while.body", self.loc(node.body[0]))
        exit_ = self.new_block("while.exit")
        self.here(node)
        self.terminate(Jump(header))
        self.cur = header
        if self.constant_test(node.test) is None:
            cond = self.atom(node.test)
            self.terminate(Branch(cond, body, exit_, self.loc(node)))
        else:  # `while True:` leaves only through break/return
            self.terminate(Jump(body if self.constant_test(node.test) else exit_))
        self.loop_body(body, header, exit_, node.body)
        self.cur = exit_

    def loop_body(self, body: int, cont: int, exit_: int, stmts: list[ast.stmt]) -> None:
        self.loops.append((cont, exit_))
        self.cur = body
        self.statements(stmts)
        self.terminate(Jump(cont))
        self.loops.pop()

    def visit_For(self, node: ast.For) -> None:
        """`for i in range(a, b, s)` with any (data-dependent) bounds is a while loop."""
        it = node.iter
        is_range = (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id not in self.locals
                    and self._lookup(it.func.id) is range and not it.keywords and 1 <= len(it.args) <= 3)
        if not is_range:
            raise self.unsupported(node, "`for` over anything but `range(...)` is not supported",
                                   "iterate over indices: `for i in range(n): x = xs[i]`.")
        if node.orelse:
            raise self.unsupported(node, "`for ... else` is not supported", "use a flag variable.")
        if not isinstance(node.target, ast.Name):
            raise self.unsupported(node, "the loop variable of `for` must be a single name",
                                   "write `for i in range(n):` and unpack inside the loop body.")
        args = list(it.args)
        start, stop, step = ([ast.Constant(0)] + args + [ast.Constant(1)])[:3] if len(args) == 1 else (
            args + [ast.Constant(1)])[:3]
        if self.unroll(node, start, stop, step):
            return
        sign = self._constant_sign(step)
        if sign == 0:
            raise self.unsupported(node, "range() step must not be zero",
                                   "use a positive step to count up or a negative one to count down.")
        # Python evaluates the bounds once, in order: reassigning `n` in `for i in range(n)`
        # changes no trip count (copies that nothing reassigns are coalesced away later).
        # In Python the counter is an int: here JAX's default int, weakly typed (`python_ops.range_counter`).
        bounds = [self.snapshot(e) for e in (start, stop, step)]
        # A literal such as the implicit 0 and 1 fits any int type: it does not set the
        # counter's (else uint32 bounds and the int32 step 1 would join to int32 and wrap).
        typing = [b for b, e in zip(bounds, (start, stop, step)) if (k := self._static_int(e)) is None or k < 0]
        counter, stop_v, step_v = self.temp(), self.temp(), self.temp()
        for name, bound in zip((counter, stop_v, step_v), bounds):
            text = f"{PY}.range_counter({', '.join([bound] + typing)})"  # what a listing shows: no location
            typed = ast.parse(text, mode="eval").body
            typed.args.insert(0, ast.Constant(astuple(self.loc(node))))  # for range_counter's error
            stmt = ast.copy_location(ast.Assign([ast.Name(name, ast.Store())], typed), node)
            self.emit_stmt(ast.fix_missing_locations(stmt), (name,), text)
        if sign is None and not self._static_int(step):  # Python's range() raises ValueError on a 0 step
            nonzero = ast.Compare(ast.Name(step_v, ast.Load()), [ast.NotEq()], [ast.Constant(0)])
            self.fail_unless(ast.fix_missing_locations(ast.copy_location(nonzero, node)), "range() step is 0", node)
        static = [self._static_int(e) for e in (start, stop, step)]
        if None not in static and static[2] != 0 and len(range(*static)) > 0:
            # It runs at least once: its variable is assigned after it, whatever the
            # CFG says (no MaybeUnboundWarning for `for k in range(4): ...` then `k`).
            self.assign(node.target.id, ast.Name(counter, ast.Load()), node)
        header = self.new_block("for.header", self.loc(node))
        body = self.new_block("for.body", self.loc(node.body[0]))
        latch = self.new_block("for.next", self.loc(node))
        exit_ = self.new_block("for.exit")
        self.terminate(Jump(header))
        self.cur = header
        c, s, st = (ast.Name(v, ast.Load()) for v in (counter, stop_v, step_v))
        if sign is not None and sign > 0:
            test: ast.expr = ast.Compare(c, [ast.Lt()], [s])
        elif sign is not None and sign < 0:
            test = ast.Compare(c, [ast.Gt()], [s])
        else:  # step known only at run time
            test = ast.parse(f"{counter} < {stop_v} if {step_v} > 0 else {counter} > {stop_v}", mode="eval").body
            test = ast.Call(ast.Attribute(ast.Name("_pcbatch_jnp", ast.Load()), "where", ast.Load()),
                            [test.test, test.body, test.orelse], [])
        cond = self.temp()
        self.assign(cond, ast.copy_location(test, node), node)
        self.terminate(Branch(cond, body, exit_, self.loc(node)))
        self.cur = body
        self.assign(node.target.id, ast.Name(counter, ast.Load()), node)
        self.loop_body(body, latch, exit_, node.body)
        self.cur = latch
        # Python's counter never wraps: a step past the int range ends the loop (it lands on the stop).
        nxt = f"{counter} + {step_v}"
        wrapped = {1: f"{nxt} < {counter}", -1: f"{nxt} > {counter}"}.get(
            sign, f"_pcbatch_jnp.where({step_v} > 0, {nxt} < {counter}, {nxt} > {counter})")
        advance = ast.parse(f"_pcbatch_jnp.where({wrapped}, {stop_v}, {nxt})", mode="eval").body
        self.assign(counter, ast.copy_location(advance, node), node)
        self.terminate(Jump(header))
        self.cur = exit_

    MAX_UNROLL = 16

    def unroll(self, node: ast.For, start: ast.expr, stop: ast.expr, step: ast.expr) -> bool:
        """A loop over a constant range whose body calls an autobatched function
        (`for k in range(3): h[k] = enc(tree, kids[k])`) is unrolled, so that
        its calls can fork. Only without break/continue, and up to MAX_UNROLL trips."""
        bounds = [self._static_int(e) for e in (start, stop, step)]
        if None in bounds or bounds[2] == 0 or not any(self.has_batched_call(s) for s in node.body):
            return False
        if any(isinstance(n, (ast.Break, ast.Continue)) for s in node.body for n in ast.walk(s)):
            return False
        values = range(*bounds)
        if len(values) > self.MAX_UNROLL:
            return False
        for i in values:
            self.assign(node.target.id, ast.copy_location(ast.Constant(i), node), node)
            self.statements(copy.deepcopy(node.body))  # conversion rewrites the AST in place
        return True

    def _static_int(self, node: ast.expr) -> int | None:
        """A literal int, or the name of a global int (a fixed arity like `N_CHILDREN`)."""
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id not in self.locals:
            value = self._lookup(node.id)
            return value if type(value) is int else None
        return None

    def _lookup(self, name: str) -> Any:
        try:
            return self.compiler.lookup(name)
        except KeyError:
            return None

    @staticmethod
    def _constant_sign(node: ast.expr) -> int | None:
        try:
            value = ast.literal_eval(node)
        except ValueError:
            return None
        return (value > 0) - (value < 0) if isinstance(value, int) else None

    def visit_Break(self, node: ast.Break) -> None:
        self.here(node)
        self.terminate(Jump(self.loops[-1][1]))

    def visit_Continue(self, node: ast.Continue) -> None:
        self.here(node)
        self.terminate(Jump(self.loops[-1][0]))


def convert_function(fn: Callable, name: str, resolve: Resolver, constants: dict[str, Any] | None = None) -> Function:
    """The block IR (Figure 2) of the Python function `fn`; parameters named in
    `constants` are fixed to those values, like closure variables."""
    return Converter(fn, name, resolve, constants).convert()
