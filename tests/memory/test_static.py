"""The block-layout pass (`pcbatch.memory.layout_program`, `autobatch(layout=...)`).

Differential throughout: a program with the layout must return what the original
Python returns (`f.reference`), and where the results must be bitwise, what it
returns without (`layout=False`: another compile, which at the same tolerance
would add nothing beside the reference).
Packed matmuls may round differently in the last bit (XLA picks its matmul
kernel by shape; see README, "Block layout"), so those results are compared
with a tolerance of a few float32 ulps; programs whose groups are elementwise
only are compared bit for bit.

Sizes are small (hidden 4-8, batches of 3-5) to keep compile times low, and
recursive models run with `fork=False` (the lane pool's machine takes ten times
longer to compile; it runs the same block code, and tests/models runs the
models, layout on, on it).
"""
from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pcbatch
from pcbatch import _context, data
from pcbatch.memory import LayoutReport, layout_program
from pcbatch.memory.graph import trace_run
from pcbatch.memory.groups import find_groups

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # `benchmarks`
sys.path.insert(0, os.path.join(ROOT, "tests", "core"))  # the core corpus

from benchmarks import layout_cells as cells  # noqa: E402

H = 6
RTOL, ATOL = 2e-6, 1e-6  # a few ulps: packed matmuls may round differently


def leaves(x):
    return [np.asarray(a) for a in jax.tree_util.tree_leaves(x)]


def assert_close(a, b, exact=False):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.shape == y.shape and x.dtype == y.dtype
        if exact:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL)


def check_layout(f, *args, exact=False):
    """f (layout on) == f.reference, and bitwise == f with layout=False where `exact`;
    returns f's report."""
    on = f(*args)
    if exact:
        assert_close(on, f.with_options(layout=False)(*args), exact)
    assert_close(on, f.reference(*args))  # the reference runs op by op: a few ulps
    return f.layout_report(*args)


def batched_prims(prog):
    return [op for b in prog.blocks for op in b.ops if getattr(op, "text", "").startswith("batched(")]


def jaxpr_of(prog, prim):
    return jax.make_jaxpr(prim.fn)(*(prog.var_types[v] for v in prim.ins))


def primitives(jaxpr) -> list[str]:
    return [e.primitive.name for e in jaxpr.eqns]


def np_params(init, *args, seed=0, scale=0.5):
    """Random parameters with `init`'s structure, drawn with NumPy (jax.random
    would compile a kernel per shape)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda key: init(key, *args), jax.random.PRNGKey(0))
    return jax.tree_util.tree_map(lambda s: (scale * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


def cell_args(cell, batch=4, hidden=H, seed=0):
    rng = np.random.default_rng(seed + 1)
    params = np_params(cell.init, hidden, seed=seed)
    xs = [rng.standard_normal((batch, hidden) if k == "v" else (batch, hidden, hidden)).astype(np.float32) / 2
          for k in cell.inputs]
    steps = np.arange(batch, dtype=np.int32) % 3  # 0, 1 or 2 steps: lanes disagree
    return params, *xs, steps


# ------------------------------------------------------------------ the LSTM cell
LSTM = cells.CELLS[0]


def test_lstm_cell_groups_layout_and_packs():
    f = cells.step_program(LSTM)
    args = cell_args(LSTM)
    report = check_layout(f, *args)
    assert isinstance(report, LayoutReport) and report.applied
    (blk,) = report.rewritten
    kept = [(g.primitive, len(g.members)) for g in blk.kept]
    # W_g @ x and U_g @ h (4 each), the two adds, the three sigmoids (tanh is alone).
    assert kept == [("dot_general", 4), ("dot_general", 4), ("add", 4), ("add", 4), ("logistic", 3)]
    assert [p.shape for p in blk.packs] == [(4 * H, H), (4 * H, H), (4 * H,)]
    # Alignment: the three packs (W, U, b) list the gates in one order, and the
    # sigmoid gates i, f, o are contiguous in it: one logistic reads one slice.
    gate_orders = {tuple(m.rpartition("_")[2] for m in p.members) for p in blk.packs}
    assert len(gate_orders) == 1
    (order,) = gate_orders
    assert sorted(order) == ["f", "i", "o", "u"] and order[0] == "u" or order[-1] == "u"
    assert any("lstm_cell" in line for line in blk.kept[0].lines)  # the source lines inside the helper
    text = str(report)
    assert "PQ-tree:" in text and "order:" in text and "packed before the loop" in text and "planning" in text


def test_weights_are_packed_once_before_the_loop():
    args = cell_args(LSTM)
    prog = cells.step_program(LSTM).lowered(*args)
    plain = cells.step_program(LSTM, layout=False).lowered(*args)
    assert len(prog.prelude) == len(plain.prelude) + 3
    (prim,) = batched_prims(prog)
    ops = primitives(jaxpr_of(prog, prim))
    assert ops.count("dot_general") == 2 and "concatenate" not in ops
    # The gather baseline copies the weights into place inside the block, every step.
    with _context.in_building():
        gathered, _ = layout_program(plain, "gather")
    (prim,) = batched_prims(gathered)
    assert primitives(jaxpr_of(gathered, prim)).count("concatenate") >= 3
    assert len(gathered.prelude) == len(plain.prelude)


def test_options_and_report_without_layout():
    args = cell_args(LSTM)
    off = cells.step_program(LSTM, layout=False)
    assert not batched_prims(off.lowered(*args))
    report = off.layout_report(*args)
    assert not report.applied and "not applied" in str(report) and report.rewritten
    assert cells.step_program(LSTM).with_options(layout=False).layout is False
    with pytest.raises(ValueError, match="layout"):
        pcbatch.autobatch(cells.lstm_step, layout="yes")
    with pytest.raises(ValueError, match="mode"):
        layout_program(off.lowered(*args), "fast")


# ------------------------------------------------------------------ every cell of Table 2
@pytest.mark.parametrize("cell", cells.CELLS, ids=[c.name for c in cells.CELLS])
def test_cells_match_without_layout_and_reference(cell):
    f = cells.step_program(cell)
    report = check_layout(f, *cell_args(cell, batch=3, hidden=4))
    # Every cell but the MV cell has independent gate matmuls on one input.
    assert bool(report.rewritten) == (cell.name != "MVCell")


def test_tree_lstm_end_to_end_fork_join():
    params = np_params(cells.tree_lstm_params, 20, H)
    trees = data.batch(data.random_binary_trees(5, seed=2, min_leaves=1, max_leaves=9, max_nodes=17, vocab=20))
    report = check_layout(cells.tree_lstm.with_options(fork=False), params, trees, trees.root)
    labels = [b.label for b in report.rewritten]
    assert any("then" in lab for lab in labels) and any("join" in lab for lab in labels)  # leaf and internal cells


# ------------------------------------------------------------------ models and the core corpus
def test_models_match_without_layout():
    from pcbatch.models import bilstm_tagger, child_sum, lattice_lstm, mv_rnn, nary, tree_gru, tree_lstm_2type

    trees = data.batch(data.random_binary_trees(4, seed=1, min_leaves=1, max_leaves=8, max_nodes=15, vocab=30,
                                                n_types=2))
    rewritten = {}
    for mod, fn in [(child_sum, child_sum.child_sum_tree_lstm), (nary, nary.nary_tree_lstm),
                    (tree_gru, tree_gru.tree_gru), (mv_rnn, mv_rnn.mv_rnn),
                    (tree_lstm_2type, tree_lstm_2type.tree_lstm_2type)]:
        params = np_params(mod.init_params, 30, 4)
        report = fn.layout_report(params, trees, trees.root)
        rewritten[fn.__name__] = bool(report.rewritten)
        if report.rewritten:
            f, args = fn.with_options(fork=False), (params, trees, trees.root)
            assert_close(f(*args), f.with_options(layout=False)(*args))
        else:  # nothing batched: the very same program runs
            assert not batched_prims(fn.lowered(params, trees, trees.root))
    chains = data.batch(data.random_chains(3, seed=5, min_len=1, max_len=5, vocab=30, n_tags=3))
    bp = np_params(lambda k: bilstm_tagger.init_params(k, 30, 4, n_tags=3))
    lats = data.batch(data.random_lattices(3, seed=3, min_len=1, max_len=5, char_vocab=10, word_vocab=30,
                                           n_segmentations=2))
    lp = np_params(lattice_lstm.init_params, 10, 30, 4)
    for fn, args in [(bilstm_tagger.bilstm_tagger, (bp, chains)), (lattice_lstm.lattice_lstm, (lp, lats)),
                     (lattice_lstm.lattice_lstm_at, (lp, lats, lats.length))]:
        rewritten[fn.__name__] = bool(fn.layout_report(*args).rewritten)
        assert not batched_prims(fn.lowered(*args))
    # The zoo packs its gates by hand already; only tree_gru's [W; W_h] @ x is left to batch.
    assert {k for k, v in rewritten.items() if v} == {"tree_gru"}


def test_core_corpus_has_nothing_to_batch():
    from corpus import CASES

    for case in CASES:
        args = case.args(case.batch(3))
        prog = case.fn.with_options(layout=False).lowered(*args)
        with _context.in_building():
            new, report = layout_program(prog, "all")
        # Scalar control code: no group, so the program is returned as is and the
        # results with and without layout are the same by construction.
        assert new is prog and not report.rewritten, case.name


# ------------------------------------------------------------------ shapes and operand kinds
G1 = np.linspace(-1.0, 1.0, 4 * 3, dtype=np.float32).reshape(4, 3)  # closed over: a literal
G2 = np.cos(np.arange(12, dtype=np.float32)).reshape(4, 3)


@pcbatch.autobatch(in_axes=(None, 0, 0))
def mixed_kinds(p, x, n):
    """Unequal members, a derived constant, closed-over constants, literal and
    scalar operands, matrix members, a right-hand weight, a shared bias."""
    s = jnp.sum(x)
    for _ in range(n):
        a = jnp.tanh(p["A"] @ x + 1.0)                    # [4]
        b = jnp.tanh(p["B"] @ x + 2.0)                    # [5]: unequal sizes, literal 1.0 vs 2.0
        c = jnp.tanh((2.0 * p["C"]) @ x)                  # derived constant, packed before the loop
        d = G1 @ x * s                                    # closed-over weights, scalar operand
        e = G2 @ x * s
        m1 = p["M"] @ jnp.outer(x, x)                     # [4, 3] members
        m2 = p["N"] @ jnp.outer(x, x)
        r1 = x @ p["R"]                                   # weight on the right: packed along axis 1
        r2 = x @ p["S"]
        x = (jnp.concatenate([a, b])[:3] + c[:3] + d[:3] + e[:3] + m1[0] + m2[1] + r1 + r2) / 8.0
    return x


def mixed_params(seed=0):
    rng = np.random.default_rng(seed)
    shapes = {"A": (4, 3), "B": (5, 3), "C": (4, 3), "M": (4, 3), "N": (4, 3), "R": (3, 3), "S": (3, 3)}
    return {name: (rng.standard_normal(s) / 2).astype(np.float32) for name, s in shapes.items()}


def test_operand_kinds():
    p = mixed_params()
    x = np.random.default_rng(9).standard_normal((5, 3)).astype(np.float32)
    n = np.array([0, 1, 2, 3, 1], np.int32)
    report = check_layout(mixed_kinds, p, x, n)
    (blk,) = report.rewritten
    dots = sorted(len(g.members) for g in blk.kept if g.primitive == "dot_general")
    assert dots == [2, 2, 5]  # {A, B, 2C, G1, G2} (all @ x), {M, N}, {R, S}
    shapes = sorted(p_.shape for p_ in blk.packs)
    assert (21, 3) in shapes and (8, 3) in shapes and (3, 6) in shapes
    text = str(blk)
    assert "literals, packed" in text and "slice of G" in text


@pcbatch.autobatch(in_axes=(None, 0, 0), layout="all")
def elementwise_only(p, x, n):
    """Groups without a matmul: scalar times packed constants (mode "all")."""
    for _ in range(n):
        s = jnp.sum(x) / 4.0
        a = jnp.sin(s * p["a"] + 1.0)
        b = jnp.sin(s * p["b"] + 2.0)
        x = x + a - b
    return x


def test_elementwise_groups_are_bitwise_and_only_in_mode_all():
    p = {"a": np.linspace(0, 1, 4, dtype=np.float32), "b": np.linspace(1, 2, 4, dtype=np.float32)}
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    n = np.array([2, 0, 3], np.int32)
    report = check_layout(elementwise_only, p, x, n, exact=True)
    assert [(g.primitive, len(g.members)) for g in report.rewritten[0].kept] == [
        ("mul", 2), ("add", 2), ("sin", 2)]
    auto = elementwise_only.with_options(layout=True)
    (blk,) = auto.layout_report(p, x, n)
    assert not blk.rewritten and "no matmul group" in blk.reason


@pcbatch.autobatch(in_axes=(None, 0, 0))
def conflicting(p, x, n):
    for _ in range(n):
        a = p["A"] @ x
        b = p["B"] @ x
        x = jnp.tanh(a * b + 1.0) + jnp.tanh(b * a + 2.0) + jnp.tanh(a)
    return x


def test_conflicting_alignment_drops_the_group():
    # (a*b, b*a): one batched multiply would need a before b and b before a.
    p = {"A": np.eye(3, dtype=np.float32) / 2, "B": np.ones((3, 3), np.float32) / 3}
    x = np.random.default_rng(2).standard_normal((3, 3)).astype(np.float32)
    report = check_layout(conflicting, p, x, np.array([1, 0, 2], np.int32))
    (blk,) = report.rewritten
    status = {g.primitive: g.status for g in blk.groups}
    assert status["dot_general"] == "kept"
    assert status["mul"].startswith("dropped: its operands cannot")
    assert status["add"].startswith("dropped: reads G")  # it read the dropped product


# ------------------------------------------------------------------ property: random cells
GATES = ["sigmoid", "tanh", "none"]


def random_cell(spec):
    """A cell from `spec`: each gate is act(sum of W @ input terms + bias + literal)."""
    def cell(p, xs):
        outs = []
        for g, (act, terms, lit, bias) in enumerate(spec["gates"]):
            z = lit
            for k, inp in terms:
                z = z + p[f"W{g}_{k}"] @ xs[inp]
            if bias:
                z = z + p[f"b{g}"]
            outs.append(jax.nn.sigmoid(z) if act == "sigmoid" else jnp.tanh(z) if act == "tanh" else z)
        mix = outs[0]
        for o in outs[1:]:
            mix = mix * 0.5 + o
        return mix
    return cell


SPEC: dict = {}


def spec_cell(p, xs):
    return random_cell(SPEC)(p, xs)


def spec_step(p, x0, x1, n):
    for _ in range(n):
        x0 = spec_cell(p, (x0, x1))
    return x0


@st.composite
def specs(draw):
    gates = []
    for _ in range(draw(st.integers(2, 5))):
        terms = draw(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=2, unique=True))
        gates.append((draw(st.sampled_from(GATES)), terms, draw(st.sampled_from([0.0, 0.5, 1.0])),
                      draw(st.booleans())))
    return {"gates": gates}


@settings(max_examples=8, deadline=None, database=None)
@given(specs())
def test_random_cells_match(spec):
    SPEC.clear()
    SPEC.update(spec)
    f = pcbatch.autobatch(spec_step, in_axes=(None, 0, 0, 0))
    rng = np.random.default_rng(len(str(spec)))
    p = {}
    for g, (_, terms, _, _) in enumerate(spec["gates"]):
        for k, _ in terms:
            p[f"W{g}_{k}"] = (rng.standard_normal((4, 4)) / 2).astype(np.float32)
        p[f"b{g}"] = rng.standard_normal(4).astype(np.float32)
    x0, x1 = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    n = np.array([1, 2, 0], np.int32)
    report = check_layout(f, p, x0, x1, n)
    for blk in report.rewritten:  # every kept group reads its operands without copies
        prog = f.lowered(p, x0, x1, n)
        for prim in batched_prims(prog):
            assert "concatenate" not in primitives(jaxpr_of(prog, prim))
        assert all(g.kept or g.status.startswith("dropped") for g in blk.groups)


# ------------------------------------------------------------------ graph and groups
def test_graph_inlines_calls_and_merges_duplicates():
    args = cell_args(LSTM)
    prog = cells.step_program(LSTM, layout=False).lowered(*args)
    b = cells.cell_block(prog)
    run = [op for op in prog.blocks[b].ops if hasattr(op, "fn")]
    g = trace_run(run, prog.var_types, prog.var_class)
    prims = [n.primitive for n in g.nodes]
    assert "jit" not in prims and "pjit" not in prims  # jax.nn.sigmoid inlined
    assert prims.count("dot_general") == 8 and prims.count("logistic") == 3
    assert {"lstm_step.p", "lstm_step.x", "lstm_step.h", "lstm_step.c"} <= set(g.inputs)
    groups = find_groups(g)
    assert [grp.depth for grp in groups] == sorted(grp.depth for grp in groups)


def test_constants_closed_over_from_the_callers_jit():
    """A jitted gradient closing over the caller's jit arguments (a log density over the
    user's data, as NUTS calls it) inside a recursive program: the graph keyed, typed and
    packed the traced constants as NumPy arrays (TracerArrayConversionError)."""
    @jax.jit
    def run(data, rate, x):
        grad = jax.jit(jax.grad(lambda x: -0.5 * jnp.sum((x - data) ** 2)))

        @pcbatch.autobatch(layout="all")
        def descend(x, n):
            if n <= 0:
                return x
            return descend(x * (1.0 - rate) + (grad(x) + x) * 0.1, n - 1)
        return descend(x, jnp.array([3, 4]))
    out = run(jnp.array([1.0, 2.0]), jnp.float32(0.1), jnp.zeros((2, 2)))
    np.testing.assert_allclose(out, [[1 - 0.9 ** 3, 2 * (1 - 0.9 ** 3)], [1 - 0.9 ** 4, 2 * (1 - 0.9 ** 4)]],
                               rtol=1e-5)


# ------------------------------------------------------------------ drawings of a report
def test_viz_draws_a_report_block():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import pcbatch.viz as viz

    blk = cells.step_program(LSTM).layout_report(*cell_args(LSTM))[0]
    fig = viz.pq_tree(blk)
    leaves = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "leaf"]
    assert sorted(leaves) == sorted(map(str, blk.layout.order))
    fig = viz.layout_before_after(blk)
    after = [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "after"]
    assert after == list(map(str, blk.layout.order))


def test_docstring_examples():
    import doctest

    import pcbatch.memory.layout
    import pcbatch.memory.pqtree
    import pcbatch.memory.report
    import pcbatch.memory.static

    for mod in (pcbatch.memory.pqtree, pcbatch.memory.layout, pcbatch.memory.report, pcbatch.memory.static):
        failures, tried = doctest.testmod(mod)
        assert failures == 0 and tried > 0, mod.__name__
