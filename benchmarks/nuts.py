"""Useful gradient evaluations per second of NUTS across many chains.

    python -m benchmarks.nuts                    # 1, 16, 128 chains (a few minutes on 2 CPU cores)
    python -m benchmarks.nuts --chains 1,16,128,1024 --samples 20 --repeats 3

Target: a 100-d correlated Gaussian (a fixed random rotation of variances
log-spaced in [0.1, 1]). For each number of chains it times, after a warm-up
call (compilation excluded), `--samples` NUTS transitions per chain with

* **pcbatch**: `pcbatch.mcmc.nuts` (recursive single-chain NUTS, autobatched;
  one program for all transitions, so chains desynchronize across trajectories);
  with `leapfrogs_per_leaf=1` under `nuts.GradientLast` (`pcbatch/1/last`:
  gradient steps wait for every running chain) and `nuts.GradientQuorum`
  (`pcbatch/1`, the sampler's default: a gradient step once half the running
  chains wait for one), and with
  4 leapfrogs per leaf as Radul et al. did (`pcbatch/4`: other trajectories,
  leaves of 4 steps of size step/4);
* **blackjax**: BlackJAX's iterative NUTS, `jax.vmap` over chains, `lax.scan` over
  transitions, all in one `jax.jit` (skipped with a message if BlackJAX is absent);
* **limit**: a `lax.fori_loop` over `vmap(grad(logdensity))` taking as many
  gradient steps per chain as the pcbatch run's average chain: no control flow.

pcbatch/1 and BlackJAX run the same algorithm (same step size, mass matrix,
`max_tree_depth`, NumPyro/BlackJAX U-turn criterion), so their gradient counts
agree in distribution. "Useful" gradients are those the chains' trajectories
need (`num_integration_steps`, summed); "utilization" is useful / executed
gradient lanes: for pcbatch, executed = chains x (times the machine ran its
leaf block) x leapfrogs per leaf (counted by a scheduler that reports its
choices, in a separate untimed run); for the vmapped sampler, every transition
runs until its slowest chain is done, so executed = chains x sum over
transitions of the longest trajectory.
"""
from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import fmt_rate, print_table, time_calls
from pcbatch.mcmc import nuts, targets

DIM = 100


def correlated_gaussian(dim: int = DIM, seed: int = 0):
    t = targets.correlated_gaussian(dim, seed)
    return t.logdensity, t.cov


class Counting:
    """Wraps a scheduler and reports each choice to the host (untimed runs only)."""

    def __init__(self, inner):
        self.inner, self.name, self.counts = inner, f"{inner.name}+count", {}

    def _record(self, block):
        b = int(block)
        self.counts[b] = self.counts.get(b, 0) + 1

    def init(self, num_blocks, num_lanes):
        return self.inner.init(num_blocks, num_lanes)

    def choose(self, carry, frontier):
        block, carry = self.inner.choose(carry, frontier)
        jax.debug.callback(self._record, block, ordered=False)
        return block, carry


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", default="1,16,128")
    ap.add_argument("--samples", type=int, default=20, help="transitions per chain per timed call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-size", type=float, default=0.15)
    ap.add_argument("--max-tree-depth", type=int, default=10)
    args = ap.parse_args()
    chain_counts = [int(c) for c in args.chains.split(",")]

    try:
        import blackjax
    except ImportError:
        blackjax = None
        print("blackjax is not installed (pip install blackjax): its column is skipped")

    logdensity, cov = correlated_gaussian()
    chol = np.linalg.cholesky(cov)
    inv_mass = jnp.ones((DIM,), jnp.float32)
    eps, depth, S = args.step_size, args.max_tree_depth, args.samples
    print(f"NUTS on a {DIM}-d correlated Gaussian; step size {eps}, max tree depth {depth}, "
          f"{S} transitions per chain per call, median of {args.repeats}")
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({platform.processor() or platform.machine()})")

    grad = jax.grad(logdensity)

    def limit_fn(x0, steps):
        @jax.jit
        def run(x):
            def body(_, x):
                return x + 1e-3 * jax.vmap(grad)(x)
            return jax.lax.fori_loop(0, steps, body, x)
        return lambda: run(x0)

    rows = []
    for chains in chain_counts:
        x0 = jnp.asarray(np.random.default_rng(chains).standard_normal((chains, DIM)) @ chol.T, jnp.float32)
        keys = jax.random.split(jax.random.PRNGKey(chains), chains)
        fns, useful, executed = {}, {}, {}
        for lpl, sched in ((1, "gradient_last"), (1, "gradient_quorum"), (4, "gradient_quorum")):
            name = f"pcbatch/{lpl}" + ("/last" if sched == "gradient_last" else "")
            prog = nuts.sampler(logdensity, num_samples=S, max_tree_depth=depth, leapfrogs_per_leaf=lpl,
                                uturn_criterion="numpyro", schedule=sched)
            pargs = nuts.prepare(x0, keys, eps / lpl if lpl > 1 else eps, inv_mass, S)[0]
            fns[name] = (lambda p, a: (lambda: p.checked(*a)))(prog, pargs)
            out, _ = fns[name]()
            useful[name] = int(np.asarray(out.info.num_integration_steps).sum())
            counter = Counting(prog.scheduler)
            counted = prog.with_schedule(counter)
            jax.block_until_ready(counted.checked(*pargs))
            leaf = nuts.leaf_block(prog.lowered(*pargs))
            # each leaf-block step evaluates two leaves (the bottom of the tree) per lane
            executed[name] = counter.counts.get(leaf, 0) * chains * lpl * 2
        if blackjax is not None:
            kernel = blackjax.nuts(logdensity, step_size=eps, inverse_mass_matrix=inv_mass,
                                   max_num_doublings=depth)

            @jax.jit
            def bj(x0, key):
                def one(state, k):
                    state, info = jax.vmap(kernel.step)(jax.random.split(k, x0.shape[0]), state)
                    return state, (state.position, info.num_integration_steps)
                _, out = jax.lax.scan(one, jax.vmap(kernel.init)(x0), jax.random.split(key, S))
                return out

            fns["blackjax"] = (lambda f, a, k: (lambda: f(a, k)))(bj, x0, jax.random.PRNGKey(1))
            steps = np.asarray(fns["blackjax"]()[1])          # [S, chains]
            useful["blackjax"] = int(steps.sum())
            executed["blackjax"] = int(steps.max(axis=1).sum()) * chains
        per_chain = max(1, useful["pcbatch/1"] // chains)
        fns["limit"] = limit_fn(x0, per_chain)
        useful["limit"] = executed["limit"] = per_chain * chains
        times = time_calls(fns, args.repeats)
        rows.append((chains, {k: (useful[k] / times[k], useful[k] / executed[k], times[k], useful[k]) for k in fns}))

    names = [n for n in ("pcbatch/1/last", "pcbatch/1", "pcbatch/4", "blackjax", "limit") if n in rows[0][1]]
    print()
    print("useful gradient evaluations per second (utilization = useful / executed gradient lanes)")
    headers = ["chains"] + names + (["pcbatch/1 : blackjax", "pcbatch/1 : limit"] if "blackjax" in names
                                    else ["pcbatch/1 : limit"])
    table = []
    for chains, r in rows:
        cells = [str(chains)] + [f"{fmt_rate(r[n][0])}/s ({100 * r[n][1]:.0f}%)" for n in names]
        if "blackjax" in names:
            cells.append(f"{r['pcbatch/1'][0] / r['blackjax'][0]:.2f}x")
        cells.append(f"{r['pcbatch/1'][0] / r['limit'][0]:.2f}x")
        table.append(cells)
    print_table(headers, table)
    print()
    print("per call: median wall time, useful gradients")
    print_table(["chains"] + names,
                [[str(c)] + [f"{r[n][2] * 1e3:.1f} ms, {r[n][3]}" for n in names] for c, r in rows])

if __name__ == "__main__":
    main()
