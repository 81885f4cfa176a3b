"""What one VM step runs, counted in the optimized HLO (issue 18, item 5).

    python -m benchmarks.step_hlo        # fib, collatz, the Tree-LSTM (both machines, and its gradient), NUTS (~40 s)

For each program the machine's `lax.while_loop` is found in the compiled HLO of
a `jax.jit` call (the largest loop) and its kernels counted: those every
step runs (the loop body and condition outside any `conditional`) and those
inside the conditionals' branches (summed over all branches; a step runs one
branch of each). A fusion is one kernel. Copies are buffers XLA duplicates;
scatters are the stack and lane-table writes. No host callback may appear
(the loop must not return to Python). Recorded in benchmarks/README.md so
that the counts can be seen falling.
"""
from __future__ import annotations

import datetime

import jax

import pcbatch
from benchmarks.common import hlo_step_counts, print_table
from benchmarks.vm_overhead import collatz, collatz_inputs, fib, fib_inputs, nuts_case, treelstm_case
from pcbatch.mcmc.nuts import GradientLast

KINDS = ("fusion", "copy", "conditional", "scatter", "custom-call")


def cases():
    yield "fib (fork=False, batch 1024)", fib, (fib_inputs(1024, 12),)
    yield "collatz (batch 1024)", collatz, (collatz_inputs(1024, 1000),)
    tree_lstm, args = treelstm_case()
    yield "Tree-LSTM H 64, fork=False (batch 64)", tree_lstm.with_options(fork=False), args
    for masked in (False, True):   # the backend picks one by default (`Tuning.masked_pool_updates`)
        how = "pool updates masked" if masked else "pool updates under conds"
        yield f"Tree-LSTM H 64, fork=True (batch 64), {how}", \
            tree_lstm.with_options(fork=True, tuning=pcbatch.Tuning(masked_pool_updates=masked)), args
    nuts, args = nuts_case()
    for masked in (False, True):   # the backend picks one by default (`Tuning.masked_follow`)
        how = "masked" if masked else "under conds"
        yield f"NUTS, 100-d Gaussian (128 chains), follow blocks {how}", \
            nuts.with_options(tuning=pcbatch.Tuning(masked_follow=masked)), args
    every = nuts.with_schedule(GradientLast(nuts.scheduler.leaf, follow="all"))   # the GPU's default here
    yield "NUTS, 100-d Gaussian (128 chains), every block masked", \
        every.with_options(tuning=pcbatch.Tuning(masked_follow=True)), args


def training_cases():
    """The gradient of the forked Tree-LSTM under a plain `jax.jit` (as a training step is
    compiled): its recording forward loop and its backward loop, by `Tuning.grad_switch`."""
    tree_lstm, (params, trees, root) = treelstm_case()
    for switched in (False, True):   # the backend picks one by default
        how = "one switch" if switched else "a cond per block"
        f = tree_lstm.with_options(fork=True, tuning=pcbatch.Tuning(grad_switch=switched))
        text = jax.jit(jax.grad(lambda p, f=f: f(p, trees, root)[0].sum())).lower(params).compile().as_text()
        yield f"Tree-LSTM H 64 jax.grad (batch 64), {how}: forward", \
            hlo_step_counts(text, lambda ln: "transpose(" not in ln and "jvp(" in ln)
        yield f"Tree-LSTM H 64 jax.grad (batch 64), {how}: backward", \
            hlo_step_counts(text, lambda ln: "transpose(" in ln)


def main() -> None:
    print(f"# step_hlo  {datetime.datetime.now():%Y-%m-%d %H:%M}  jax {jax.__version__}  {jax.devices()[0].platform}")
    rows = []

    def row(name: str, c: dict) -> None:
        rows.append([name] + [str(c["every step"][k]) for k in KINDS] + [str(c["in branches"][k]) for k in KINDS])
        print("  ", " | ".join(rows[-1]), flush=True)

    for name, f, args in cases():
        # compiled as pcbatch compiles its own calls (`Tuning.compiler_options`)
        text = jax.jit(f, compiler_options=f.options.tuning.compiler_options()).lower(*args).compile().as_text()
        row(name, hlo_step_counts(text))
    for name, c in training_cases():
        row(name, c)
    print()
    heads = ["fusions", "copies", "conds", "scatters", "custom calls"]
    print_table(["program"] + [f"{h} (every step)" for h in heads] + [f"{h} (branches)" for h in heads], rows)


if __name__ == "__main__":
    main()
