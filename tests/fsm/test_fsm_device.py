"""Device schedulers inside a tiny `lax.while_loop` VM reproduce the host replay exactly."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pcbatch.fsm.base import Frontier
from pcbatch.fsm.baselines import Agenda, Depth, Earliest
from pcbatch.fsm.graph import ExecGraph
from pcbatch.fsm.policy import Policy, encode_state, encode_state_device, key_width
from pcbatch.fsm.qlearn import learn_from_graphs
from pcbatch.fsm.simulation import simulate


def chains_of(graph: ExecGraph) -> list[list[int]]:
    """Undo `ExecGraph.from_chains` (lanes are runs of consecutive nodes)."""
    starts = np.flatnonzero(np.diff(graph.parent_ptr) == 0)
    return [c.tolist() for c in np.split(graph.node_type, starts[1:])]


def program(graphs: list[ExecGraph], num_blocks: int) -> list[np.ndarray]:
    """Each graph's chains as int32[lanes, length], padded with num_blocks (halted), all one shape."""
    chains = [chains_of(g) for g in graphs]
    lanes = max(len(c) for c in chains)
    length = max(len(lane) for c in chains for lane in c) + 1
    out = []
    for c in chains:
        prog = np.full((lanes, length), num_blocks, np.int32)
        for i, lane in enumerate(c):
            prog[i, : len(lane)] = lane
        out.append(prog)
    return out


def device_vm(scheduler, num_blocks: int, lanes: int, max_steps: int):
    """A jitted VM: each step the scheduler picks a block and every lane waiting there advances.

    Returns (steps, int32[max_steps] block per step).  A choice with no ready
    lane makes no progress, so the step cap ends the loop and the run differs
    from the host's.
    """

    def run(prog: jax.Array) -> tuple[jax.Array, jax.Array]:
        lane = jnp.arange(lanes)

        def cond(state):
            pos, _, n, _ = state
            return jnp.any(prog[lane, pos] < num_blocks) & (n < max_steps)

        def body(state):
            pos, carry, n, trace = state
            pc = prog[lane, pos]
            counts = jnp.zeros(num_blocks, jnp.int32).at[pc].add(1, mode="drop")
            block, carry = scheduler.choose(carry, Frontier(pc, counts, pos.astype(jnp.int32)))
            return pos + (pc == block), carry, n + 1, trace.at[n].set(block)

        init = (jnp.zeros(lanes, jnp.int32), scheduler.init(num_blocks, lanes), 0, jnp.full(max_steps, -1, jnp.int32))
        _, _, n, trace = jax.lax.while_loop(cond, body, init)
        return n, trace

    return jax.jit(run)


def assert_device_matches_host(graphs: list[ExecGraph], scheduler) -> None:
    num_blocks = graphs[0].num_types
    progs = program(graphs, num_blocks)
    vm = device_vm(scheduler, num_blocks, progs[0].shape[0], max(g.num_nodes for g in graphs))
    for g, prog in zip(graphs, progs):
        n, trace = vm(prog)
        host = simulate(g, scheduler).types
        assert int(n) == host.size
        assert np.array_equal(np.asarray(trace)[: int(n)], host)


@pytest.mark.parametrize("make", [Earliest, Depth, Agenda])
@pytest.mark.parametrize("name", ["bilstm", "rec"])
def test_baselines_match_host(workloads, make, name):
    train, held_out = workloads[name]
    assert_device_matches_host(train + held_out, make())


@pytest.mark.parametrize("name", ["bilstm", "rec"])
def test_learned_policy_matches_host(workloads, learned, name):
    train, held_out = workloads[name]
    assert_device_matches_host(train + held_out, learned[name])


def random_chains(seed: int, lanes: int, num_blocks: int, length: int) -> ExecGraph:
    """Chains over few distinct depths and blocks, so depth and mean-depth ties are common."""
    rng = np.random.default_rng(seed)
    used = rng.choice(num_blocks, size=4, replace=False)
    chains = [rng.choice(used, size=rng.integers(1, length)).tolist() for _ in range(lanes)]
    return ExecGraph.from_chains(chains, num_blocks)


@pytest.mark.parametrize("num_blocks", [5, 40])
def test_tie_heavy_chains_match_host(num_blocks):
    graphs = [random_chains(seed, 24, num_blocks, 8) for seed in range(4)]
    # A policy over more than 31 blocks, learned on the first graph and used on all.
    policy = learn_from_graphs(graphs[:1], num_blocks, trials=60, seed=0, progress=False)
    for scheduler in (Depth(), Agenda(), policy, Policy(num_blocks, "max", {})):
        assert_device_matches_host(graphs, scheduler)


@pytest.mark.parametrize("encoding", ["base", "max", "sort"])
def test_device_encoding_matches_host(encoding):
    rng = np.random.default_rng(0)
    num_blocks = 40
    encode = jax.jit(lambda c: encode_state_device(c, encoding))
    for _ in range(50):
        counts = rng.integers(0, 4, size=num_blocks) * (rng.random(num_blocks) < 0.3)
        state = encode_state(counts, encoding)
        key = np.asarray(encode(jnp.asarray(counts, jnp.int32)))
        assert key.shape == (key_width(num_blocks, encoding),)
        assert tuple(key[: len(state)].tolist()) == state and np.all(key[len(state) :] == num_blocks)
