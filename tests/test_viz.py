"""pcbatch.viz: every plot on a small real input, checked on what it drew."""
import doctest
import io
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import pcbatch  # noqa: E402
import pcbatch.fsm as fsm  # noqa: E402
import pcbatch.viz as viz  # noqa: E402
from pcbatch.memory import PQTree, plan_layout  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


@pcbatch.autobatch(fork=False)  # fsm.record models one chain of blocks per example
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


X = jnp.array([3, 7, 4, 5, 1, 6])


@pytest.fixture(scope="module")
def graph():
    return fsm.record(fib, X)


@pytest.fixture(scope="module")
def names():
    return viz.block_labels(fib.lowered(X))


@pytest.fixture(scope="module")
def policy():
    return fsm.learn(fib, X, trials=10, seed=0, progress=False)  # a drawing needs states, not a good policy


def render(fig):
    """Draw the figure for real (errors in artists only show up here)."""
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getvalue()[:4] == b"\x89PNG"


def legend_texts(ax):
    legend = ax.get_legend()
    return [] if legend is None else [t.get_text() for t in legend.get_texts()]


def lane_by_lane_frontier(graph, types):
    """Independent oracle for chain graphs: walk each lane's block list."""
    ptr = np.diff(graph.parent_ptr)
    starts = np.flatnonzero(ptr == 0)
    ends = list(starts[1:]) + [graph.num_nodes]
    chains = [graph.node_type[a:b].tolist() for a, b in zip(starts, ends)]
    at = [0] * len(chains)
    out = []
    for t in types:
        out.append(len({c[i] for c, i in zip(chains, at) if i < len(c)}))
        for k, c in enumerate(chains):
            if at[k] < len(c) and c[at[k]] == t:
                at[k] += 1
    assert all(i == len(c) for c, i in zip(chains, at))
    return out


def test_block_labels_name_every_block():
    prog = fib.lowered(X)
    labels = viz.block_labels(prog)
    assert len(labels) == prog.num_blocks
    assert labels[0] == "b0 fib.entry" and all(l.startswith(f"b{i} ") for i, l in enumerate(labels))


@pytest.mark.parametrize("name", ["earliest", "depth", "agenda"])
def test_gantt_has_one_bar_per_step_in_the_block_row(graph, names, name):
    schedule = fsm.simulate(graph, fsm.get_scheduler(name))
    fig = viz.schedule_gantt(schedule, names)
    render(fig)
    (ax,) = fig.axes
    bars = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(bars) == schedule.steps
    xs = np.array([b.get_x() for b in bars])
    centres = np.array([b.get_y() + b.get_height() / 2 for b in bars])
    np.testing.assert_allclose(xs, np.arange(schedule.steps))
    np.testing.assert_allclose(centres, schedule.types)
    # Height grows with the lanes run; a full step is the tallest bar.
    heights = np.array([b.get_height() for b in bars])
    order = np.argsort(schedule.sizes, kind="stable")
    assert np.all(np.diff(heights[order]) >= -1e-12)
    assert heights[np.argmax(schedule.sizes)] == pytest.approx(heights.max())
    assert legend_texts(ax) == [names[b] for b in sorted(set(schedule.types.tolist()))]
    assert ax.get_xlabel() == "VM step" and ax.get_ylabel() == "block"
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"b{b}" for b in range(len(names))]
    assert str(schedule.steps) in ax.get_title()


def test_gantt_colour_is_the_block_colour(graph):
    schedule = fsm.simulate(graph, fsm.get_scheduler("earliest"))
    fig = viz.schedule_gantt(schedule)
    for bar, t in zip(fig.axes[0].patches, schedule.types.tolist()):
        np.testing.assert_allclose(bar.get_facecolor()[:3], viz.block_colour(t)[:3])
    assert legend_texts(fig.axes[0]) == [f"b{b}" for b in sorted(set(schedule.types.tolist()))]


def test_gantt_draws_into_a_given_axes(graph):
    fig = Figure()
    ax = fig.add_subplot()
    schedule = fsm.simulate(graph, fsm.get_scheduler("depth"))
    assert viz.schedule_gantt(schedule, ax=ax, title="mine") is fig
    assert ax.get_title() == "mine" and len(ax.patches) == schedule.steps


def test_compare_schedules_shares_the_step_axis(graph, names):
    schedules = {n: fsm.simulate(graph, fsm.get_scheduler(n)) for n in ("earliest", "depth", "agenda")}
    bound = fsm.lower_bound(graph)
    fig = viz.compare_schedules(schedules, names, lower_bound=bound)
    render(fig)
    assert len(fig.axes) == 3
    for ax, (name, s) in zip(fig.axes, schedules.items()):
        assert ax.get_title().startswith(f"{name}: {s.steps} steps")
        assert len(ax.patches) == s.steps
        assert any(np.allclose(line.get_xdata(), bound) for line in ax.lines)
    assert legend_texts(fig.axes[0]) and not any(legend_texts(ax) for ax in fig.axes[1:])
    assert fig.axes[0].get_xlim() == fig.axes[-1].get_xlim()
    with pytest.raises(ValueError):
        viz.compare_schedules({})


def test_utilization_is_lanes_run_over_lanes(graph):
    schedule = fsm.simulate(graph, fsm.get_scheduler("earliest"))
    fig = viz.utilization(schedule, lanes=len(X))
    render(fig)
    ax = fig.axes[0]
    per_step, running, overall = ax.lines[:3]
    np.testing.assert_allclose(per_step.get_ydata(), schedule.sizes / len(X))
    np.testing.assert_allclose(running.get_ydata()[-1], schedule.utilisation)
    np.testing.assert_allclose(overall.get_ydata(), schedule.utilisation)
    assert ax.get_xlabel() == "VM step" and ax.get_ylabel() == "lanes busy (fraction)"
    # Twice the lanes: half the utilisation.
    double = viz.utilization(schedule, lanes=2 * len(X)).axes[0].lines[0].get_ydata()
    np.testing.assert_allclose(double, schedule.sizes / (2 * len(X)))
    with pytest.raises(ValueError):
        viz.utilization(schedule, lanes=0)


def test_utilization_overlay_keeps_the_longer_run(graph):
    short, long = sorted((fsm.simulate(graph, fsm.get_scheduler(n)) for n in ("earliest", "agenda")),
                         key=lambda s: s.steps)
    assert short.steps < long.steps
    fig = viz.utilization(long, label="long")
    viz.utilization(short, ax=fig.axes[0], label="short")
    render(fig)
    assert fig.axes[0].get_xlim()[1] >= long.steps
    assert sum(t.startswith("short") for t in legend_texts(fig.axes[0])) == 2
    assert len(fig.axes[0].lines) == 6


@pytest.mark.parametrize("name", ["earliest", "depth", "agenda"])
def test_frontier_size_matches_a_lane_by_lane_replay(graph, name):
    schedule = fsm.simulate(graph, fsm.get_scheduler(name))
    expected = lane_by_lane_frontier(graph, schedule.types.tolist())
    np.testing.assert_array_equal(viz.frontier_sizes(graph, schedule), expected)
    fig = viz.frontier_size(graph, schedule, label=name)
    render(fig)
    ax = fig.axes[0]
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), expected)
    assert expected[0] == 1  # every lane starts at the entry block
    assert ax.get_ylabel() == "ready blocks" and legend_texts(ax)[0].startswith(name)


def test_frontier_size_rejects_a_schedule_of_another_graph(graph):
    other = fsm.record(fib, jnp.array([2, 2]))
    with pytest.raises(ValueError, match="does not replay|ends before"):
        viz.frontier_sizes(other, fsm.simulate(graph, fsm.get_scheduler("earliest")))


def lane_by_lane_counts(chains, types, block):
    """Independent oracle: replay the step types on each example's block list
    (every lane waiting at the step's block runs it), counting `block`."""
    at, runs, out = [0] * len(chains), [0] * len(chains), []
    for t in types:
        for k, c in enumerate(chains):
            if at[k] < len(c) and c[at[k]] == t:
                runs[k] += t == block
                at[k] += 1
        out.append(list(runs))
    assert at == [len(c) for c in chains], "the steps do not replay every example's blocks"
    return np.asarray(out).T


@pytest.fixture(scope="module")
def chains():
    return [t.blocks for t in fib.reference_trace(X)]   # each example's blocks, from the reference interpreter


@pytest.mark.parametrize("name", ["earliest", "agenda"])
def test_lane_progress_matches_a_lane_by_lane_replay(chains, names, name):
    trace = fib.with_schedule(name).trace(X, per_lane=True)
    assert not trace.truncated
    for block in (0, 2):
        expected = lane_by_lane_counts(chains, trace.blocks.tolist(), block)
        assert expected[:, -1].tolist() == [c.count(block) for c in chains]
        fig = viz.lane_progress(trace, block, names)
        render(fig)
        ax = fig.axes[0]
        assert len(ax.lines) == len(X)
        for line, row in zip(ax.lines, expected):
            np.testing.assert_array_equal(line.get_ydata(), row)
            np.testing.assert_array_equal(line.get_xdata(), np.arange(trace.steps))
        assert ax.get_xlabel() == "VM step" and ax.get_title().startswith(names[block])
        assert legend_texts(ax) == [f"lane {k}" for k in range(len(X))]


def test_lane_progress_into_an_axes_and_of_a_truncated_trace():
    trace = fib.trace(X, steps=10, per_lane=True)
    assert trace.truncated and trace.steps == 10
    fig = Figure()
    assert viz.lane_progress(trace, 0, ax=fig.add_subplot(), title="calls") is fig
    assert fig.axes[0].get_title() == "calls"
    render(fig)
    ax = viz.lane_progress(trace, 0).axes[0]
    assert f"first 10 of {trace.total} steps" in ax.get_title()
    assert all(len(line.get_ydata()) == 10 for line in ax.lines)


def test_lane_progress_needs_the_per_lane_record():
    with pytest.raises(ValueError, match="per_lane=True"):
        viz.lane_progress(fib.trace(X), 0)
    # A NumPy int is a count like any other; one past int32 was JAX's raw OverflowError.
    assert fib.trace(X, steps=np.int64(4096)).total == fib.trace(X).total
    with pytest.raises(pcbatch.OptionError, match="steps: must be a positive int below 2"):
        fib.trace(X, steps=2 ** 40)


def test_policy_graph_draws_every_state_and_transition(policy, names):
    fig = viz.policy_graph(policy, names)
    render(fig)
    ax = fig.axes[0]
    nodes = [p for p in ax.patches if p.get_gid() == "state"]
    arrows = [p for p in ax.patches if p.get_gid() == "transition"]
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "state-label"]
    assert len(nodes) == len(policy.states) > 0
    assert len(arrows) == len(policy.transitions) > 0
    assert labels == [f"{','.join(map(str, s))}\n→{a}" for s, a in zip(policy.states, policy.actions)]
    for node, block in zip(nodes, policy.actions):
        np.testing.assert_allclose(node.get_facecolor()[:3], viz.block_colour(block)[:3])
    assert legend_texts(ax) == [names[b] for b in sorted(set(policy.actions))]


def test_policy_graph_only_visited(policy):
    visited = {a for a, _, _ in policy.transitions} | {b for _, b, _ in policy.transitions}
    fig = viz.policy_graph(policy, only_visited=True)
    nodes = [p for p in fig.axes[0].patches if p.get_gid() == "state"]
    assert len(nodes) == len(visited)
    render(fig)


def test_pq_tree_draws_p_and_q_nodes_and_leaves():
    tree = PQTree(list("abcdefg"))
    assert tree.reduce("ab") and tree.reduce("bc") and tree.reduce("de")
    kinds = [n.kind for n in tree.nodes()]
    fig = viz.pq_tree(tree)
    render(fig)
    ax = fig.axes[0]
    gids = [p.get_gid() for p in ax.patches]
    assert gids.count("P") == kinds.count("P") >= 2
    assert gids.count("Q") == kinds.count("Q") == 1
    leaves = sorted((t for t in ax.texts if t.get_gid() == "leaf"), key=lambda t: t.get_position()[0])
    assert [t.get_text() for t in leaves] == tree.frontier()
    # Edges: one line per parent-child pair.
    assert len(ax.lines) == len(kinds) - 1
    # The Q-node's rectangle spans its children.
    (q,) = [p for p in ax.patches if p.get_gid() == "Q"]
    xs = {t.get_text(): t.get_position()[0] for t in leaves}
    assert q.get_x() < xs["a"] and q.get_x() + q.get_width() > xs["c"]


def test_pq_tree_of_a_layout_and_of_an_empty_tree():
    result = plan_layout(["x1", "h1", "x2", "h2"], [[("x1", "x2"), ("h1", "h2")]])
    fig = viz.pq_tree(result.tree)
    render(fig)
    assert sum(t.get_gid() == "leaf" for t in fig.axes[0].texts) == 4
    empty = viz.pq_tree(PQTree([]))
    render(empty)
    assert not empty.axes[0].patches


def test_layout_before_after_shows_both_orders():
    variables = ["x1", "h1", "x2", "h2", "c1", "c2", "w"]
    sizes = {"x1": 4, "x2": 4, "h1": 2, "h2": 2, "c1": 2, "c2": 2, "w": 8}
    batches = [[("x1", "x2"), ("h1", "h2"), ("w", "w")], [("c1", "c2"), ("h1", "h2")], [("x2", "x1"), ("c1", "c2")]]
    result = plan_layout(variables, batches, sizes)
    assert result.dropped == [2]
    fig = viz.layout_before_after(result)
    render(fig)
    ax = fig.axes[0]
    for gid, order in (("before", variables), ("after", result.order)):
        cells = [p for p in ax.patches if p.get_gid() == gid]
        texts = [t.get_text() for t in ax.texts if t.get_gid() == gid]
        assert texts == [str(v) for v in order]
        assert [c.get_width() for c in cells] == [sizes[v] for v in order]
        assert [c.get_x() for c in cells] == list(np.cumsum([0] + [sizes[v] for v in order])[:-1])
    # Contiguous slices of honoured batches: batch 0's two operands, batch 1's c-slice (h shared).
    assert legend_texts(ax) == ["batch 0, operand 0", "batch 0, operand 1", "batch 1, operand 0"]
    assert "dropped batches [2]" in ax.get_title()
    after = {t.get_text(): c for t, c in zip((t for t in ax.texts if t.get_gid() == "after"),
                                             (p for p in ax.patches if p.get_gid() == "after"))}
    assert after["x1"].get_facecolor() == after["x2"].get_facecolor() != after["h1"].get_facecolor()


def test_stack_depth_histogram_counts_examples():
    traces = fib.reference_trace(X)
    depths = [t.max_depth for t in traces]
    fig = viz.stack_depth_histogram(traces, max_stack_depth=fib.max_stack_depth)
    render(fig)
    ax = fig.axes[0]
    bars = ax.patches
    assert sum(b.get_height() for b in bars) == len(X)
    assert len(bars) == max(depths) - min(depths) + 1
    for b in bars:
        centre = round(b.get_x() + b.get_width() / 2)
        assert b.get_height() == depths.count(centre)
    assert any(np.allclose(line.get_xdata(), fib.max_stack_depth) for line in ax.lines)
    assert ax.get_xlabel() == "deepest recursion (frames)" and ax.get_ylabel() == "examples"
    render(viz.stack_depth_histogram([]))


def test_docstring_examples_run():
    failures, tried = doctest.testmod(viz, optionflags=doctest.ELLIPSIS)
    assert tried >= 10 and failures == 0


def test_import_pcbatch_does_not_import_matplotlib():
    code = "import sys, pcbatch, pcbatch.viz; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
