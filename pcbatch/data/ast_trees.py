"""Real trees with no download: the syntax trees of the Python standard library's functions.

Every `def` / `async def` in the interpreter's own standard library (the `.py` files under
`sysconfig.get_paths()["stdlib"]`, tests and bundled applications excluded) becomes one tree:

* a node per AST node, its token id the node's class in the fixed vocabulary `AST_VOCAB`
  (stable across Python versions: 0 = `<unk>` for a class this list does not know);
* children in `ast.iter_child_nodes` order, any number of them (variable arity); the
  expression contexts `Load` / `Store` / `Del` are dropped by default (`drop_context`):
  every `Name` would get one child that says little;
* a deterministic train / validation / test split by module (`split_of`: crc32 of the
  dotted module name), so no module contributes to two splits;
* a cap on nodes per tree (`max_nodes`) and on children per node (`max_children`):
  larger functions are skipped (filtered, never cut).

The arrays are `pcbatch.data.Tree`s, the format every tree model here takes, with
`children int32[max_nodes, max_children]` (`-1` = none) instead of two columns::

    children  int32[max_nodes, max_children]  child ids in iter_child_nodes order, packed left; -1 = none
    word      int32[max_nodes]                the node's token id (AST_VOCAB); -1 = padding
    node_type int32[max_nodes]                the same token id; -1 = padding
    root      int32[]                         num_nodes - 1
    num_nodes int32[]

Node ids are post-order (children before their parent), so ids in increasing order are a
bottom-up order and the root is `num_nodes - 1`, as in `pcbatch.data.trees`. Every node
carries a word, so `models.child_sum` and `models.child_sum_loop` embed the node type at
every node (leaves and internal nodes alike); `batch()` stacks trees of one padded size.

    train = load_ast_trees("train", max_nodes=64)      # AstTrees: .trees, .labels, .modules, .names
    b = pcbatch.data.batch(train.trees[:32])

Tasks (`task=`): `"returns_value"` labels a function 1 if one of its own `return`
statements (nested defs and lambdas excluded) returns a value, and masks the telltale:
every `Return` node in the tree (nested defs' too) is relabelled `Expr` (the value subtree stays, a bare `return`
becomes a childless `Expr`), so the label is not a node type but where an expression
statement sits and what it holds.

Parsing the whole library takes 15-30 s on two loaded cores; parsed modules are cached per process.
Deterministic for a given Python version (its stdlib is the data).
"""
from __future__ import annotations

import ast
import functools
import os
import sysconfig
import warnings
import zlib
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from pcbatch.data.trees import Tree

__all__ = ["AST_VOCAB", "AstTrees", "SPLITS", "ast_token", "check_ast_tree", "encode_function",
           "function_defs", "load_ast_trees", "returns_value", "split_of", "stdlib_modules"]

#: The fixed vocabulary: token id = index. Listed here rather than read from `ast` so that
#: ids do not move between Python versions (classes new in a version are appended).
AST_VOCAB: tuple[str, ...] = (
    "<unk>",
    # statements
    "FunctionDef", "AsyncFunctionDef", "ClassDef", "Return", "Delete", "Assign", "AugAssign", "AnnAssign",
    "For", "AsyncFor", "While", "If", "With", "AsyncWith", "Match", "Raise", "Try", "TryStar", "Assert",
    "Import", "ImportFrom", "Global", "Nonlocal", "Expr", "Pass", "Break", "Continue",
    # expressions
    "BoolOp", "NamedExpr", "BinOp", "UnaryOp", "Lambda", "IfExp", "Dict", "Set", "ListComp", "SetComp",
    "DictComp", "GeneratorExp", "Await", "Yield", "YieldFrom", "Compare", "Call", "FormattedValue",
    "JoinedStr", "Constant", "Attribute", "Subscript", "Starred", "Name", "List", "Tuple", "Slice",
    # contexts and operators
    "Load", "Store", "Del", "And", "Or", "Add", "Sub", "Mult", "MatMult", "Div", "Mod", "Pow", "LShift",
    "RShift", "BitOr", "BitXor", "BitAnd", "FloorDiv", "Invert", "Not", "UAdd", "USub", "Eq", "NotEq",
    "Lt", "LtE", "Gt", "GtE", "Is", "IsNot", "In", "NotIn",
    # the rest
    "comprehension", "ExceptHandler", "arguments", "arg", "keyword", "alias", "withitem", "match_case",
    "MatchValue", "MatchSingleton", "MatchSequence", "MatchMapping", "MatchClass", "MatchStar", "MatchAs",
    "MatchOr", "TypeIgnore", "TypeAlias", "TypeVar", "ParamSpec", "TypeVarTuple", "TemplateStr",
    "Interpolation", "Module",
)
_TOKEN = {name: k for k, name in enumerate(AST_VOCAB)}
_CONTEXTS = (ast.Load, ast.Store, ast.Del)
_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3",
              "turtledemo", "ensurepip", "tkinter", "venv"}

#: Split names and their default fractions of the modules.
SPLITS = ("train", "validation", "test")


def ast_token(node: ast.AST) -> int:
    """A node's token id: the index of its class name in `AST_VOCAB` (0 if unknown)."""
    return _TOKEN.get(type(node).__name__, 0)


def stdlib_modules(root: str | None = None) -> list[tuple[str, str]]:
    """(dotted module name, path) of every `.py` file of the standard library, sorted by name;
    tests, bundled apps (idlelib, turtledemo, ...) and site-packages left out."""
    root = sysconfig.get_paths()["stdlib"] if root is None else root
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS and not x.startswith("."))
        rel = os.path.relpath(d, root)
        prefix = "" if rel == "." else rel.replace(os.sep, ".") + "."
        for f in files:
            if f.endswith(".py"):
                name = prefix + f[:-3]
                out.append((name[: -len(".__init__")] if name.endswith(".__init__") else name, os.path.join(d, f)))
    return sorted(out)


def split_of(module: str, fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> str:
    """The split a module belongs to: crc32 of its dotted name, as a fraction of 2**32,
    against the cumulative `fractions` of (train, validation, test)."""
    u = zlib.crc32(module.encode("utf-8")) / 2.0 ** 32
    edge = 0.0
    for name, frac in zip(SPLITS, fractions):
        edge += frac
        if u < edge:
            return name
    return SPLITS[-1]


@functools.lru_cache(maxsize=None)
def _parse(path: str) -> ast.Module | None:
    try:
        with open(path, "rb") as fh:
            source = fh.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # invalid escape sequences in old modules
            return ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError):
        return None


def function_defs(module: ast.AST) -> Iterator[ast.AST]:
    """Every FunctionDef / AsyncFunctionDef in `module`, in `ast.walk` order (methods and
    nested functions too)."""
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `fn`'s body that belong to `fn` itself: nested defs, lambdas and classes
    are not entered (their returns are theirs)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def returns_value(fn: ast.AST) -> bool:
    """Whether one of `fn`'s own `return` statements returns a value."""
    return any(isinstance(n, ast.Return) and n.value is not None for n in _own_nodes(fn))


def encode_function(fn: ast.AST, *, max_nodes: int, max_children: int, drop_context: bool = True,
                    relabel: dict[int, int] | None = None) -> Tree | None:
    """One AST as a `Tree` padded to `max_nodes` x `max_children`, or None if it has more
    nodes or a node with more children. `relabel`: `id(node) -> token` overrides."""
    relabel = relabel or {}
    tokens: list[int] = []
    kids: list[list[int]] = []
    # iterative post-order: (node, child ids so far or None before its children are pushed)
    stack: list[tuple[ast.AST, list[int] | None]] = [(fn, None)]
    done: list[int] = []            # ids of finished nodes, consumed by their parent
    visited = 0
    while stack:
        node, state = stack.pop()
        if state is None:
            visited += 1
            if visited > max_nodes:     # give up on a large function before walking all of it
                return None
            children = [c for c in ast.iter_child_nodes(node) if not (drop_context and isinstance(c, _CONTEXTS))]
            if len(children) > max_children:
                return None
            stack.append((node, [len(children)]))
            stack.extend((c, None) for c in reversed(children))
            continue
        (n_children,) = state
        ids = done[len(done) - n_children:] if n_children else []
        del done[len(done) - n_children:]
        if len(tokens) >= max_nodes:
            return None
        tokens.append(relabel.get(id(node), ast_token(node)))
        kids.append(ids)
        done.append(len(tokens) - 1)
    n = len(tokens)
    children = -np.ones((max_nodes, max_children), np.int32)
    for j, ids in enumerate(kids):
        children[j, :len(ids)] = ids
    word = -np.ones(max_nodes, np.int32)
    word[:n] = tokens
    return Tree(children, word, word.copy(), np.int32(n - 1), np.int32(n))


def check_ast_tree(tree: Tree) -> None:
    """Raise `ValueError` unless `tree` (unbatched) is a valid variable-arity tree: children
    packed left, each used node reachable from the root exactly once, children before
    parents, root = num_nodes - 1, every used node typed, padding blank."""
    children, word, node_type = (np.asarray(a) for a in (tree.children, tree.word, tree.node_type))
    n, root = int(tree.num_nodes), int(tree.root)
    if not 1 <= n <= word.shape[0] or root != n - 1:
        raise ValueError(f"num_nodes={n}, root={root}")
    if np.any(children[n:] != -1) or np.any(word[n:] != -1) or np.any(node_type[n:] != -1):
        raise ValueError("padding nodes are not blank")
    if np.any(word[:n] < 0) or np.any(word[:n] >= len(AST_VOCAB)):
        raise ValueError("a used node has no valid token")
    used = children[:n] >= 0
    if np.any(used[:, 1:] & ~used[:, :-1]):
        raise ValueError("children are not packed left")
    parents = np.zeros(n, np.int64)
    for j in range(n):
        for c in children[j][used[j]]:
            if not 0 <= c < j:
                raise ValueError(f"node {j} has child {c} (children come first)")
            parents[c] += 1
    if parents[root] != 0 or np.any(np.delete(parents, root) != 1):
        raise ValueError("not a tree: some node has no parent or several")


class AstTrees(NamedTuple):
    """One split: trees (unbatched `Tree`s of one padded size) with their labels (task) and
    where each came from."""

    trees: list[Tree]
    labels: np.ndarray          # int32[len(trees)]; zeros without a task
    modules: list[str]
    names: list[str]


def _whole(value: object) -> bool:
    """An int, or a float holding one (`2.0`); not a bool or a string."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and float(value).is_integer())


def _numbers(values: object) -> tuple[float, ...] | None:
    """`values` as floats, or None where they are not a sequence of numbers."""
    if isinstance(values, (str, bytes)):
        return None
    try:
        return tuple(float(v) for v in values)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None


def load_ast_trees(split: str = "train", *, max_nodes: int = 128, min_nodes: int = 1, max_children: int = 16,
                   max_trees: int | None = None, task: str | None = None, drop_context: bool = True,
                   modules: Sequence[str] | None = None,
                   fractions: Sequence[float] = (0.8, 0.1, 0.1)) -> AstTrees:
    """The functions of the stdlib modules in `split` ("train", "validation", "test", or
    "all") with between `min_nodes` and `max_nodes` nodes and at most `max_children`
    children per node, in module-name then `ast.walk` order, at most `max_trees`.
    `modules`: restrict to these dotted names (default: all of `stdlib_modules()`).
    `task`: None, or "returns_value" (labels and masking: see the module docstring)."""
    if split not in SPLITS + ("all",):
        raise ValueError(f"split must be one of {SPLITS + ('all',)}, got {split!r}")
    if task not in (None, "returns_value"):
        raise ValueError(f"unknown task {task!r}")
    if max_trees is not None and not (_whole(max_trees) and max_trees >= 0):
        raise ValueError(f"max_trees must be None or an int >= 0, got {max_trees!r}")
    for name, value, low in (("max_nodes", max_nodes, 1), ("min_nodes", min_nodes, 1), ("max_children", max_children, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if min_nodes > max_nodes:
        raise ValueError(f"min_nodes ({min_nodes}) is more than max_nodes ({max_nodes}): no tree qualifies")
    numbers = _numbers(fractions)
    if numbers is None or len(numbers) != len(SPLITS) or any(not f >= 0 for f in numbers) or not sum(numbers) > 0:
        raise ValueError(f"fractions must be {len(SPLITS)} non-negative numbers (train, validation, test), "
                         f"got {fractions!r}")
    if isinstance(modules, str):
        raise ValueError(f"modules must be a sequence of dotted module names, got the string {modules!r} "
                         f"(write modules=[{modules!r}])")
    wanted = None if modules is None else set(modules)
    if wanted is not None:
        unknown = sorted(wanted - {name for name, _ in stdlib_modules()})
        if unknown:
            raise ValueError(f"modules not in stdlib_modules(): {unknown[:5]}")
    out = AstTrees([], [], [], [])
    labels: list[int] = []
    if max_trees == 0:
        return out._replace(labels=np.asarray(labels, np.int32))
    for name, path in stdlib_modules():
        if (wanted is not None and name not in wanted) or (split != "all" and split_of(name, fractions) != split):
            continue
        module = _parse(path)
        if module is None:
            continue
        for fn in function_defs(module):
            # Most functions do not fit: encoding gives up early, so size them before the task's walks.
            tree = encode_function(fn, max_nodes=max_nodes, max_children=max_children, drop_context=drop_context)
            if tree is None or int(tree.num_nodes) < min_nodes:
                continue
            label = 0
            if task == "returns_value":
                label = int(returns_value(fn))
                relabel = {id(n): _TOKEN["Expr"] for n in ast.walk(fn) if isinstance(n, ast.Return)}
                tree = encode_function(fn, max_nodes=max_nodes, max_children=max_children,
                                       drop_context=drop_context, relabel=relabel)
            out.trees.append(tree)
            labels.append(label)
            out.modules.append(name)
            out.names.append(fn.name)
            if max_trees is not None and len(out.trees) >= max_trees:
                return out._replace(labels=np.asarray(labels, np.int32))
    return out._replace(labels=np.asarray(labels, np.int32))
