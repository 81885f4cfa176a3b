"""Loop forks: the calls a loop makes independently run at once, in lanes of their own.

The natural code for a tree of any arity loops over a node's children and
recurses into each::

    k = tree.first_child[node]
    while k >= 0:
        h, c = encode(tree, k)
        h_sum, fc_sum = h_sum + h, fc_sum + sigmoid(U @ h) * c
        k = tree.next_sibling[k]

A `Fork` needs its calls side by side in one block; these are one call site
run a data-dependent number of times. Where nothing that steers the loop and
nothing a call's arguments are made of depends on a call's result (a taint
analysis over the loop's dataflow proves it), the loop runs twice, as pfor
splits a loop into what the iterations share and what they do alone:

1. a launch loop: the loop cut down to what its branches and those calls'
   arguments need, on renamed variables, which launches each call in a lane
   of its own (`Launch`) and moves on;
2. `Await` every child;
3. the loop itself, where each launched call became `Collect` of the next
   child's result, or, where the pool had no lane free when it was launched,
   the call itself.

Both loops take the same path, so the collects meet the children in launch
order, and everything else runs in the loop's own order: the results,
floating-point accumulation included, are the Python's. Steps: a small loop
test is copied into the blocks that jump to it (and into the Await); where a
child was collected the rest of the trip runs in the Collect's own step (its
writes kept only there); a collect loop that is one block runs
`_COLLECTS_PER_STEP` trips a step. A loop whose proof
fails keeps its calls (its inner loops are tried on their own), and
`Program.notes` says why. Runs before `form_forks`, on Figure 2 functions.
"""
from __future__ import annotations

import functools
import re
from dataclasses import replace

import jax
import jax.numpy as jnp

from pcbatch.ir.cfg import closure, simplify
from pcbatch.ir.core import Await, Block, Branch, Call, Collect, Fail, Function, Jump, Launch, Op, Prim, Return, retext, successors
from pcbatch.ir.dataflow import through_prims, use_def

_LAUNCH = "%launch"  # suffix of the launch loop's copies of the loop's variables
_TEST_OPS = 4  # a loop test this small is copied into the blocks that jump to it
_COLLECTS_PER_STEP = 2  # trips of a one-block collect loop run per step (4: fewer steps, each dearer; slower)


def _keep_where(flag, new, old):
    return (jax.tree_util.tree_map(lambda a, b: jnp.where(flag, a, b), new, old),)


def _none_collected(got, run=True):
    return (jnp.logical_and(run, jnp.logical_not(got)),)


def _both(flag, cond):
    return (jnp.logical_and(flag, jnp.asarray(cond) != 0),)


def _sccs(nodes: list[int], succ: dict[int, list[int]]) -> list[list[int]]:
    """Strongly connected components of the subgraph on `nodes` (Tarjan, iterative)."""
    inside = set(nodes)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on: set[int] = set()
    out: list[list[int]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter([s for s in succ[root] if s in inside]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter([s for s in succ[w] if s in inside])))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    out.append(sorted(comp))
    return out


def _live_in(blocks: list[Block]) -> list[set[str]]:
    """Variables live on entry to each block (a Return's value is read there)."""
    use, defs = zip(*map(use_def, blocks))
    live = [set(u) for u in use]
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(blocks))):
            out = set().union(*(live[s] for s in successors(blocks[i].term)))
            new = use[i] | (out - defs[i])
            if new != live[i]:
                live[i] = new
                changed = True
    return live


def _line(loc) -> str:
    return f" (line {loc.lineno})" if loc is not None else ""


class _Loops:
    def __init__(self, fn: Function, launching: frozenset[str] = frozenset()):
        self.fn = fn
        self.launching = launching
        self.blocks = list(fn.blocks)
        self.notes: list[str] = []
        self.live = _live_in(self.blocks)
        self.made = 0  # fresh names made

    def succ(self) -> dict[int, list[int]]:
        return {i: list(successors(b.term)) for i, b in enumerate(self.blocks)}

    def run(self) -> tuple[Function, list[str]]:
        succ = self.succ()
        for region in _sccs(list(range(len(self.blocks))), succ):
            self.visit(region, succ)
        if len(self.blocks) == len(self.fn.blocks):
            return self.fn, self.notes
        return replace(self.fn, blocks=simplify(tuple(self.blocks))), self.notes

    def visit(self, region: list[int], succ: dict[int, list[int]]) -> None:
        """Fork `region`'s calls if it is a loop that may, else try the loops inside it."""
        looped = len(region) > 1 or region[0] in succ[region[0]]
        if not looped or not any(isinstance(op, Call) for i in region for op in self.blocks[i].ops):
            return
        why = self.try_fork(region)
        if why is None:
            return
        self.notes.append(why)
        inside = set(region)
        headers = [i for i in region if any(i in succ[p] for p in succ if p not in inside)]
        for inner in _sccs([i for i in region if i not in headers], succ):
            self.visit(inner, succ)

    def try_fork(self, region: list[int]) -> str | None:
        """Split the loop `region` into launch, await and collect; None if
        done, else why not."""
        blocks, inside = self.blocks, set(region)
        fn = self.fn.name
        entries = {(p, i) for p, b in enumerate(blocks) if p not in inside
                   for i in successors(b.term) if i in inside}
        headers = sorted({i for _, i in entries})
        where = f"{fn}: the loop at {blocks[headers[0]].loc if headers and blocks[headers[0]].loc else '?'}"
        if len(headers) != 1 or headers[0] == 0:
            return f"{where} has no single entry block: its calls run one after another"
        header = headers[0]
        for p, _ in entries:
            if not isinstance(blocks[p].term, (Jump, Branch)):
                return f"{where} is entered from a {type(blocks[p].term).__name__}: its calls run one after another"
        ops = [op for i in region for op in blocks[i].ops]
        calls = [op for op in ops if isinstance(op, Call)]
        tainted = through_prims(ops, {c.out for c in calls})
        launched = [c for c in calls if not set(c.args) & tainted]
        if not launched:
            c = calls[0]
            # A temporary's name means nothing in the listing (the printer renumbers them).
            named = sorted(v for v in set(c.args) & tainted if not re.match(r"_+t\d+$", v.rpartition(".")[2]))
            reads = (f"reads {', '.join(f'`{v}`' for v in named)}, which depends" if named
                     else "has an argument that depends")
            return (f"{where}: the call to {c.callee}{_line(c.loc)} {reads} on a call's result: "
                    "its calls run one after another")
        for c in calls:
            if not any(c is d for d in launched) and c.callee in self.launching:
                # The children wait in this lane's list until collected; a callee that launches
                # in the same lane would append its own and collect this loop's.
                return (f"{where}: it also calls {c.callee}{_line(c.loc)} in the loop, which launches calls of "
                        "its own in the same lane while this loop's are collected: its calls run one after "
                        "another")
        for i in region:
            t = blocks[i].term
            if isinstance(t, Branch) and t.cond in tainted:
                # A temporary's name means nothing in the listing (the printer renumbers them).
                through = "" if re.match(r"_+t\d+$", t.cond.rpartition(".")[2]) else f" (through `{t.cond}`)"
                return (f"{where}: the branch{_line(t.loc)} depends on a call's result{through}, "
                        "so the calls it makes are not known in advance: they run one after another")
            if not isinstance(t, (Jump, Branch, Return, Fail)):
                return f"{where} ends a block in {type(t).__name__}: its calls run one after another"
        # What the launch loop needs: its branches, the launched calls' arguments, and what they are made of.
        need = {blocks[i].term.cond for i in region if isinstance(blocks[i].term, Branch)}
        need = through_prims(ops, need | {a for c in launched for a in c.args}, forward=False)
        if need & tainted:  # cannot happen (taint flows where need is traced back), but never assume
            return f"{where}: its control depends on a call's result: its calls run one after another"
        kept = {i: [op for op in blocks[i].ops
                    if (isinstance(op, Prim) and set(op.outs) & need) or any(op is c for c in launched)]
                for i in region}
        renamed = {v for i in region for op in kept[i] if isinstance(op, Prim) for v in op.outs}
        new = {v: v + _LAUNCH for v in renamed}

        def rn(v: str) -> str:
            return new.get(v, v)

        base = len(blocks)
        copy_of = {i: base + k for k, i in enumerate(region)}
        wait = base + len(region)
        for i in region:
            b = blocks[i]
            launch_ops: list[Op] = []
            for op in kept[i]:
                if isinstance(op, Prim):
                    launch_ops.append(replace(op, ins=tuple(map(rn, op.ins)), outs=tuple(map(rn, op.outs)),
                                              text=retext(op.text, new) if op.text else op.text))
                else:
                    launch_ops.append(Launch(replace(op, args=tuple(map(rn, op.args)))))
            t = b.term
            if isinstance(t, Jump):
                t = Jump(copy_of.get(t.target, wait))
            elif isinstance(t, Branch):
                t = replace(t, cond=rn(t.cond), true=copy_of.get(t.true, wait), false=copy_of.get(t.false, wait))
            else:  # Return, Fail: the collect loop returns (or fails) at the same point, after what came before
                t = Jump(wait)
            blocks.append(Block(f"{b.label}.launch", tuple(launch_ops), t, b.loc))
        # The wait also tests the loop's condition (it reads nothing the children compute): one step fewer.
        test = blocks[header]
        if (isinstance(test.term, Branch) and len(test.ops) <= _TEST_OPS
                and all(isinstance(op, Prim) for op in test.ops)):
            wait_block = Block(f"{test.label}.await", test.ops, Await(test.term.true, test.term.cond, test.term.false),
                               test.loc)
        else:
            wait_block = Block(f"{test.label}.await", (), Await(header), test.loc)
        blocks.append(wait_block)
        for i in region:  # the launch loop's back edges test the condition in the same step
            blocks[copy_of[i]] = self.rotated(blocks[copy_of[i]])
        # Enter the launch loop with its variables' values on entry to the loop.
        copies = sorted(v for v in renamed if v in self.live[header])
        start = copy_of[header]
        if copies:
            blocks.append(self.rotated(Block(f"{blocks[header].label}.launch_init",
                                             (Prim(tuple(map(rn, copies)), tuple(copies), lambda *xs: xs, ""),),
                                             Jump(start), blocks[header].loc)))
            start = len(blocks) - 1
        for p in sorted({p for p, _ in entries}):
            t = blocks[p].term
            if isinstance(t, Jump):
                t = Jump(start)
            elif isinstance(t, Branch):
                t = replace(t, true=start if t.true == header else t.true,
                            false=start if t.false == header else t.false)
            blocks[p] = replace(blocks[p], term=t)
        # The loop itself collects what was launched (or, without a lane, calls).
        for i in region:
            self.collect(i, launched)
        names = sorted({c.callee for c in launched})
        lines = ", ".join(sorted({_line(c.loc).strip(" ()") for c in launched if c.loc is not None}))  # "line N"
        self.notes.append(f"{where}: its calls to {', '.join(names)}{f' ({lines})' if lines else ''} "
                          "run at once, each in a lane of its own (a loop fork)")
        return None

    def rotated(self, block: Block) -> Block:
        """`block`, where it jumps to a loop test (a few Prims and a Branch),
        with a copy of the test: one machine step per trip instead of two."""
        t = block.term
        if not isinstance(t, Jump):
            return block
        test = self.blocks[t.target]
        if (not isinstance(test.term, Branch) or len(test.ops) > _TEST_OPS
                or not all(isinstance(op, Prim) for op in test.ops)):
            return block
        return replace(block, ops=block.ops + test.ops, term=test.term)

    def fresh(self, v: str) -> str:
        self.made += 1
        return f"{v}%{self.made}"

    def collect(self, i: int, launched: list[Call]) -> None:
        """Block i of the loop with each launched call made a Collect and the
        rest of the block run in the same step where there was a child (`fast`),
        or after the call itself in the lane where the child list is empty."""
        b = self.blocks[i]
        at = next((k for k, op in enumerate(b.ops) if any(op is c for c in launched)), None)
        if at is None:
            return
        call = b.ops[at]
        flag = f"{call.out}%collected"
        rest = len(self.blocks)
        by_call = rest + 1
        self.blocks.append(Block(f"{b.label}.collected", b.ops[at + 1:], b.term, call.loc))
        self.blocks.append(Block(f"{b.label}.call", (call,), Jump(rest), call.loc))
        fast = self.fast(i, b.ops[:at], call, b.ops[at + 1:], b.term, by_call)
        if fast is None:
            self.blocks[i] = Block(b.label, b.ops[:at] + (Collect(call.out, call.callee, flag),),
                                   Branch(flag, rest, by_call, call.loc), b.loc)
        else:
            self.blocks[i] = Block(b.label, b.ops[:at] + fast[0], fast[1], b.loc)
        self.collect(rest, launched)

    def fast(self, i: int, pre: tuple[Op, ...], call: Call, rest: tuple[Op, ...], term,
             by_call: int) -> tuple[tuple[Op, ...], Branch] | None:
        """Block i's Collect of `call` and the rest of the block after it (and
        the loop test it jumps to), on renamed variables, each write that
        outlives the step kept only where the trip had a child (the other lanes
        call, then run the rest as written); where the block is the whole loop
        (it jumps back to itself), `_COLLECTS_PER_STEP` trips in one step, a
        trip running only where the one before had a child and the test held.
        The ops after `pre` and the branch that ends the block, or None where
        the rest ends otherwise or makes calls."""
        loc = call.loc
        if isinstance(term, Jump):
            rotated = self.rotated(Block("", rest, term))
            rest, term = rotated.ops, rotated.term
        if not all(isinstance(op, Prim) for op in rest) or not isinstance(term, (Jump, Branch)):
            return None
        if any(t >= len(self.live) for t in successors(term)):
            return None
        self_loop = (isinstance(term, Branch) and term.true == i and all(isinstance(op, Prim) for op in pre))
        trips = _COLLECTS_PER_STEP if self_loop else 1
        after = set().union(*(self.live[t] for t in successors(term)))
        # What the call path reads: the call's arguments, then the rest as written.
        exposed, written = set(call.args), {call.out}
        for op in rest:
            exposed.update(v for v in op.ins if v not in written)
            written.update(op.outs)
        if isinstance(term, Branch) and term.cond not in written:
            exposed.add(term.cond)
        keep = after | exposed
        name: dict[str, str] = {}
        kept: list[tuple[str, str, str | None]] = []  # (variable, its value in a trip, where that trip kept it)
        ops: list[Op] = []

        def copy(op: Prim, when: str | None) -> None:
            reads = {v: name[v] for v in op.ins if v in name}
            outs = tuple(self.fresh(v) for v in op.outs)
            ops.append(replace(op, ins=tuple(name.get(v, v) for v in op.ins), outs=outs,
                               text=retext(op.text, reads) if reads and op.text else op.text))
            name.update(zip(op.outs, outs))
            kept.extend((v, o, when) for v, o in zip(op.outs, outs) if v in keep)

        def both(a: str, b: str, text: str) -> str:
            out = self.fresh("%go")
            ops.append(Prim((out,), (a, b), _both, text, loc))
            return out

        run: str | None = None  # this trip runs (None: the first, which always does)
        stops: list[str] = []  # trips that wanted a child and found none
        for trip in range(trips):
            if trip:
                for op in pre:
                    copy(op, run)
            got = self.fresh(f"{call.out}%collected")
            out = self.fresh(call.out)
            ops.append(Collect(out, call.callee, got, run))
            ok = got if run is None else both(run, got, f"{run} and {got}")
            name[call.out] = out
            kept.extend([(call.out, out, ok)] if call.out in keep else [])
            for op in rest:
                copy(op, ok)
            stops.append(self.fresh("%nochild"))  # the trip ran (the first always does) and found no child
            ops.append(Prim((stops[-1],), (got,) if run is None else (got, run), _none_collected,
                            f"not {got}" if run is None else f"{run} and not {got}", loc))
            if isinstance(term, Jump):
                break
            run = both(ok, name.get(term.cond, term.cond), f"{ok} and {name.get(term.cond, term.cond)}")
        for v, value, when in kept:  # in program order: a later trip's value wins where it ran
            if when is None:
                ops.append(Prim((v,), (value,), lambda x: (x,), value, loc))
            else:
                ops.append(Prim((v,), (when, value, v), _keep_where, f"{value} if {when} else {v}", loc))
        need_call = self.fresh("%call")
        ops.append(Prim((need_call,), tuple(stops), lambda *xs: (functools.reduce(jnp.logical_or, xs),),
                        " or ".join(stops), loc))
        if isinstance(term, Jump):
            return tuple(ops), Branch(need_call, by_call, term.target, loc)
        # Where the test fails, a lane that had its children leaves the loop; one without calls.
        leave = len(self.blocks)
        self.blocks.append(Block("collected.exit", (), Branch(need_call, by_call, term.false, loc), loc))
        return tuple(ops), Branch(run, term.true, leave, loc)


def form_loop_forks(fn: Function, launching: frozenset[str] = frozenset()) -> tuple[Function, list[str]]:
    """`fn` with every loop whose calls can be made at once split into launch,
    await and collect (module docstring), and a note per loop with calls
    saying what was done or why not. `launching`: functions that may launch
    calls in the lane that calls them (a loop that calls one of them, besides
    the calls it launches, is not split)."""
    return _Loops(fn, launching).run()


def launching_functions(functions: tuple[Function, ...]) -> frozenset[str]:
    """The functions whose run in a lane may launch calls there: they launch, or
    call (in their own lane) one that does."""
    direct = {f.name for f in functions for b in f.blocks for op in b.ops if isinstance(op, Launch)}
    calls = {f.name: {op.callee for b in f.blocks for op in b.ops if isinstance(op, Call)} for f in functions}
    return frozenset(name for name in calls if closure([name], calls.__getitem__) & direct)
