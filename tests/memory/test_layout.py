"""Layout tests: the paper's Figure 3/4 example, edge cases, and a brute-force
check of the greedy batch selection."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pcbatch.memory import PQTree, batch_from_ops, plan_layout

X = [f"x{i}" for i in range(1, 9)]
# Figure 3: B1 computes x4 = α(x1, x2), x5 = α(x3, x1); B2 computes
# x8 = σ(x3), x6 = σ(x4), x7 = σ(x5).  Groups: result first, then sources.
B1 = batch_from_ops([("x4", "x1", "x2"), ("x5", "x3", "x1")])
B2 = batch_from_ops([("x8", "x3"), ("x6", "x4"), ("x7", "x5")])


def tied(batch):
    k = len(batch[0]) if batch else 0
    return [g for g in batch if k >= 2 and len(set(g)) == k]


def honours(order, batch) -> bool:
    """Brute-force definition: every tied group contiguous, all in one op order."""
    pos = {v: i for i, v in enumerate(order)}
    op_orders = set()
    for g in tied(batch):
        p = [pos[v] for v in g]
        if max(p) - min(p) + 1 != len(g):
            return False
        op_orders.add(tuple(sorted(range(len(g)), key=p.__getitem__)))
    return len(op_orders) <= 1


def greedy_brute_force(variables, batches):
    feasible = list(itertools.permutations(variables))
    honoured = []
    for n, b in enumerate(batches):
        keep = [p for p in feasible if honours(p, b)]
        if keep:
            feasible, honoured = keep, honoured + [n]
    return honoured, set(feasible)


def check_placements(res, batches):
    """Slices, read from the result alone, are where the variables really are."""
    assert sorted(res.honoured + res.dropped) == list(range(len(batches)))
    for n in res.honoured:
        pl = res.placements[n]
        for g, s in zip(batches[n], pl.slices):
            if g not in tied(batches[n]) and len(g) != 1:
                assert s is None
                continue
            assert res.order[s.start : s.start + s.count] == [g[i] for i in pl.op_order]
            assert s.offset == res.offsets[res.order[s.start]]
            assert s.length == sum(res.sizes[v] for v in g)


# ------------------------------------------------------------------ paper
def test_figure_4_constraints_are_as_in_the_paper():
    # Sanity of the encoding: the paper's layout honours both batches,
    # the label order honours neither.
    assert honours(("x2", "x1", "x3", "x4", "x5", "x8", "x6", "x7"), B1)
    assert honours(("x2", "x1", "x3", "x4", "x5", "x8", "x6", "x7"), B2)
    assert not honours(X, B1) and not honours(X, B2)


def test_figure_4_layout():
    res = plan_layout(X, [B1, B2])
    assert res.honoured == [0, 1] and res.dropped == []
    _, aligned = greedy_brute_force(X, [B1, B2])
    assert tuple(res.order) in aligned
    check_placements(res, [B1, B2])
    # BroadcastConstraint added exactly {x6, x7} (P1 -> Q5 = (Q4 = (x6, x7), x8)).
    adjacency = [set(g) for g in B1 + B2] + [{"x6", "x7"}]
    expected = {p for p in itertools.permutations(X) if all(_consecutive(p, s) for s in adjacency)}
    assert set(res.tree.orders()) == expected
    assert str(res.tree) == "((x8 (x6 x7)) [x2 x1 x3 (x4 x5)])"
    # Both batches' slices: B2 result x8 x6 x7 sits right where B2 reads x3 x4 x5 in order.
    b2 = res.placements[1]
    assert [res.order[s.start : s.start + 3] for s in b2.slices] == [
        [("x8", "x6", "x7")[i] for i in b2.op_order],
        [("x3", "x4", "x5")[i] for i in b2.op_order],
    ]


def _consecutive(order, s):
    p = [i for i, v in enumerate(order) if v in s]
    return p[-1] - p[0] + 1 == len(p)


# ------------------------------------------------------------------ cases
def test_contradictory_alignment_is_dropped_greedily():
    a_b_c_d = [("a", "b"), ("c", "d")]
    a_b_d_c = [("a", "b"), ("d", "c")]
    self_contradiction = [("e", "f"), ("f", "e")]
    fine = [("e", "f"), ("g", "h")]
    batches = [a_b_c_d, self_contradiction, a_b_d_c, fine]
    res = plan_layout("abcdefgh", batches)
    assert res.honoured == [0, 3] and res.dropped == [1, 2]
    check_placements(res, batches)
    assert tuple(res.order) in greedy_brute_force("abcdefgh", batches)[1]


def test_adjacency_conflict_drops_the_later_batch():
    batches = [[("a", "b")], [("b", "c")], [("a", "c")], [("c", "d")]]
    res = plan_layout("abcd", batches)
    assert res.honoured == [0, 1, 3] and res.dropped == [2]
    assert "".join(res.order) in {"abcd", "dcba"}


def test_lstm_gates_shared_input_and_sizes():
    # Four gate matmuls W_g @ x: weights and outputs become aligned slices,
    # the shared x is a broadcast operand and gets no slice.
    ops = [(f"h_{g}", f"W_{g}", "x") for g in "ifgo"]
    variables = ["x"] + [f"W_{g}" for g in "ifgo"] + [f"h_{g}" for g in "ifgo"]
    sizes = {v: (12 if v.startswith("W") else 3 if v.startswith("h") else 4) for v in variables}
    mix = [("h_f", "h_i"), ("W_f", "W_i")]  # same op order as the gates: fine
    clash = [("h_i", "h_f"), ("W_f", "W_i")]  # opposite op order: must be dropped
    batches = [batch_from_ops(ops), mix, clash]
    res = plan_layout(variables, batches, sizes)
    assert res.honoured == [0, 1] and res.dropped == [2]
    check_placements(res, batches)
    out, w, x = res.placements[0].slices
    assert x is None
    assert (out.count, out.stride, out.length) == (4, 3, 12) and (w.stride, w.length) == (12, 48)
    # Packed offsets follow the order.
    starts = itertools.accumulate([0] + [sizes[v] for v in res.order[:-1]])
    assert [res.offsets[v] for v in res.order] == list(starts)
    assert res.total_size == sum(sizes.values())
    # mix also needs {h_i, h_f} and {W_i, W_f} adjacent.
    assert honours(res.order, mix) and not honours(res.order, clash)


def test_mixed_sizes_have_no_stride():
    res = plan_layout("abc", [[("a", "b")]], sizes={"a": 2, "b": 3})
    (s,) = res.placements[0].slices
    assert s.stride is None and s.length == 5


def test_bad_input():
    with pytest.raises(ValueError):
        plan_layout("ab", [[("a", "b"), ("a",)]])
    with pytest.raises(ValueError):
        plan_layout("ab", [[("a", "z")]])


def test_result_prints():
    text = str(plan_layout(X, [B1, B2, [("x1", "x2"), ("x2", "x1")]]))
    assert "order:" in text and "dropped batches: [2]" in text and "[x2 x1 x3 (x4 x5)]" in text


def test_pqtree_is_exported():
    assert isinstance(plan_layout("ab", []).tree, PQTree)


# ------------------------------------------------------------------ property
@st.composite
def problems(draw, max_n: int = 6):
    n = draw(st.integers(3, max_n))
    variables = [f"v{i}" for i in range(n)]
    hidden = draw(st.permutations(variables))

    def batch(draw_):
        k = draw_(st.sampled_from([1, 2, 2, 3, 3]))
        m = draw_(st.integers(1, 3))
        groups = []
        for _ in range(m):
            kind = draw_(st.sampled_from(["random", "random", "aligned", "broadcast"]))
            if kind == "broadcast":
                groups.append((draw_(st.sampled_from(variables)),) * k)
            elif kind == "aligned":  # a run of the hidden order: often honourable
                start = draw_(st.integers(0, n - k))
                groups.append(tuple(hidden[start : start + k]))
            else:
                groups.append(tuple(draw_(st.permutations(variables))[:k]))
        return groups

    batches = [batch(draw) for _ in range(draw(st.integers(1, 6)))]
    return variables, batches


@settings(max_examples=500, deadline=None, database=None)
@given(problems())
def test_greedy_layout_matches_brute_force(problem):
    variables, batches = problem
    res = plan_layout(variables, batches)
    honoured, feasible = greedy_brute_force(variables, batches)
    # Exact: a batch is dropped iff no order honours it with those accepted before.
    assert res.honoured == honoured
    assert tuple(res.order) in feasible
    assert all(honours(res.order, batches[n]) for n in res.honoured)
    check_placements(res, batches)


# ------------------------------------------------------- decided node orders
def _orders_with_choices(node):
    """Every order below `node`, each with the choice made at every internal
    node (a P-node: which child at each position; a Q-node: (0, 1) or (1, 0))."""
    if node.kind == "leaf":
        yield (node.value,), {}
        return
    subs = [list(_orders_with_choices(c)) for c in node.children]
    n = len(subs)
    if node.kind == "P":
        arrangements = [(p, p) for p in itertools.permutations(range(n))]
    else:
        arrangements = [(tuple(range(n)), (0, 1)), (tuple(range(n - 1, -1, -1)), (1, 0))]
    for arrangement, choice in arrangements:
        for parts in itertools.product(*(subs[i] for i in arrangement)):
            choices = {id(node): (node, choice)}
            for _, ch in parts:
                choices.update(ch)
            yield tuple(itertools.chain.from_iterable(o for o, _ in parts)), choices


def decided_orders(res, batches):
    """The orders of the final tree whose node choices satisfy the union-find's
    equalities (order(n) = t o order(root of n)): what DecideNodesOrder allows."""
    from pcbatch.memory.layout import _decide_orders, _normalise

    norm = _normalise(batches, set(res.order))
    uf = _decide_orders(res.tree, [norm[n] for n in res.honoured])
    out = set()
    for order, choices in _orders_with_choices(res.tree.root):
        ok = True
        for node, choice in choices.values():
            root, t = uf.find(node)
            if root is not node:
                root_choice = choices[id(root)][1]
                ok &= choice == tuple(t[i] for i in root_choice)
        if ok:
            out.add(order)
    return out


def test_figure_4_decided_orders_are_exactly_the_aligned_ones():
    # Q-node directions tied across the batches (the paper's <Q2,<-> <=> <Q5,->)
    # and P-node permutations: exactly the orders honouring B1 and B2.
    res = plan_layout(X, [B1, B2])
    _, aligned = greedy_brute_force(X, [B1, B2])
    assert decided_orders(res, [B1, B2]) == aligned
    assert ("x2", "x1", "x3", "x4", "x5", "x8", "x6", "x7") in aligned  # the paper's layout


@settings(max_examples=150, deadline=None, database=None)
@given(problems(max_n=6))
def test_decided_orders_match_brute_force(problem):
    variables, batches = problem
    res = plan_layout(variables, batches)
    _, feasible = greedy_brute_force(variables, batches)
    assert decided_orders(res, batches) == feasible
