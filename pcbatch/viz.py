"""Plots of what the machine did: schedules, frontiers, policies, layouts.

Every function takes the objects the rest of pcbatch returns (`fsm.Schedule`,
`fsm.ExecGraph`: from `fsm.record` and `fsm.simulate`; the `StepTrace` of a run
on the device, `f.trace(...)`, wherever a schedule goes; `fsm.Policy`,
`pcbatch.ir.Trace`, `memory.PQTree`, `memory.LayoutResult`, a block of
`f.layout_report(...)`) and returns a `matplotlib.figure.Figure`.  Figures are
made without pyplot and carry an Agg canvas, so they work headless (no display,
any backend) and never pile up in pyplot's figure registry; in Jupyter a
returned figure is shown as the cell's value (run ``%matplotlib inline`` first).
Each function also accepts ``ax=`` to draw into an existing `Axes`.

matplotlib is imported only when a plot is made (``pip install pcbatch[notebooks]``),
so ``import pcbatch`` never needs it.

Colours are tied to block indices, the same in every plot: block ``b`` has
`block_colour(b)`.

>>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
>>> @pcbatch.autobatch(fork=False)
... def fib(n):
...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
>>> x = jnp.array([3, 7, 4, 5])
>>> schedule = fsm.simulate(fsm.record(fib, x), fsm.get_scheduler("earliest"))
>>> fig = viz.schedule_gantt(schedule, viz.block_labels(fib.lowered(x)))
>>> fig.axes[0].get_xlabel()
'VM step'
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover - typing only
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from pcbatch.fsm import ExecGraph, Policy, Schedule
    from pcbatch.ir.core import StackProgram
    from pcbatch.ir.interpret import Trace
    from pcbatch.memory import BlockLayout, LayoutResult, PQNode, PQTree
    from pcbatch.runtime.steps import StepTrace

__all__ = [
    "block_colour",
    "block_labels",
    "compare_schedules",
    "frontier_size",
    "frontier_sizes",
    "lane_progress",
    "layout_before_after",
    "policy_graph",
    "pq_tree",
    "schedule_gantt",
    "stack_depth_histogram",
    "utilization",
]

RGBA = tuple[float, float, float, float]


# ----------------------------------------------------------------- helpers
def _figure(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes]:
    """`ax` and its figure, or a new pyplot-free figure with an Agg canvas."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def block_colour(block: int) -> RGBA:
    """The colour of block ``block`` in every plot (tab10, then tab20b)."""
    import matplotlib

    if block < 10:
        return tuple(matplotlib.colormaps["tab10"](block))  # type: ignore[return-value]
    return tuple(matplotlib.colormaps["tab20b"]((block - 10) % 20))  # type: ignore[return-value]


def block_labels(prog: StackProgram) -> list[str]:
    """``"b<i> <label>"`` for each block of a stack program (``f.lowered(*args)``),
    for the ``block_names`` argument of the plots.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> viz.block_labels(fib.lowered(jnp.array([3, 4])))[0]
    'b0 fib.entry'
    """
    return [f"b{i} {block.label}" for i, block in enumerate(prog.blocks)]


def _name(block_names: Sequence[str] | None, b: int) -> str:
    return block_names[b] if block_names is not None and b < len(block_names) else f"b{b}"


def _num_blocks(types: np.ndarray, block_names: Sequence[str] | None) -> int:
    used = int(types.max()) + 1 if types.size else 0
    return max(used, len(block_names) if block_names is not None else 0)


# ------------------------------------------------------------- schedules
def schedule_gantt(
    schedule: Schedule,
    block_names: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Gantt chart of a schedule: one bar per VM step, in the row of the block run.

    x is the VM step, each block ``b<i>`` has a row and a colour; a bar's
    height and opacity grow with the lanes run at that step (full height:
    every lane).  The legend names the blocks the schedule used, from
    `block_names` (e.g. `block_labels(f.lowered(*args))`); with names, every
    block of the program gets a row, used or not.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> x = jnp.array([3, 7, 4, 5])
    >>> schedule = fsm.simulate(fsm.record(fib, x), fsm.get_scheduler("depth"))
    >>> fig = viz.schedule_gantt(schedule)
    >>> len(fig.axes[0].patches) == schedule.steps
    True
    """
    from matplotlib.patches import Patch

    types = np.asarray(schedule.types)
    sizes = np.asarray(schedule.sizes)
    lanes = max(int(schedule.num_lanes), int(sizes.max()) if sizes.size else 1, 1)
    rows = _num_blocks(types, block_names)
    fig, ax = _figure(ax, (min(7 + 0.03 * schedule.steps, 16), 1.2 + 0.4 * max(rows, 1)))

    frac = sizes / lanes
    heights = 0.15 + 0.7 * frac
    colours = [(*block_colour(int(t))[:3], 0.35 + 0.65 * float(f)) for t, f in zip(types, frac)]
    steps = np.arange(schedule.steps)
    ax.bar(steps, heights, width=1.0, bottom=types - heights / 2, color=colours, linewidth=0, align="edge")

    used = sorted(set(types.tolist()))
    handles = [Patch(color=block_colour(b), label=_name(block_names, b)) for b in used]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  title="block", frameon=False)
    ax.set_yticks(range(rows), [f"b{b}" for b in range(rows)])
    ax.set_ylim(max(rows, 1) - 0.5, -0.5)  # block 0 on top
    ax.set_xlim(0, max(schedule.steps, 1))
    ax.set_xlabel("VM step")
    ax.set_ylabel("block")
    ax.set_title(title if title is not None else
                 f"{schedule.steps} steps, {schedule.num_lanes} lanes, utilisation {schedule.utilisation:.0%}")
    ax.grid(axis="x", alpha=0.3)
    return fig


def compare_schedules(
    schedules: Mapping[str, Schedule],
    block_names: Sequence[str] | None = None,
    *,
    lower_bound: int | None = None,
) -> Figure:
    """Gantt charts of several schedules of the same graph, one above the other
    on a shared step axis, so their lengths compare at a glance.

    `lower_bound` (`fsm.lower_bound(graph)`) is drawn as a dashed line.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> graph = fsm.record(fib, jnp.array([3, 7, 4, 5]))
    >>> fig = viz.compare_schedules({name: fsm.simulate(graph, fsm.get_scheduler(name))
    ...                              for name in ("earliest", "agenda")}, lower_bound=fsm.lower_bound(graph))
    >>> len(fig.axes)
    2
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not schedules:
        raise ValueError("compare_schedules needs at least one schedule")
    rows = max(_num_blocks(np.asarray(s.types), block_names) for s in schedules.values())
    longest = max(s.steps for s in schedules.values())
    fig = Figure(figsize=(min(8 + 0.03 * longest, 16), len(schedules) * (0.8 + 0.3 * max(rows, 1))),
                 layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(schedules), 1, sharex=True, squeeze=False)[:, 0]
    names = list(block_names) if block_names is not None else [f"b{b}" for b in range(rows)]
    for ax, (label, schedule) in zip(axes, schedules.items()):
        schedule_gantt(schedule, names, ax=ax,
                       title=f"{label}: {schedule.steps} steps, utilisation {schedule.utilisation:.0%}")
        if lower_bound is not None:
            ax.axvline(lower_bound, color="black", linestyle="--", linewidth=1)
            if ax is axes[0]:
                ax.annotate("lower bound", (lower_bound, 0), xytext=(3, 2), textcoords="offset points",
                            xycoords=("data", "axes fraction"), fontsize="small")
        if ax is not axes[0] and ax.get_legend() is not None:
            ax.get_legend().remove()
        if ax is not axes[-1]:
            ax.set_xlabel("")
    axes[-1].set_xlim(0, max(longest, lower_bound or 0) + 1)
    return fig


def utilization(
    schedule: Schedule,
    lanes: int | None = None,
    *,
    ax: Axes | None = None,
    label: str | None = None,
) -> Figure:
    """Fraction of the `lanes` doing useful work at each VM step, with its running
    mean; the dotted line is the whole run's utilisation.

    `lanes` defaults to the lanes of the recording (`schedule.num_lanes`).
    Pass `ax` (and `label`) to overlay several schedules.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> schedule = fsm.simulate(fsm.record(fib, jnp.array([3, 7, 4, 5])), fsm.get_scheduler("earliest"))
    >>> fig = viz.utilization(schedule, lanes=4)
    >>> fig.axes[0].get_ylabel()
    'lanes busy (fraction)'
    """
    lanes = int(schedule.num_lanes if lanes is None else lanes)
    if lanes <= 0:
        raise ValueError("lanes must be positive")
    overlay = ax is not None and ax.has_data()
    fig, ax = _figure(ax, (8, 3))
    sizes = np.asarray(schedule.sizes, float)
    frac = sizes / lanes
    steps = np.arange(schedule.steps)
    running = np.cumsum(frac) / (steps + 1) if frac.size else frac
    overall = float(frac.mean()) if frac.size else 1.0
    prefix = f"{label}: " if label else ""
    line, = ax.step(steps, frac, where="post", linewidth=1, label=f"{prefix}per step ({overall:.0%} overall)")
    ax.plot(steps, running, color=line.get_color(), linestyle="--", linewidth=1.5, label=f"{prefix}running mean")
    ax.axhline(overall, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_ylim(0, 1.05)
    ax.set_xlim(0, max(schedule.steps, 1, ax.get_xlim()[1] if overlay else 0))
    ax.set_xlabel("VM step")
    ax.set_ylabel("lanes busy (fraction)")
    ax.set_title(f"lane utilisation ({lanes} lanes)" if overlay else
                 f"utilisation {overall:.0%} over {schedule.steps} steps, {lanes} lanes")
    ax.legend(fontsize="small", loc="upper right")
    return fig


def frontier_sizes(graph: ExecGraph, schedule: Schedule) -> np.ndarray:
    """int[steps]: number of distinct blocks with a ready lane before each step
    of `schedule`, found by replaying it on `graph` (the graph it came from)."""
    from pcbatch.fsm.simulation import Simulation

    sim = Simulation(graph)
    out = np.zeros(schedule.steps, np.int64)
    for k, (t, size) in enumerate(zip(np.asarray(schedule.types).tolist(), np.asarray(schedule.sizes).tolist())):
        out[k] = np.count_nonzero(sim.counts)
        if sim.counts[t] == 0 or sim.step(t) != size:
            raise ValueError(f"step {k} of the schedule does not replay on this graph "
                             "(was the schedule simulated on another graph?)")
    if not sim.done:
        raise ValueError("the schedule ends before the graph is finished")
    return out


def frontier_size(
    graph: ExecGraph,
    schedule: Schedule,
    *,
    ax: Axes | None = None,
    label: str | None = None,
) -> Figure:
    """Frontier size over time: how many distinct blocks have a ready lane
    before each VM step (what a scheduler chooses among), from re-simulating
    `schedule` on `graph`.  Pass `ax` (and `label`) to overlay schedules.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> graph = fsm.record(fib, jnp.array([3, 7, 4, 5]))
    >>> fig = viz.frontier_size(graph, fsm.simulate(graph, fsm.get_scheduler("agenda")))
    >>> int(fig.axes[0].lines[0].get_ydata()[0])   # every lane starts at b0
    1
    """
    sizes = frontier_sizes(graph, schedule)
    overlay = ax is not None and ax.has_data()
    fig, ax = _figure(ax, (8, 3))
    mean = float(sizes.mean()) if sizes.size else 0.0
    ax.step(np.arange(schedule.steps), sizes, where="post",
            label=f"{label} (mean {mean:.2f})" if label is not None else None)
    top = max(int(sizes.max()) if sizes.size else 1, 1) + 0.5
    ax.set_ylim(0, max(top, ax.get_ylim()[1] if overlay else 0))
    ax.set_xlim(0, max(schedule.steps, 1, ax.get_xlim()[1] if overlay else 0))
    ax.set_xlabel("VM step")
    ax.set_ylabel("ready blocks")
    ax.yaxis.get_major_locator().set_params(integer=True)
    if label is not None:
        ax.legend(fontsize="small", loc="upper right")
    ax.set_title("frontier: distinct blocks with a ready lane" if overlay else
                 f"frontier: mean {mean:.2f} ready blocks per step")
    return fig


# ------------------------------------------------------------------ lanes
def lane_progress(
    trace: StepTrace,
    block: int,
    block_names: Sequence[str] | None = None,
    *,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Per lane, how many times it has run `block`, against the VM step: one
    step line per lane (`trace.runs(block)`). Lanes that advance together
    overlap; lanes that drift apart fan out. For NUTS, with `block` the one
    that ends a transition, this is each chain's transition count over the
    run: chains desynchronize.

    `trace` is a run recorded with each lane's pc, `f.trace(*args, per_lane=True)`.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> trace = fib.trace(jnp.array([3, 7, 4, 5]), per_lane=True)
    >>> fig = viz.lane_progress(trace, block=0)   # b0: calls of fib
    >>> [int(line.get_ydata()[-1]) for line in fig.axes[0].lines]
    [5, 41, 9, 15]
    """
    counts = trace.runs(block)
    fig, ax = _figure(ax, (8, 3))
    steps = np.arange(trace.steps)
    for lane, row in enumerate(counts):
        ax.step(steps, row, where="post", linewidth=1, label=f"lane {lane}")
    ax.set_xlim(0, max(trace.steps, 1))
    ax.set_ylim(0, max(int(counts.max()) if counts.size else 0, 1) * 1.05)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("VM step")
    name = _name(block_names, block)
    ax.set_ylabel(f"runs of b{block}")
    ax.grid(alpha=0.3)
    if title is None:
        more = f", first {trace.steps} of {trace.total} steps" if trace.truncated else f", {trace.steps} steps"
        title = f"{name}: runs per lane ({trace.num_lanes} lanes{more})"
    ax.set_title(title)
    if 0 < trace.num_lanes <= 10:
        ax.legend(fontsize="small", loc="upper left", frameon=False)
    return fig


# ----------------------------------------------------------------- policy
def _policy_layout(states: Sequence[tuple[int, ...]], per_row: int) -> dict[int, tuple[float, float]]:
    """Node positions: one band per state length (number of ready blocks),
    wrapped to `per_row` nodes a line, lines centred, top to bottom."""
    pos: dict[int, tuple[float, float]] = {}
    y = 0.0
    for length in sorted({len(s) for s in states}):
        members = [i for i, s in enumerate(states) if len(s) == length]
        for start in range(0, len(members), per_row):
            line = members[start : start + per_row]
            for k, i in enumerate(line):
                pos[i] = (k - (len(line) - 1) / 2, y)
            y -= 1.3
        y -= 0.4  # extra gap between bands
    return pos


def policy_graph(
    policy: Policy,
    block_names: Sequence[str] | None = None,
    *,
    only_visited: bool = False,
    per_row: int = 10,
    ax: Axes | None = None,
) -> Figure:
    """The learned FSM: one node per state, coloured by the block it chooses.

    A node's text is its state (the ready blocks in the policy's encoding) and,
    after the arrow, the chosen block.  States are banded by how many blocks are
    ready (one band per count, top to bottom).  Arrows are the transitions
    seen when the policy was replayed on its training graph, wider for more
    frequent ones; a loop above a node is a transition to itself.
    `only_visited` keeps just the states on that replay.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.fsm as fsm, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> policy = fsm.learn(fib, jnp.arange(6), trials=20, progress=False)
    >>> fig = viz.policy_graph(policy)
    >>> sum(p.get_gid() == "state" for p in fig.axes[0].patches) == len(policy.states)
    True
    """
    from matplotlib.patches import Arc, Circle, FancyArrowPatch, Patch

    data = policy.graph()
    states = [tuple(s) for s in data["states"]]
    chosen = list(data["chosen"])
    transitions = [tuple(t) for t in data["transitions"]]
    keep = list(range(len(states)))
    if only_visited and transitions:
        seen = {a for a, _, _ in transitions} | {b for _, b, _ in transitions}
        keep = [i for i in keep if i in seen]
    kept = set(keep)
    pos_local = _policy_layout([states[i] for i in keep], per_row)
    pos = {keep[j]: p for j, p in pos_local.items()}

    widest = min(per_row, max([sum(len(s) == n for s in (states[i] for i in keep)) for n in
                               {len(states[i]) for i in keep}] or [1]))
    height = -min([p[1] for p in pos.values()] or [0]) + 1.6
    fig, ax = _figure(ax, (max(5.0, 1.0 * widest + 2.5), max(2.5, 0.75 * height + 0.8)))
    radius = 0.38

    counts = [n for a, b, n in transitions if a in kept and b in kept]
    most = max(counts or [1])
    for a, b, n in transitions:
        if a not in kept or b not in kept:
            continue
        width = 0.6 + 2.4 * n / most
        (xa, ya), (xb, yb) = pos[a], pos[b]
        if a == b:
            loop = Arc((xa, ya + radius), 0.45, 0.45, theta1=-30, theta2=210, linewidth=width,
                       color="0.35", gid="transition")
            ax.add_patch(loop)
            continue
        d = np.hypot(xb - xa, yb - ya)
        ux, uy = (xb - xa) / d, (yb - ya) / d
        arrow = FancyArrowPatch((xa + radius * ux, ya + radius * uy), (xb - radius * ux, yb - radius * uy),
                                arrowstyle="-|>", mutation_scale=8 + 4 * n / most, linewidth=width,
                                color="0.35", alpha=0.7,
                                # same band: bow more, so the arc clears the nodes in between
                                connectionstyle=f"arc3,rad={0.15 if abs(ya - yb) > 1e-9 else 0.35}",
                                shrinkA=0, shrinkB=0, gid="transition")
        ax.add_patch(arrow)
    for i in keep:
        x, y = pos[i]
        ax.add_patch(Circle((x, y), radius, facecolor=block_colour(chosen[i]), edgecolor="black",
                            linewidth=0.8, gid="state", zorder=3))
        ax.text(x, y, f"{','.join(map(str, states[i]))}\n→{chosen[i]}", ha="center", va="center",
                fontsize=7, zorder=4, gid="state-label")
    used = sorted({chosen[i] for i in keep})
    handles = [Patch(color=block_colour(b), label=_name(block_names, b)) for b in used]
    if handles:
        ax.legend(handles=handles, title="chosen block", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  fontsize="small", frameon=False)
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    ax.set_xlim(min(xs) - 0.8, max(xs) + 0.8)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 1.1)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title(f"FSM policy ({policy.encoding} encoding): {len(keep)} states, "
                 f"{len(counts)} transitions")
    return fig


# -------------------------------------------------------------- PQ-trees
def _tree_positions(root: PQNode) -> dict[int, tuple[float, float, PQNode]]:
    """Tidy layout: leaves at x = 0, 1, ... in stored order, a parent centred
    over its children, y = -depth."""
    out: dict[int, tuple[float, float, PQNode]] = {}
    next_leaf = [0]

    def walk(node: PQNode, depth: int) -> float:
        if node.kind == "leaf" or not node.children:
            x = float(next_leaf[0])
            next_leaf[0] += 1
        else:
            xs = [walk(c, depth + 1) for c in node.children]
            x = (xs[0] + xs[-1]) / 2
        out[id(node)] = (x, -float(depth), node)
        return x

    walk(root, 0)
    return out


def pq_tree(tree: PQTree | PQNode | LayoutResult | BlockLayout, *, ax: Axes | None = None,
            title: str | None = None) -> Figure:
    """Draw a PQ-tree: P-nodes (children in any order) as circles, Q-nodes
    (children in this order or reversed) as rectangles, leaves as their labels.
    Also takes a `memory.LayoutResult` or a block of `f.layout_report(...)`
    (`memory.BlockLayout`): their final tree.

    >>> import pcbatch.viz as viz
    >>> from pcbatch.memory import PQTree
    >>> tree = PQTree("abcde")
    >>> tree.reduce("ab") and tree.reduce("bc")
    True
    >>> fig = viz.pq_tree(tree)
    >>> sorted(p.get_gid() for p in fig.axes[0].patches)
    ['P', 'Q']
    """
    from matplotlib.patches import Circle, Rectangle

    if hasattr(tree, "layout") or hasattr(tree, "placements"):  # a BlockLayout or a LayoutResult
        tree = _layout_result(tree).tree
    root = tree.root if hasattr(tree, "root") else tree
    if root is None:
        fig, ax = _figure(ax, (3, 2))
        ax.set_axis_off()
        ax.set_title(title or "empty PQ-tree")
        return fig
    pos = _tree_positions(root)
    leaves = sum(1 for _, _, n in pos.values() if n.kind == "leaf")
    depth = -min(y for _, y, _ in pos.values())
    fig, ax = _figure(ax, (max(3.0, 0.7 * leaves + 1), max(2.0, 1.0 * depth + 1.5)))
    for x, y, node in pos.values():
        for child in node.children:
            cx, cy, _ = pos[id(child)]
            ax.plot([x, cx], [y, cy], color="0.4", linewidth=1, zorder=1)
    for x, y, node in pos.values():
        if node.kind == "leaf":
            ax.text(x, y, str(node.value), ha="center", va="center", fontsize=9, gid="leaf",
                    bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="0.6"), zorder=3)
        elif node.kind == "P":
            ax.add_patch(Circle((x, y), 0.2, facecolor="#9ecae1", edgecolor="black", gid="P", zorder=2))
            ax.text(x, y, "P", ha="center", va="center", fontsize=8, zorder=3)
        else:
            xs = [pos[id(c)][0] for c in node.children]
            left, right = min(xs[0], x - 0.3), max(xs[-1], x + 0.3)
            ax.add_patch(Rectangle((left - 0.1, y - 0.17), right - left + 0.2, 0.34, facecolor="#fdd0a2",
                                   edgecolor="black", gid="Q", zorder=2))
            ax.text(x, y, "Q", ha="center", va="center", fontsize=8, zorder=3)
    ax.set_xlim(-0.7, leaves - 0.3)
    ax.set_ylim(-depth - 0.5, 0.5)
    ax.set_aspect("equal")
    ax.set_axis_off()
    ax.set_title(title if title is not None else f"PQ-tree {root}")
    return fig


def _layout_result(obj: Any) -> Any:
    """A `LayoutResult`, given one or a `BlockLayout` of a layout report."""
    if hasattr(obj, "placements"):
        return obj
    if getattr(obj, "layout", None) is None:
        raise ValueError(f"{obj!r} has no layout (no candidate groups in this block)")
    return obj.layout


def layout_before_after(result: LayoutResult | BlockLayout, *, ax: Axes | None = None) -> Figure:
    """The packed buffer before (variables in the order given to `plan_layout`;
    for a block of `f.layout_report(...)`, program order) and after
    (``result.order``): one cell per variable, as wide as its size.

    Each operand slice of an honoured batch has its own colour, so its
    variables show up scattered before and contiguous after; grey variables
    are in no slice.  Lines join each variable's two positions.

    >>> import pcbatch.viz as viz
    >>> from pcbatch.memory import plan_layout
    >>> result = plan_layout(["x1", "h1", "x2", "h2"], [[("x1", "x2"), ("h1", "h2")]])
    >>> fig = viz.layout_before_after(result)
    >>> [t.get_text() for t in fig.axes[0].texts if t.get_gid() == "after"]
    ['x1', 'x2', 'h1', 'h2']
    """
    from matplotlib.patches import Patch, Rectangle

    result = _layout_result(result)
    before = list(result.sizes)  # plan_layout fills sizes in input order
    after = list(result.order)
    size = {v: int(result.sizes.get(v, 1)) for v in after}
    group_of: dict[Any, int] = {}
    groups: list[str] = []
    for b in result.honoured:
        for j, sl in enumerate(result.placements[b].slices):
            if sl is None:
                continue
            members = after[sl.start : sl.start + sl.count]
            if all(v in group_of for v in members):
                continue  # the same slice shared with an earlier batch
            groups.append(f"batch {b}, operand {j}")
            for v in members:
                group_of.setdefault(v, len(groups) - 1)

    total = max(result.total_size, 1)
    fig, ax = _figure(ax, (min(max(6.0, 0.35 * total + 2), 16), 2.8))

    def row(order: list[Any], y: float, gid: str) -> dict[Any, float]:
        centres, offset = {}, 0
        for v in order:
            w = size.get(v, 1)
            g = group_of.get(v)
            colour = block_colour(g) if g is not None else (0.85, 0.85, 0.85, 1.0)
            ax.add_patch(Rectangle((offset, y), w, 0.6, facecolor=colour, edgecolor="black", linewidth=0.8,
                                   gid=gid))
            ax.text(offset + w / 2, y + 0.3, str(v), ha="center", va="center", fontsize=8, gid=gid)
            centres[v] = offset + w / 2
            offset += w
        return centres

    top = row(before, 1.4, "before")
    bottom = row(after, 0.0, "after")
    for v in after:
        ax.plot([top[v], bottom[v]], [1.4, 0.6], color="0.6", linewidth=0.6, zorder=0)
    ax.set_yticks([0.3, 1.7], ["after", "before"])
    ax.set_xlim(0, total)
    ax.set_ylim(-0.2, 2.2)
    ax.set_xlabel("buffer offset (elements)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=block_colour(g), label=name) for g, name in enumerate(groups)]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small",
                  frameon=False, title="contiguous slices")
    dropped = f", dropped batches {result.dropped}" if result.dropped else ""
    ax.set_title(f"layout: {len(result.honoured)} batches honoured{dropped}")
    return fig


# ------------------------------------------------------------------ stacks
def stack_depth_histogram(
    traces: Sequence[Trace],
    max_stack_depth: int | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """Histogram of each example's deepest recursion (`Trace.max_depth`, from
    ``f.reference_trace(*args)``): one bar per depth from the shallowest to the deepest.
    `max_stack_depth` (the machine's limit) is drawn as a red line.

    >>> import jax.numpy as jnp, pcbatch, pcbatch.viz as viz
    >>> @pcbatch.autobatch(fork=False)  # with fork-join no lane recurses
    ... def fib(n):
    ...     return n if n <= 1 else fib(n - 1) + fib(n - 2)
    >>> fig = viz.stack_depth_histogram(fib.reference_trace(jnp.array([1, 3, 4, 4])))
    >>> [int(p.get_height()) for p in fig.axes[0].patches]
    [1, 0, 1, 2]
    """
    depths = np.asarray([t.max_depth for t in traces], np.int64)
    fig, ax = _figure(ax, (6, 3))
    if depths.size:
        lo, hi = int(depths.min()), int(depths.max())
        values = np.arange(lo, hi + 1)
        ax.bar(values, np.bincount(depths - lo, minlength=hi - lo + 1), width=0.8, color=block_colour(0))
        ax.xaxis.get_major_locator().set_params(integer=True)
    if max_stack_depth is not None:
        ax.axvline(max_stack_depth, color="red", linestyle="--", label=f"max_stack_depth={max_stack_depth}")
        ax.legend(fontsize="small")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("deepest recursion (frames)")
    ax.set_ylabel("examples")
    ax.set_title(f"stack depth of {depths.size} examples" +
                 (f": mean {depths.mean():.1f}, max {depths.max()}" if depths.size else ""))
    return fig
