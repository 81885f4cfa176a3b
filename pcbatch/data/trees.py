"""Array-encoded trees, lattices and chains for TreeRNN-style models.

Everything here is NumPy, seeded and download-free. Each structure is a
`NamedTuple` of fixed-size arrays (padded to `max_nodes` / `max_len`) so that a
list of them stacks into one batch with `batch(items)`, and a batch can be passed
straight to an `@pcbatch.autobatch(in_axes=(None, 0, ...))` model.

Trees (`Tree`)
--------------
Binary trees (every internal node has exactly two children)::

    children  int32[max_nodes, 2]   child node ids (left, right); -1 = none (leaves, padding)
    word      int32[max_nodes]      word id at leaves; -1 at internal nodes and padding
    node_type int32[max_nodes]      node type id (random trees: uniform in [0, n_types);
                                    stdlib ASTs: the AST class id, see `AST_TYPES`); -1 = padding
    root      int32[]               the root's node id
    num_nodes int32[]               nodes in use; ids >= num_nodes are padding

Node ids: leaves first, left to right (0 .. L-1), then internal nodes in
post-order (L .. 2L-2), so a child's id is always smaller than its parent's and
the root is `num_nodes - 1` (the same convention as the SST treebank files).
`ids in increasing order` is therefore a topological (bottom-up) order.

Sources: `random_binary_tree(s)` (sentence-like sizes, 10-60 leaves, several
shapes) and `stdlib_ast_trees` (syntax trees of Python's own standard library,
binarized left-leaning).

Lattices (`Lattice`)
--------------------
A character/word lattice as used by the lattice LSTM (Zhang & Yang 2018)::

    chars      int32[max_len]                    character ids; -1 = padding
    length     int32[]                           n, the number of characters
    word_start int32[max_len + 1, max_words_in]  for end position e: start positions b
                                                 of the lexicon words spanning chars b..e-1; -1 = none
    word_id    int32[max_len + 1, max_words_in]  the matching word ids; -1 = none

Nodes are the positions 0..n between characters; character t is the edge
t -> t+1, and a word over characters b..e-1 (at least two) is the edge b -> e.
Words come from the union of several random segmentations of the sequence (each
segmentation contributes at most one word ending at any position, so
`max_words_in = n_segmentations` never truncates).

Chains (`Chain`)
----------------
A tagged sentence for a BiLSTM tagger: `words int32[max_len]`, `tags
int32[max_len]` (-1 = padding) and `length int32[]`.
"""
from __future__ import annotations

import ast
import os
import sysconfig
import warnings
import zlib
from typing import Any, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

__all__ = [
    "AST_TYPES",
    "Chain",
    "Lattice",
    "Tree",
    "batch",
    "check_chain",
    "check_lattice",
    "check_tree",
    "random_binary_tree",
    "random_binary_trees",
    "random_chains",
    "random_lattice",
    "random_lattices",
    "stdlib_ast_trees",
    "token_id",
    "tree_height",
    "tree_leaves",
]

SHAPES = ("random", "frontier", "balanced", "left", "right")


class Tree(NamedTuple):
    children: np.ndarray
    word: np.ndarray
    node_type: np.ndarray
    root: np.ndarray
    num_nodes: np.ndarray


class Lattice(NamedTuple):
    chars: np.ndarray
    length: np.ndarray
    word_start: np.ndarray
    word_id: np.ndarray


class Chain(NamedTuple):
    words: np.ndarray
    tags: np.ndarray
    length: np.ndarray


def batch(items: Sequence[NamedTuple]) -> NamedTuple:
    """Stack trees (or lattices, or chains) of one padded size into one batch:
    every field gets a leading batch axis."""
    if (isinstance(items, tuple) and hasattr(items, "_fields")) or not isinstance(items, Iterable):
        raise TypeError(f"batch() takes a sequence of trees (or lattices, or chains), got "
                        f"{type(items).__name__}: pass a list, e.g. data.batch([tree]) for one")
    items = list(items)
    if not items:
        raise ValueError("batch() needs at least one item")
    kind = type(items[0])
    if not hasattr(kind, "_fields"):
        raise TypeError(f"batch() items are data.Tree, data.Lattice or data.Chain (NamedTuples of arrays), "
                        f"got {kind.__name__}")
    if any(type(t) is not kind for t in items):
        raise TypeError("batch() items must all be of one type")
    for name in kind._fields:
        shapes = {np.shape(getattr(t, name)) for t in items}
        if len(shapes) > 1:
            raise ValueError(f"cannot batch: field {name!r} has shapes {sorted(shapes)} (pad to one size)")
    return kind(*(np.stack([getattr(t, name) for t in items]) for name in kind._fields))


def token_id(token: str, vocab: int) -> int:
    """A stable (process-independent) hash of a token into `[0, vocab)`."""
    return zlib.crc32(token.encode("utf-8")) % vocab


# --------------------------------------------------------------------------
# nested trees -> arrays
# --------------------------------------------------------------------------
# A nested tree is either ("leaf", word, type) or ("node", type, left, right).

def _count_leaves(t) -> int:
    n, stack = 0, [t]
    while stack:
        s = stack.pop()
        if s[0] == "leaf":
            n += 1
        else:
            stack += [s[2], s[3]]
    return n


def _encode(nested, max_nodes: int) -> Tree:
    """Leaves first (left to right), then internal nodes in post-order."""
    leaves: list = []
    internal: list = []       # post-order; each entry (type, left_ref, right_ref)
    # iterative post-order; a ref is ("L", i) or ("I", i)
    stack: list = [(nested, False)]
    refs: list = []
    while stack:
        t, done = stack.pop()
        if t[0] == "leaf":
            leaves.append(t)
            refs.append(("L", len(leaves) - 1))
        elif not done:
            stack.append((t, True))
            stack.append((t[3], False))
            stack.append((t[2], False))
        else:
            r = refs.pop()
            l = refs.pop()
            internal.append((t[1], l, r))
            refs.append(("I", len(internal) - 1))
    n_leaves = len(leaves)
    n = n_leaves + len(internal)
    if n > max_nodes:
        raise ValueError(f"tree has {n} nodes, more than max_nodes={max_nodes}")
    children = -np.ones((max_nodes, 2), np.int32)
    word = -np.ones(max_nodes, np.int32)
    node_type = -np.ones(max_nodes, np.int32)
    ident = lambda ref: ref[1] if ref[0] == "L" else n_leaves + ref[1]
    for i, (_, w, ty) in enumerate(leaves):
        word[i] = w
        node_type[i] = ty
    for k, (ty, l, r) in enumerate(internal):
        j = n_leaves + k
        children[j] = (ident(l), ident(r))
        node_type[j] = ty
    (root_ref,) = refs
    return Tree(children, word, node_type, np.int32(ident(root_ref)), np.int32(n))


def tree_leaves(tree: Tree) -> int:
    """Number of leaves of one (unbatched) tree."""
    n = int(tree.num_nodes)
    return int(np.sum(tree.children[:n, 0] < 0))


def tree_height(tree: Tree) -> int:
    """Height of one (unbatched) tree: a single leaf has height 0."""
    n = int(tree.num_nodes)
    h = np.zeros(n, np.int64)
    for j in range(n):          # children have smaller ids (post-order encoding)
        l, r = tree.children[j]
        if l >= 0:
            h[j] = 1 + max(h[l], h[r])
    return int(h[int(tree.root)])


def check_tree(tree: Tree, *, min_leaves: int = 1, max_leaves: int | None = None) -> None:
    """Raise `ValueError` unless `tree` (unbatched) is a valid binary tree:
    every used node reachable from the root exactly once, leaves (and only
    leaves) carry a word and have no children, internal nodes have two, padding
    is blank, and the size is within bounds."""
    children, word, node_type = (np.asarray(a) for a in (tree.children, tree.word, tree.node_type))
    max_nodes = word.shape[0]
    n, root = int(tree.num_nodes), int(tree.root)
    if children.shape != (max_nodes, 2):
        raise ValueError(f"children has shape {children.shape}, expected {(max_nodes, 2)}")
    if not 1 <= n <= max_nodes:
        raise ValueError(f"num_nodes={n} outside [1, {max_nodes}]")
    if not 0 <= root < n:
        raise ValueError(f"root={root} outside [0, {n})")
    if np.any(children[n:] != -1) or np.any(word[n:] != -1) or np.any(node_type[n:] != -1):
        raise ValueError("padding nodes are not blank")
    if np.any(node_type[:n] < 0):
        raise ValueError("a used node has no type")
    seen = np.zeros(n, np.int64)
    stack = [root]
    while stack:
        j = stack.pop()
        if not 0 <= j < n:
            raise ValueError(f"node id {j} outside [0, {n})")
        seen[j] += 1
        if seen[j] > 1:
            raise ValueError(f"node {j} reachable more than once")
        l, r = int(children[j, 0]), int(children[j, 1])
        if (l < 0) != (r < 0):
            raise ValueError(f"node {j} has exactly one child")
        if l < 0:
            if word[j] < 0:
                raise ValueError(f"leaf {j} has no word")
        else:
            if word[j] != -1:
                raise ValueError(f"internal node {j} has a word")
            stack += [l, r]
    if np.any(seen != 1):
        raise ValueError(f"nodes {np.nonzero(seen != 1)[0].tolist()} not reachable from the root")
    leaves = int(np.sum(children[:n, 0] < 0))
    if n != 2 * leaves - 1:
        raise ValueError(f"{n} nodes but {leaves} leaves")
    if leaves < min_leaves or (max_leaves is not None and leaves > max_leaves):
        raise ValueError(f"{leaves} leaves outside [{min_leaves}, {max_leaves}]")


# --------------------------------------------------------------------------
# random binary trees
# --------------------------------------------------------------------------

def _random_nested(rng: np.random.Generator, n_leaves: int, shape: str, vocab: int, n_types: int):
    word = lambda: ("leaf", int(rng.integers(vocab)), int(rng.integers(n_types)))
    ty = lambda: int(rng.integers(n_types))
    if shape in ("left", "right"):
        t = word()
        for _ in range(n_leaves - 1):
            t = ("node", ty(), t, word()) if shape == "left" else ("node", ty(), word(), t)
        return t
    if shape == "frontier":       # expand a uniformly chosen leaf (as in examples/demo.py)
        root = [word()]               # mutable holders; a slot is (holder, index)
        slots = [(root, 0)]
        while len(slots) < n_leaves:
            holder, k = slots.pop(int(rng.integers(len(slots))))
            node = ["node", ty(), word(), word()]
            holder[k] = node
            slots += [(node, 2), (node, 3)]

        def freeze(t):
            return ("node", t[1], freeze(t[2]), freeze(t[3])) if t[0] == "node" else t
        return freeze(root[0])

    def build(n: int):           # "random": uniform split point; "balanced": halves
        if n == 1:
            return word()
        k = n // 2 if shape == "balanced" else int(rng.integers(1, n))
        return ("node", ty(), build(k), build(n - k))
    return build(n_leaves)


def random_binary_tree(rng: np.random.Generator, n_leaves: int, max_nodes: int, *, shape: str = "random",
                       vocab: int = 1000, n_types: int = 2) -> Tree:
    """One binary tree over `n_leaves` leaves, padded to `max_nodes` nodes.

    shape: "random" (split point uniform over each span, like random
    bracketings of a sentence), "frontier" (repeatedly split a uniformly chosen
    leaf), "balanced", "left" / "right" (left- / right-branching chains).
    Leaf words are uniform in [0, vocab); node types uniform in [0, n_types)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {SHAPES}, got {shape!r}")
    if n_leaves < 1:
        raise ValueError("n_leaves must be at least 1")
    return _encode(_random_nested(rng, n_leaves, shape, vocab, n_types), max_nodes)


def random_binary_trees(count: int, *, seed: int = 0, min_leaves: int = 10, max_leaves: int = 60,
                        max_nodes: int | None = None, shape: str | Sequence[str] = "random",
                        vocab: int = 1000, n_types: int = 2) -> list[Tree]:
    """`count` random binary trees with leaf counts uniform in
    [min_leaves, max_leaves] (sentence-like sizes by default), all padded to
    `max_nodes` (default `2 * max_leaves - 1`). A sequence of shapes is cycled."""
    for name, value in (("count", count), ("min_leaves", min_leaves), ("max_leaves", max_leaves)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")   # -1 trees was an empty list
    if not 1 <= min_leaves <= max_leaves:
        raise ValueError("need 1 <= min_leaves <= max_leaves")
    max_nodes = 2 * max_leaves - 1 if max_nodes is None else max_nodes
    shapes = [shape] if isinstance(shape, str) else list(shape)
    rng = np.random.default_rng(seed)
    return [random_binary_tree(rng, int(rng.integers(min_leaves, max_leaves + 1)), max_nodes,
                               shape=shapes[i % len(shapes)], vocab=vocab, n_types=n_types)
            for i in range(count)]


# --------------------------------------------------------------------------
# syntax trees of the Python standard library
# --------------------------------------------------------------------------

AST_TYPES: tuple[str, ...] = tuple(sorted(
    name for name in dir(ast)
    if isinstance(getattr(ast, name), type) and issubclass(getattr(ast, name), ast.AST)
    and not name.startswith("_")))
_AST_TYPE_ID = {name: k for k, name in enumerate(AST_TYPES)}
_TOKEN_FIELDS = ("id", "attr", "arg", "name", "module", "asname")


def _ast_items(node: ast.AST, vocab: int) -> list:
    """The binarizable children of an AST node: its child nodes (expression
    contexts dropped) and, as leaves, its identifier / constant tokens."""
    ty = _AST_TYPE_ID.get(type(node).__name__, 0)
    items: list[Any] = []
    for field in _TOKEN_FIELDS:
        value = getattr(node, field, None)
        if isinstance(value, str):
            items.append(("leaf", token_id(value, vocab), ty))
    if isinstance(node, ast.Constant):
        items.append(("leaf", token_id(repr(node.value)[:40], vocab), ty))
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, ast.expr_context):
            items.append(child)
    return items


def _binarize(node: ast.AST, vocab: int, limit: int) -> tuple[Any, int] | None:
    """Left-leaning binarization: children c1..cn of a node of type T become
    T(...T(T(c1, c2), c3)..., cn); a node with one child is replaced by it; a
    node with none becomes a leaf whose word is its class name. Returns
    (nested tree, leaves), or None once more than `limit` leaves are found."""
    ty = _AST_TYPE_ID.get(type(node).__name__, 0)
    parts = []
    leaves = 0
    for item in _ast_items(node, vocab):
        if isinstance(item, ast.AST):
            sub = _binarize(item, vocab, limit - leaves)
            if sub is None:
                return None
            t, k = sub
        else:
            t, k = item, 1
        parts.append(t)
        leaves += k
        if leaves > limit:
            return None
    if not parts:
        if limit < 1:
            return None
        return ("leaf", token_id(type(node).__name__, vocab), ty), 1
    t = parts[0]
    for p in parts[1:]:
        t = ("node", ty, t, p)
    return t, leaves


def _nested_height(t) -> int:
    if t[0] == "leaf":
        return 0
    return 1 + max(_nested_height(t[2]), _nested_height(t[3]))


def _stdlib_files() -> list[str]:
    root = sysconfig.get_paths()["stdlib"]
    names = [n for n in sorted(os.listdir(root)) if n.endswith(".py")]
    return [os.path.join(root, n) for n in names]


def _stdlib_statements(files: Sequence[str]) -> Iterator[ast.AST]:
    for path in files:
        try:
            with open(path, "rb") as fh:
                source = fh.read()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = ast.parse(source, filename=path)
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(module):
            if isinstance(node, (ast.stmt, ast.expr)):
                yield node


def stdlib_ast_trees(count: int, *, min_leaves: int = 10, max_leaves: int = 60, max_nodes: int | None = None,
                     max_height: int | None = None, vocab: int = 1000, seed: int | None = None,
                     kinds: tuple[type, ...] = (ast.stmt,)) -> list[Tree]:
    """`count` binarized syntax trees of statements from the `.py` modules in
    `sysconfig.get_paths()["stdlib"]` (no download), each with between
    `min_leaves` and `max_leaves` leaves (larger statements are skipped, i.e.
    filtered, not cut) and height at most `max_height` (if given).

    Node type = the AST class id (`AST_TYPES`; binarization nodes keep their
    parent's class); leaf word = a token (identifier, constant, or the class
    name of a childless node such as `Pass` or `Add`) hashed into `[0, vocab)`.
    Files are read in sorted order, or shuffled by `seed`; statements in
    `ast.walk` order (so nested statements are candidates too); exact duplicates
    are skipped. Deterministic for a given Python version and stdlib.
    """
    max_nodes = 2 * max_leaves - 1 if max_nodes is None else max_nodes
    files = _stdlib_files()
    if seed is not None:
        np.random.default_rng(seed).shuffle(files)
    out: list[Tree] = []
    seen: set[bytes] = set()
    for node in _stdlib_statements(files):
        if not isinstance(node, kinds):
            continue
        sub = _binarize(node, vocab, max_leaves)
        if sub is None:
            continue
        nested, leaves = sub
        if leaves < min_leaves or 2 * leaves - 1 > max_nodes:
            continue
        if max_height is not None and _nested_height(nested) > max_height:
            continue
        tree = _encode(nested, max_nodes)
        key = b"".join(np.asarray(a).tobytes() for a in tree)
        if key in seen:            # e.g. many `__all__ = [...]` lists: keep one of each
            continue
        seen.add(key)
        out.append(tree)
        if len(out) == count:
            return out
    raise ValueError(f"only {len(out)} stdlib statements have {min_leaves}..{max_leaves} leaves")


# --------------------------------------------------------------------------
# lattices
# --------------------------------------------------------------------------

def _segmentation(rng: np.random.Generator, n: int, max_word_len: int) -> list[tuple[int, int]]:
    spans, b = [], 0
    while b < n:
        e = min(n, b + int(rng.integers(1, max_word_len + 1)))
        spans.append((b, e))
        b = e
    return spans


def random_lattice(rng: np.random.Generator, n_chars: int, max_len: int, *, char_vocab: int = 100,
                   word_vocab: int = 1000, max_word_len: int = 4, n_segmentations: int = 2) -> Lattice:
    """A lattice over `n_chars` random characters, padded to `max_len`: the
    words are the multi-character spans of `n_segmentations` random
    segmentations (word lengths uniform in 1..max_word_len), deduplicated; a
    word's id hashes its characters into `[0, word_vocab)`."""
    if not 1 <= n_chars <= max_len:
        raise ValueError("need 1 <= n_chars <= max_len")
    chars = -np.ones(max_len, np.int32)
    chars[:n_chars] = rng.integers(char_vocab, size=n_chars)
    spans = set()
    for _ in range(n_segmentations):
        spans.update((b, e) for b, e in _segmentation(rng, n_chars, max_word_len) if e - b >= 2)
    word_start = -np.ones((max_len + 1, n_segmentations), np.int32)
    word_id = -np.ones((max_len + 1, n_segmentations), np.int32)
    fill = np.zeros(max_len + 1, np.int64)
    for b, e in sorted(spans):
        k = fill[e]
        word_start[e, k] = b
        word_id[e, k] = token_id(" ".join(map(str, chars[b:e])), word_vocab)
        fill[e] += 1
    return Lattice(chars, np.int32(n_chars), word_start, word_id)


def random_lattices(count: int, *, seed: int = 0, min_len: int = 5, max_len: int = 20, char_vocab: int = 100,
                    word_vocab: int = 1000, max_word_len: int = 4, n_segmentations: int = 2) -> list[Lattice]:
    """`count` random lattices, lengths uniform in [min_len, max_len], padded to `max_len`."""
    rng = np.random.default_rng(seed)
    return [random_lattice(rng, int(rng.integers(min_len, max_len + 1)), max_len, char_vocab=char_vocab,
                           word_vocab=word_vocab, max_word_len=max_word_len, n_segmentations=n_segmentations)
            for _ in range(count)]


def check_lattice(lat: Lattice, *, max_word_len: int | None = None) -> None:
    """Raise `ValueError` unless `lat` (unbatched) is well formed: chars used
    exactly up to `length`, each word edge b -> e has 0 <= b <= e - 2, e <=
    length, no duplicate edges, and (if given) e - b <= max_word_len."""
    chars, ws, wi = (np.asarray(a) for a in (lat.chars, lat.word_start, lat.word_id))
    n, max_len = int(lat.length), chars.shape[0]
    if not 1 <= n <= max_len or ws.shape[0] != max_len + 1 or ws.shape != wi.shape:
        raise ValueError("bad lattice shapes or length")
    if np.any(chars[:n] < 0) or np.any(chars[n:] != -1):
        raise ValueError("chars not used exactly up to length")
    for e in range(max_len + 1):
        starts = [int(b) for b in ws[e] if b >= 0]
        if np.any((ws[e] < 0) != (wi[e] < 0)):
            raise ValueError(f"position {e}: word_start / word_id padding disagree")
        if len(set(starts)) != len(starts):
            raise ValueError(f"position {e}: duplicate word edges")
        for b in starts:
            if not (0 <= b <= e - 2 and e <= n):
                raise ValueError(f"bad word edge {b} -> {e} (length {n})")
            if max_word_len is not None and e - b > max_word_len:
                raise ValueError(f"word edge {b} -> {e} longer than {max_word_len}")


# --------------------------------------------------------------------------
# chains
# --------------------------------------------------------------------------

def random_chains(count: int, *, seed: int = 0, min_len: int = 5, max_len: int = 30, vocab: int = 1000,
                  n_tags: int = 10) -> list[Chain]:
    """`count` random tagged sentences, lengths uniform in [min_len, max_len], padded to `max_len`."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(min_len, max_len + 1))
        words = -np.ones(max_len, np.int32)
        tags = -np.ones(max_len, np.int32)
        words[:n] = rng.integers(vocab, size=n)
        tags[:n] = rng.integers(n_tags, size=n)
        out.append(Chain(words, tags, np.int32(n)))
    return out


def check_chain(chain: Chain) -> None:
    """Raise `ValueError` unless words/tags are used exactly up to `length`."""
    n = int(chain.length)
    words, tags = np.asarray(chain.words), np.asarray(chain.tags)
    if not 1 <= n <= words.shape[0]:
        raise ValueError("length out of range")
    for name, a in (("words", words), ("tags", tags)):
        if np.any(a[:n] < 0) or np.any(a[n:] != -1):
            raise ValueError(f"{name} not used exactly up to length")
