"""`pcbatch.data.ast_trees`: the stdlib function ASTs, checked against `ast` itself.

A handful of small modules keeps this file at a few seconds (parsing the whole stdlib
takes ~20 s on two loaded cores); the split test hashes every module's name but parses none.
"""
from __future__ import annotations

import ast

import numpy as np
import pytest

from pcbatch import data
from pcbatch.data import ast_trees

MODULES = ["bisect", "heapq", "textwrap", "json.decoder", "json.encoder", "colorsys", "keyword", "fnmatch"]
PATHS = dict(data.stdlib_modules())


def _parse(name):
    with open(PATHS[name], "rb") as fh:
        return ast.parse(fh.read())


def _kids(node):
    return [c for c in ast.iter_child_nodes(node) if not isinstance(c, (ast.Load, ast.Store, ast.Del))]


def _postorder(node):
    """(type names, child arities) in post-order, written independently of the loader."""
    names, arity = [], []

    def go(n):
        for c in _kids(n):
            go(c)
        names.append(type(n).__name__)
        arity.append(len(_kids(n)))
    go(node)
    return names, arity


def _functions(modules):
    for m in sorted(modules):  # the loader's order: by module name
        for node in ast.walk(_parse(m)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield m, node


def test_modules_exist():
    assert set(MODULES) <= set(PATHS)
    assert not any(n.startswith("test.") or "site-packages" in p for n, p in PATHS.items())


def test_trees_match_ast_and_cap_is_respected():
    max_nodes, max_children = 40, 6
    got = data.load_ast_trees("all", max_nodes=max_nodes, max_children=max_children, modules=MODULES)
    want = []
    for m, fn in _functions(MODULES):
        names, arity = _postorder(fn)
        if len(names) <= max_nodes and max(arity) <= max_children:
            want.append((m, fn.name, names, arity))
    assert len(want) > 20 and len(got.trees) == len(want)
    for tree, m, name, (wm, wname, names, arity) in zip(got.trees, got.modules, got.names, want):
        assert (m, name) == (wm, wname)
        data.check_ast_tree(tree)
        n = int(tree.num_nodes)
        assert tree.children.shape == (max_nodes, max_children) and n == len(names) <= max_nodes
        assert [data.AST_VOCAB[t] for t in tree.word[:n]] == names
        np.testing.assert_array_equal(tree.node_type, tree.word)
        assert list((tree.children[:n] >= 0).sum(axis=1)) == arity
    assert any(max(a) > 2 for *_, a in want), "variable arity: some node has more than two children"


def test_children_in_iter_child_nodes_order():
    """The root's children, in order, are the roots of the function's own children's subtrees."""
    got = data.load_ast_trees("all", max_nodes=64, max_children=16, modules=["bisect"])
    fns = [fn for _, fn in _functions(["bisect"])]
    tree = got.trees[0]
    fn = next(f for f in fns if f.name == got.names[0])
    root = int(tree.root)
    kids = [int(c) for c in tree.children[root] if c >= 0]
    assert [data.AST_VOCAB[tree.word[c]] for c in kids] == [type(c).__name__ for c in _kids(fn)]
    assert kids == sorted(kids)      # post-order: earlier children get smaller ids


def test_deterministic():
    a = data.load_ast_trees("all", max_nodes=32, modules=MODULES)
    b = data.load_ast_trees("all", max_nodes=32, modules=MODULES)
    assert a.names == b.names and a.modules == b.modules
    for s, t in zip(a.trees, b.trees):
        for x, y in zip(s, t):
            np.testing.assert_array_equal(x, y)


def test_split_by_module_disjoint_and_covering():
    names = [n for n, _ in data.stdlib_modules()]
    by_split = {s: {n for n in names if data.split_of(n) == s} for s in data.ast_trees.SPLITS}
    assert set().union(*by_split.values()) == set(names)
    assert sum(len(v) for v in by_split.values()) == len(names)
    assert 0.7 < len(by_split["train"]) / len(names) < 0.9          # crc32 spreads the names
    assert all(len(v) > 10 for v in by_split.values())
    # the loader keeps exactly the modules of its split
    for s in data.ast_trees.SPLITS:
        got = data.load_ast_trees(s, max_nodes=32, modules=MODULES)
        assert set(got.modules) <= by_split[s] & set(MODULES)
    assert data.split_of("json.decoder") == data.split_of("json.decoder")
    with pytest.raises(ValueError):
        data.load_ast_trees("dev")


def test_returns_value_task_labels_and_masks():
    got = data.load_ast_trees("all", max_nodes=64, max_children=16, modules=MODULES, task="returns_value")
    fns = {(m, fn.name, fn.lineno): fn for m, fn in _functions(MODULES)}
    assert 0 < got.labels.mean() < 1
    ret = data.AST_VOCAB.index("Return")
    for tree, label, m, name in zip(got.trees, got.labels, got.modules, got.names):
        assert not np.any(tree.word == ret), "Return nodes are masked"
        candidates = [fn for (mm, nn, _), fn in fns.items() if (mm, nn) == (m, name)]
        # the label agrees with a direct walk of one function of that name
        # (a nested def's returns are its own, so compare with the outer function's own returns)
        def own_value_return(fn):
            stack, found = list(ast.iter_child_nodes(fn)), False
            while stack:
                n = stack.pop()
                if isinstance(n, ast.Return) and n.value is not None:
                    found = True
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                    stack.extend(ast.iter_child_nodes(n))
            return found
        assert label in {int(own_value_return(fn)) for fn in candidates}
    plain = data.load_ast_trees("all", max_nodes=64, max_children=16, modules=MODULES)
    assert any(np.any(t.word == ret) for t in plain.trees)


def test_check_ast_tree_rejects_broken_trees():
    tree = next(t for t in data.load_ast_trees("all", max_nodes=64, modules=["colorsys"]).trees
                if int(t.num_nodes) < 64)
    data.check_ast_tree(tree)
    bad = tree._replace(children=tree.children.copy())
    root = int(tree.root)
    bad.children[root, :] = -1                     # orphans the root's children
    with pytest.raises(ValueError):
        data.check_ast_tree(bad)
    bad = tree._replace(word=tree.word.copy())
    bad.word[int(tree.num_nodes)] = 3               # padding not blank
    with pytest.raises(ValueError):
        data.check_ast_tree(bad)


def test_batches_stack():
    got = data.load_ast_trees("all", max_nodes=32, modules=MODULES, max_trees=5)
    b = data.batch(got.trees)
    assert b.children.shape == (5, 32, 16) and b.root.shape == (5,)


def test_encode_function_respects_caps():
    fn = ast.parse("def f(a, b):\n    return g(a, b, 1, 2, 3)\n").body[0]
    full = ast_trees.encode_function(fn, max_nodes=64, max_children=8)
    n = int(full.num_nodes)
    assert ast_trees.encode_function(fn, max_nodes=n, max_children=8) is not None
    assert ast_trees.encode_function(fn, max_nodes=n - 1, max_children=8) is None
    assert ast_trees.encode_function(fn, max_nodes=64, max_children=5) is None   # the Call has 6 children
    assert ast_trees.encode_function(fn, max_nodes=64, max_children=6) is not None


def test_max_trees_zero_is_empty_and_negative_is_an_error():
    assert len(data.load_ast_trees("train", max_trees=0).trees) == 0
    assert len(data.load_ast_trees("train", max_trees=2, max_nodes=32).trees) == 2
    with pytest.raises(ValueError, match="max_trees"):
        data.load_ast_trees("train", max_trees=-5)
    # random_binary_trees alike: zero trees is empty, a negative count (was an empty list) or a fractional size an error
    assert data.random_binary_trees(0) == []
    for bad in ({"count": -1}, {"count": 3, "min_leaves": 2.5}):
        with pytest.raises(ValueError, match="must be an int >= 0"):
            data.random_binary_trees(**bad)


@pytest.mark.parametrize("kwargs, says", [
    ({"modules": "json"}, "write modules=\\['json'\\]"),       # was a set of characters: no trees
    ({"modules": ["no.such.module"]}, "not in stdlib_modules"),
    ({"max_nodes": 1, "min_nodes": 2}, "min_nodes .* is more than max_nodes"),
    ({"max_nodes": 0}, "max_nodes must be an int >= 1"),
    ({"max_children": 0}, "max_children must be an int >= 1"),
    ({"fractions": (0.8, -0.1, 0.3)}, "fractions must be"),
    ({"fractions": "abc"}, "fractions must be"),             # was float()'s or a comparison's raw error
    ({"fractions": None}, "fractions must be"),
    ({"max_trees": "x"}, "max_trees must be None or an int"),
])
def test_bad_arguments_are_errors_not_empty_sets(kwargs, says):
    with pytest.raises(ValueError, match=says):
        data.load_ast_trees("all", **kwargs)
