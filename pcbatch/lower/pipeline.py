"""The lowering pipeline: Program (Figure 2) -> StackProgram (Figure 4)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from pcbatch.ir.cfg import reachable, renumber
from pcbatch.ir.core import CONSTANT, INVARIANT, STACKED, Collect, Join, Prim, Program, StackProgram
from pcbatch.ir.verify import verify_stack_program
from pcbatch.lower.calls import merge_functions, ret_var
from pcbatch.lower.coalesce import coalesce_copies
from pcbatch.lower.constants import find_constants, find_invariants, qualify
from pcbatch.lower.liveness import block_successors, call_returns, classify, exit_live, live_out, liveness
from pcbatch.lower.stacks import call_sites, eliminate_pop_push, insert_saves, share_stacks, stack_conflicts
from pcbatch.ir.jaxtypes import type_key
from pcbatch.lower.types import infer_types


def _order_prelude(prelude: list[Prim], consts: dict[str, str], inputs: set[str]) -> tuple[Prim, ...]:
    """Constant parameters copy their origin; then a topological order."""
    defined = {o for op in prelude for o in op.outs}
    pending = list(prelude) + [
        Prim((v,), (o,), lambda x: (x,), "") for v, o in sorted(consts.items()) if v != o and v not in defined
    ]
    ready = set(inputs)
    ordered = []
    while pending:
        progress = [op for op in pending if all(i in ready for i in op.ins)]
        if not progress:
            raise AssertionError(f"cyclic constants: {pending}")
        for op in progress:
            ordered.append(op)
            ready.update(op.outs)
            pending.remove(op)
    return tuple(ordered)


def lower(program: Program, shared_inputs: tuple[bool, ...]) -> StackProgram:
    """Merge, stack and classify; `shared_inputs[k]` says the entry's k-th
    argument is the same for the whole batch (`in_axes=None`)."""
    machine_consts = find_constants(program, shared_inputs)
    invariants = find_invariants(program, shared_inputs)
    consts = {**machine_consts, **invariants}  # both are hoisted out of the loop
    m = merge_functions(program, consts)
    entry_fn = program.function(program.entry)
    entry_block = m.entry_of[program.entry]
    keep = reachable(tuple(m.blocks), entry_block)
    blocks = renumber(tuple(m.blocks), keep)
    block_function = tuple(m.block_function[i] for i in keep)
    entry_block = keep.index(entry_block)

    succ = block_successors(blocks)
    at_exit = exit_live(blocks, block_function, ret_var)
    params_of = {f.name: tuple(qualify(f.name, p) for p in f.params) for f in program.functions}
    # Return values a Join reads from children's lanes: never renamed, always stored.
    joined = {r for b in blocks for op in b.ops if isinstance(op, Join) for r in op.rets}
    joined |= {op.ret for b in blocks for op in b.ops if isinstance(op, Collect)}
    # Every `<ret>` keeps its name, so `rets` stays true after coalescing (a
    # local may still be renamed *to* one).
    keep_names = ({ret_var(f.name) for f in program.functions} | set(params_of[program.entry]) | set(consts)
                  | joined)
    rets = call_returns(blocks, block_function, ret_var)
    live_in = liveness(blocks, succ, at_exit, call_sites(blocks, block_function, params_of), rets)
    outs = [live_out(i, live_in, succ, at_exit, blocks, rets) for i in range(len(blocks))]
    all_params = frozenset(p for ps in params_of.values() for p in ps)
    blocks, renames = coalesce_copies(blocks, live_in, outs, keep_names, rets, all_params)
    merged: dict[str, tuple[str, ...]] = {}
    for u, v in renames.items():
        merged[v] = merged.get(v, ()) + (u,)
    sites = call_sites(blocks, block_function, params_of)
    blocks = insert_saves(blocks, block_function, liveness(blocks, succ, at_exit, sites, rets), params_of)
    blocks = tuple(eliminate_pop_push(b) for b in blocks)

    entry_params = params_of[program.entry]
    result = ret_var(entry_fn.name)
    inputs = {p for p in entry_params if p in consts}
    live_in = liveness(blocks, succ, at_exit, call_rets=rets)
    keep = {result} | {p for p in entry_params if p not in consts} | joined
    classes = classify(blocks, live_in, set(consts), keep)
    crossing = frozenset(set().union(*live_in) | keep) - set(consts)
    prelude = _order_prelude(m.prelude, consts, inputs)
    classes.update({v: CONSTANT for v in machine_consts})
    classes.update({v: INVARIANT for v in invariants})
    param_locs = {qualify(f.name, p): loc for f in program.functions for p, loc in zip(f.params, f.param_locs)
                  if loc is not None}
    prog = StackProgram(blocks, entry_block, entry_params, result, prelude, classes, {}, block_function,
                        stack_conflicts(blocks), crossing=crossing, param_locs=param_locs, notes=program.notes,
                        merged=merged)
    verify_stack_program(prog)
    return prog


def specialize(prog: StackProgram, input_types: dict[str, Any]) -> StackProgram:
    """The same program with every variable's per-example type inferred, and
    stacked variables of one type that are never saved at once sharing a stack."""
    types = infer_types(prog, input_types)
    stacked = list(prog.vars_of_class(STACKED))
    stack_of = share_stacks(stacked, prog.stack_conflicts, {v: type_key(types[v]) for v in stacked})
    prog = replace(prog, var_types=types, stack_of=stack_of)
    verify_stack_program(prog)
    return prog
