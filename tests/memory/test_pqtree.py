"""PQ-tree tests: examples plus a brute-force property test over all permutations."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcbatch.memory import PQTree


def consecutive(order, subset) -> bool:
    pos = [i for i, v in enumerate(order) if v in subset]
    return not pos or pos[-1] - pos[0] + 1 == len(pos)


def check_shape(tree: PQTree) -> None:
    """Proper PQ-tree: P-nodes >= 2 children, Q-nodes >= 3, each leaf once."""
    for node in tree.nodes():
        if node.kind == "P":
            assert len(node.children) >= 2, str(tree)
        elif node.kind == "Q":
            assert len(node.children) >= 3, str(tree)
        else:
            assert node.kind == "leaf" and not node.children
    assert sorted(tree.frontier(), key=repr) == sorted(tree.universe, key=repr)


def brute(leaves, subsets) -> set:
    """Every permutation of ``leaves`` keeping each subset consecutive."""
    return {p for p in itertools.permutations(leaves) if all(consecutive(p, s) for s in subsets)}


def orders_of(tree: PQTree) -> set:
    orders = list(tree.orders())
    assert len(orders) == len(set(orders)), "orders() repeated an order"
    return set(orders)


# ------------------------------------------------------------------ examples
def test_fresh_tree_admits_everything():
    t = PQTree("abcd")
    assert str(t) == "(a b c d)"
    assert t.root.kind == "P" and [c.value for c in t.root.children] == list("abcd")
    assert orders_of(t) == set(itertools.permutations("abcd"))
    assert t.frontier() == list("abcd")


def test_tiny_trees():
    assert list(PQTree([]).orders()) == [()]
    one = PQTree(["x"])
    assert one.reduce(["x"]) and list(one.orders()) == [("x",)] and str(one) == "x"


def test_chain_of_pairs_makes_a_q_node():
    t = PQTree("abcde")
    for s in ("ab", "bc", "cd"):
        assert t.reduce(s)
    assert str(t) == "(e [a b c d])"
    assert orders_of(t) == brute("abcde", ["ab", "bc", "cd"])


@pytest.mark.parametrize(
    "leaves, subsets, expected",
    [
        ("abcdef", ["ab"], "(c d e f (a b))"),  # P2
        ("abcdef", ["ab", "cd", "bc"], "(e f [a b c d])"),  # P3 twice, then P6
        ("abcdefg", ["abc", "ab", "cd"], "(e f g [(a b) c d])"),  # P3, then P4
        ("abcdef", ["abcd", "ab", "be"], "(f [(c d) a b e])"),  # P3, P5, then P4
        ("abcdef", ["abcd", "ab", "bc", "de"], "(f [[a b c] d e])"),  # Q2 below a P4 root
        ("abcdef", ["ab", "de", "abc", "cde", "bcd"], "(f [a b c d e])"),  # Q3, two partial ends
    ],
)
def test_templates(leaves, subsets, expected):
    t = PQTree(leaves)
    assert all(t.reduce(s) for s in subsets)
    assert str(t) == expected
    check_shape(t)
    assert orders_of(t) == brute(leaves, subsets)


def test_paper_figure_4a():
    xs = [f"x{i}" for i in range(1, 9)]
    cons = [{"x4", "x5"}, {"x1", "x3"}, {"x2", "x1"}, {"x8", "x6", "x7"}, {"x3", "x4", "x5"}]
    t = PQTree(xs)
    assert all(t.reduce(c) for c in cons)
    # One P-node over {x6, x7, x8}; Q2 = (x2, x1, x3, Q3 = (x4, x5)) as in the paper.
    assert str(t) == "((x6 x7 x8) [x2 x1 x3 (x4 x5)])"
    assert orders_of(t) == brute(xs, cons)


def test_infeasible_reduce_leaves_tree_unchanged():
    t = PQTree("abcd")
    assert t.reduce("ab") and t.reduce("bc")
    before = str(t)
    assert not t.reduce("ac")
    assert str(t) == before
    assert not t.reduce("bd")  # b sits in the middle of [a b c]
    assert str(t) == before


def test_implies_and_copy_are_independent():
    t = PQTree("abcd")
    t.reduce("abc")
    assert t.implies("abc") and t.implies("abcd") and t.implies("a") and not t.implies("ab")
    c = t.copy()
    assert c.reduce("ab")
    assert str(t) == "(d (a b c))" and str(c) == "(d (c (a b)))"


def test_unknown_leaf_raises():
    with pytest.raises(ValueError):
        PQTree("ab").reduce("az")
    with pytest.raises(ValueError):
        PQTree("aa")


# ------------------------------------------------------------------ property
@st.composite
def families(draw, min_n: int, max_n: int):
    """Leaves and a sequence of subsets: intervals of one hidden order (long
    feasible runs, deep trees with Q-nodes), intervals of a second order and
    arbitrary sets (conflicts, so reduce also fails)."""
    n = draw(st.integers(min_n, max_n))
    leaves = [f"v{i}" for i in range(n)]
    hidden = draw(st.permutations(leaves))
    other = draw(st.permutations(leaves))

    def intervals(order, longest=n):
        return st.tuples(st.integers(0, max(0, n - 2)), st.integers(2, max(2, longest))).map(
            lambda il: frozenset(order[il[0] : il[0] + il[1]])
        )

    anyset = st.frozensets(st.sampled_from(leaves), min_size=min(2, n), max_size=max(2, n - 1))
    short = intervals(hidden, 3)
    pick = st.one_of(short, intervals(hidden), intervals(hidden), intervals(other), anyset)
    subsets = draw(st.lists(pick, max_size=12))
    return leaves, subsets


def run_against_brute_force(leaves, subsets):
    tree = PQTree(leaves)
    feasible = set(itertools.permutations(leaves))
    for s in subsets:
        keeping = {p for p in feasible if consecutive(p, s)}
        assert tree.implies(s) == (keeping == feasible)
        before = str(tree)
        accepted = tree.reduce(s)
        # False exactly when no order satisfies the accepted subsets plus s.
        assert accepted == bool(keeping), (before, sorted(s))
        if accepted:
            feasible = keeping
        else:
            assert str(tree) == before
        check_shape(tree)
    # Sound and complete: the tree's orders are exactly the brute-force ones.
    assert orders_of(tree) == feasible
    assert tuple(tree.frontier()) in feasible


@settings(max_examples=300, deadline=None, database=None)
@given(families(1, 6))
def test_reduce_matches_brute_force_small(fam):
    run_against_brute_force(*fam)


@settings(max_examples=60, deadline=None, database=None)
@given(families(7, 8))
def test_reduce_matches_brute_force_8(fam):
    run_against_brute_force(*fam)
