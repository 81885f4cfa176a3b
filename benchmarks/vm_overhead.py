"""VM overhead of pcbatch's generated program-counter machine.

    python -m benchmarks.vm_overhead            # full run (a few minutes on 2 CPU cores)
    python -m benchmarks.vm_overhead --quick    # smaller inputs, fewer repeats
    python -m benchmarks.vm_overhead --hlo DIR  # also write the optimized HLO it analyses

For fib (recursive) and collatz (a loop) at batch 1, 64 and 1024 it times

* the machine `@pcbatch.autobatch` generates (`f.checked(...)`, whose
  `status.steps` is the VM step count),
* hand-written `lax.while_loop` machines for the same program with the same
  control-flow graph (`benchmarks/hand_machines.py`), so they take the same
  number of VM steps (checked),
* the original Python run one example at a time (`f.reference`), timed on a
  small subset and extrapolated to the batch,

and reports time per VM step, examples*steps/s and generated/hand-written
ratios, then the compile time (cold process, first call minus a steady call)
of fib, collatz and a synthetic ~50-block program at batch 1024, of the binary
Tree-LSTM (H 64, 64 trees) and of NUTS (128 chains, 100-d Gaussian), each with
default options, split into pcbatch's own passes, JAX tracing and XLA.
Targets: generated <= 1.3x hand-written at batch 1024 (issue 2); compile fib
<= 1.5 s, Tree-LSTM <= 3 s, NUTS <= 6 s, anything else up to 50 blocks <= 5 s
(issues 2, 21).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

import pcbatch
from benchmarks import hand_machines as hm
from benchmarks.common import block, fmt_rate, fmt_time, hlo_copy_report, print_table, time_calls

RATIO_TARGET = 1.3       # generated <= 1.3x hand-written at batch 1024
COMPILE_TARGET_S = 5.0   # trace+compile <= 5 s for programs up to 50 blocks
COMPILE_TARGETS_S = {"fib": 1.5, "Tree-LSTM": 3.0, "NUTS": 6.0}  # issue 21, default options
TARGET_BATCH = 1024


# --- the programs, written for ONE example ---------------------------------

@pcbatch.autobatch(fork=False)  # the hand machines are one lane per example
def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


@pcbatch.autobatch
def collatz(n):
    steps = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps


# --- inputs ------------------------------------------------------------------

def collatz_len(n: int) -> int:
    k = 0
    while n != 1:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        k += 1
    return k


def fib_inputs(batch: int, top: int, seed: int = 0) -> jax.Array:
    """n uniform in [0, top]; example 0 is the worst case n = top, so every
    batch (batch 1 included) runs the same deepest recursion."""
    x = np.random.default_rng(seed).integers(0, top + 1, batch)
    x[0] = top
    return jnp.asarray(x, jnp.int32)


def collatz_inputs(batch: int, top: int, seed: int = 0) -> jax.Array:
    """n uniform in [1, top]; example 0 is the n <= top with the longest orbit."""
    x = np.random.default_rng(seed).integers(1, top + 1, batch)
    x[0] = max(range(1, top + 1), key=collatz_len)
    return jnp.asarray(x, jnp.int32)


# --- one configuration -------------------------------------------------------

@dataclass
class Row:
    prog: str
    batch: int
    steps: int
    utilization: float       # useful lane-steps / (lanes * steps)
    gen_s: float              # the plain call f(x): what a user runs
    checked_s: float          # f.checked(x): also counts each example's blocks (status.blocks_run)
    hand_s: dict[str, float]  # version -> seconds
    py_per_example_s: float
    py_subset: int

    @property
    def py_s(self) -> float:
        return self.py_per_example_s * self.batch


def same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def measure(name: str, f: pcbatch.Autobatched, hands: dict[str, Callable], x: jax.Array,
            repeats: int, min_time: float, py_subset: int) -> Row:
    # correctness first: generated vs hand-written (whole batch) vs Python (subset)
    result, status = block(f.checked(x))
    assert not np.any(np.asarray(status.overflow)) and not np.any(np.asarray(status.unfinished))
    steps = int(status.steps)
    k = min(py_subset, x.shape[0])
    t0 = time.perf_counter()
    ref = block(f.reference(x[:k]))
    py_per_example = (time.perf_counter() - t0) / k
    if not same(result[:k], ref):
        raise AssertionError(f"{name}: generated machine disagrees with Python on {x[:k]}")
    # compiled as pcbatch compiles its own calls (`Tuning.compiler_options`): the same XLA for both
    jitted = {v: jax.jit(h, compiler_options=f.options.tuning.compiler_options()) for v, h in hands.items()}
    for v, h in jitted.items():
        r, s, ovf = block(h(x))
        if not same(r, result):
            raise AssertionError(f"{name}: hand-written ({v}) disagrees with the generated machine")
        if int(s) != steps:
            raise AssertionError(f"{name}: hand-written ({v}) took {int(s)} VM steps, generated {steps}")
        assert not np.any(np.asarray(ovf))
    util = float(np.sum(np.asarray(status.blocks_run))) / (x.shape[0] * steps)

    times = time_calls({"gen": lambda: f(x), "checked": lambda: f.checked(x),
                        **{v: (lambda h=h: h(x)) for v, h in jitted.items()}}, repeats, min_time)
    gen_s, checked_s = times.pop("gen"), times.pop("checked")
    return Row(name, int(x.shape[0]), steps, util, gen_s, checked_s, times, py_per_example, k)


# --- trace + compile ---------------------------------------------------------

def synthetic_source(sections: int, arms: int = 5) -> str:
    """A control-heavy program: `sections` times (a `for` loop over an
    if/elif chain of `arms` arms with a `continue`, then a `while` loop), one
    early return and one self-recursive call."""
    body = ["acc = n % 7", "t = 0"]
    for s in range(sections):
        chain = []
        for a in range(arms):
            kw = "if" if a == 0 else "elif"
            op = ["acc = acc + {c}", "acc = acc - {c}", "acc = acc * 2 + {c}", "t = t + {c}",
                  "acc = acc // 2 + {c}"][a % 5].format(c=s * arms + a + 1)
            chain.append(f"    {kw} i % {arms + 1} == {a}:\n        {op}")
        chain.append("    else:\n        continue")
        body.append(f"for i in range(n % {3 + s} + 1):\n" + "\n".join(chain) + "\n    t = t + 1")
        body.append(f"while acc > {100 + 10 * s}:\n    acc = acc // {2 + s % 3}\n    t = t + 1")
        if s == 0:
            body.append("if t > 1000:\n    return acc")
    body.append("if d > 0:\n    acc = acc + synth(n + 1, d - 1)")
    body.append("return acc + t")
    src = "import pcbatch\n\n\n@pcbatch.autobatch\ndef synth(n, d):\n" + textwrap.indent("\n".join(body), "    ") + "\n"
    return src


def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class CompileRow:
    prog: str
    blocks: int
    lower_s: float   # frontend + lowering + type inference (f.lowered)
    first_s: float   # first call: JAX trace + XLA compile + one run
    steady_s: float  # a later call with the same signature
    cpu_s: float     # process CPU time of lowering + first call - steady call (all threads)
    jax_s: dict      # JAX's own compile events during the first call: trace, to MLIR, XLA

    @property
    def total_s(self) -> float:
        return self.lower_s + self.first_s - self.steady_s

    @property
    def target_s(self) -> float:
        return COMPILE_TARGETS_S.get(self.prog, COMPILE_TARGET_S)


_JAX_EVENTS = {"/jax/core/compile/jaxpr_trace_duration": "trace",
               "/jax/core/compile/jaxpr_to_mlir_module_duration": "to MLIR",
               "/jax/core/compile/backend_compile_duration": "XLA"}
_events: dict | None = None


def _on_event(event: str, duration: float, **_: Any) -> None:
    if _events is not None and event in _JAX_EVENTS:
        _events[_JAX_EVENTS[event]] = _events.get(_JAX_EVENTS[event], 0.0) + duration


jax.monitoring.register_event_duration_secs_listener(_on_event)


def compile_time(name: str, f: pcbatch.Autobatched, args: tuple, fresh: int, repeats: int = 3) -> CompileRow:
    """Median over `fresh` cold starts (each a new decorator instance) by total."""
    rows = sorted((compile_once(name, f, args, repeats) for _ in range(fresh)), key=lambda c: c.total_s)
    return rows[len(rows) // 2]


def compile_once(name: str, f: pcbatch.Autobatched, args: tuple, repeats: int) -> CompileRow:
    global _events
    f = pcbatch.autobatch(f.fn, options=f.options)  # a fresh instance with the same options: nothing cached
    c0, t0 = time.process_time(), time.perf_counter()
    prog = f.lowered(*args)
    lower_s = time.perf_counter() - t0
    _events = {}
    t0 = time.perf_counter()
    block(f.checked(*args))
    first_s = time.perf_counter() - t0
    first_cpu = time.process_time() - c0
    events, _events = _events, None
    steady, steady_cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        block(f.checked(*args))
        steady.append(time.perf_counter() - t0)
        steady_cpu.append(time.process_time() - c0)
    assert f.trace_count == 1, "a steady-state call re-traced"
    return CompileRow(name, len(prog.blocks), lower_s, first_s, statistics.median(steady),
                      first_cpu - statistics.median(steady_cpu), events)


def treelstm_case() -> tuple[pcbatch.Autobatched, tuple]:
    from pcbatch import data
    from pcbatch.models import nary
    trees = data.batch(data.random_binary_trees(64, seed=0))
    params = nary.init_params(jax.random.PRNGKey(0), vocab=1000, hidden=64)
    return nary.nary_tree_lstm, (params, trees, trees.root)


def nuts_case() -> tuple[pcbatch.Autobatched, tuple]:
    from pcbatch.mcmc import nuts, targets
    target = targets.correlated_gaussian(100)
    prog = nuts.sampler(target.logdensity, num_samples=10, max_tree_depth=10, uturn_criterion="numpyro")
    x0 = target.draws(128, seed=0)
    keys = jax.random.split(jax.random.PRNGKey(0), 128)
    return prog, nuts.prepare(x0, keys, 0.15, None, 10)[0]


def pick_synthetic(tmpdir: str, args: tuple, want: int = 50) -> tuple[Any, str, int]:
    """The largest synthetic program with at most `want` blocks (counted on a
    throw-away instance, so the timed one starts cold)."""
    best = None
    for sections in range(1, 6):
        for arms in range(3, 9):
            tag = f"{sections}_{arms}"
            path = os.path.join(tmpdir, f"pcbatch_synth_{tag}.py")
            with open(path, "w") as fh:
                fh.write(synthetic_source(sections, arms))
            module = load_module(path, f"pcbatch_synth_{tag}")
            blocks = len(pcbatch.autobatch(module.synth.fn).lowered(*args).blocks)
            if blocks > want:
                break
            if best is None or blocks > best[2]:
                best = (module, path, blocks)
        if arms == 3 and blocks > want:
            break
    assert best is not None
    return best


# --- HLO ---------------------------------------------------------------------

def copy_analysis(name: str, f: pcbatch.Autobatched, hands: dict[str, Callable], x: jax.Array,
                  outdir: str | None) -> None:
    """Where the per-step time goes: buffer copies XLA inserts around `lax.switch`."""
    texts = {"generated": jax.jit(f.checked).lower(x).compile().as_text()}
    for v, h in hands.items():
        texts[f"hand ({v})"] = jax.jit(h).lower(x).compile().as_text()
    print(f"  {name}, batch {x.shape[0]}:")
    for label, text in texts.items():
        where = ""
        if outdir:
            os.makedirs(outdir, exist_ok=True)
            tag = "-".join(label.replace("(", " ").replace(")", " ").split())
            path = os.path.join(outdir, f"{name}_{x.shape[0]}_{tag}.hlo.txt")
            with open(path, "w") as fh:
                fh.write(text)
            where = f"   [{path}]"
        print(f"    {label:16s} {hlo_copy_report(text)}{where}")


# --- main --------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs and fewer repeats (~1 min)")
    ap.add_argument("--batches", default="1,64,1024", help="comma-separated batch sizes")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per measurement (median)")
    ap.add_argument("--hlo", metavar="DIR", default=None, help="dump optimized HLO and a copy analysis")
    ap.add_argument("--skip-compile", action="store_true", help="skip the trace+compile section")
    ap.add_argument("--skip-hlo", action="store_true", help="skip the HLO copy analysis")
    a = ap.parse_args(argv)

    batches = [int(b) for b in a.batches.split(",")]
    fib_top, collatz_top = (12, 1000) if a.quick else (15, 10_000)
    repeats = a.repeats or (3 if a.quick else 7)
    min_time = 0.05 if a.quick else 0.2
    py_subset = 4 if a.quick else 8

    print(f"pcbatch VM overhead  {datetime.datetime.now():%Y-%m-%d %H:%M}  jax {jax.__version__}  "
          f"{jax.devices()[0].platform}  {platform.processor() or platform.machine()}  "
          f"{os.cpu_count()} cpus  load {os.getloadavg()[0]:.1f}{'  (--quick)' if a.quick else ''}")
    print(f"fib: n ~ U[0, {fib_top}] with example 0 = {fib_top};  collatz: n ~ U[1, {collatz_top}] "
          f"with example 0 = the longest orbit;  median of {repeats} repeats (each >= {min_time}s, machines "
          "timed round-robin), warm-up excluded\n")

    programs = [
        ("fib", fib, {"switch": hm.fib_switch, "hoisted": hm.fib_hoisted}, lambda b: fib_inputs(b, fib_top)),
        ("collatz", collatz, {"switch": hm.collatz_switch}, lambda b: collatz_inputs(b, collatz_top)),
    ]
    rows: list[Row] = []
    for name, f, hands, make in programs:
        for b in batches:
            t0 = time.perf_counter()
            rows.append(measure(name, f, hands, make(b), repeats, min_time, py_subset))
            print(f"  measured {name} batch {b} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)

    # --- the table ---
    headers = ["program", "batch", "VM steps", "util",
               "gen wall", "gen /step", "gen ex*st/s",
               "hand wall", "hand /step", "hand ex*st/s",
               "py/example", "py wall*", "py ex*st/s", "gen/hand"]
    out = []
    for r in rows:
        es = r.batch * r.steps
        for i, (v, hs) in enumerate(r.hand_s.items()):
            label = f" ({v})" if len(r.hand_s) > 1 else ""
            first = i == 0
            out.append([
                r.prog if first else "", str(r.batch) if first else "", str(r.steps) if first else "",
                f"{r.utilization:.0%}" if first else "",
                fmt_time(r.gen_s) if first else "", fmt_time(r.gen_s / r.steps) if first else "",
                fmt_rate(es / r.gen_s) if first else "",
                fmt_time(hs) + label, fmt_time(hs / r.steps), fmt_rate(es / hs),
                fmt_time(r.py_per_example_s) if first else "", fmt_time(r.py_s) if first else "",
                fmt_rate(es / r.py_s) if first else "",
                f"{r.gen_s / hs:.2f}x"])
    print_table(headers, out)
    print("  util = useful lane-steps / (batch * VM steps);  ex*st/s = batch * VM steps / wall;\n"
          "  hand (switch) = whole state through lax.switch, hand (hoisted) = stacks kept out of lax.switch;\n"
          f"  py wall* = f.reference timed on the first {py_subset} examples (or fewer), extrapolated to the batch.")

    print(f"\nTarget: generated (the plain call f(x)) <= {RATIO_TARGET}x hand-written at batch {TARGET_BATCH}")
    for r in rows:
        if r.batch != TARGET_BATCH:
            continue
        for v, hs in r.hand_s.items():
            ratio = r.gen_s / hs
            print(f"  {r.prog:8s} vs hand ({v:7s}): {ratio:5.2f}x   "
                  f"{'PASS' if ratio <= RATIO_TARGET else 'MISS'}   "
                  f"(f.checked, which also counts blocks per example: {r.checked_s / hs:.2f}x)")
    if TARGET_BATCH not in batches:
        print(f"  (batch {TARGET_BATCH} not run)")

    # --- trace + compile ---
    if not a.skip_compile:
        print(f"\nCompile time (fresh decorator instances, default options; fib, collatz, synthetic at batch "
              f"{TARGET_BATCH}): median of {1 if a.quick else 3} cold starts")
        crow = []
        with tempfile.TemporaryDirectory() as tmp:
            sargs = (jnp.arange(TARGET_BATCH, dtype=jnp.int32) % 23,
                     jnp.arange(TARGET_BATCH, dtype=jnp.int32) % 3)
            module, _, _ = pick_synthetic(tmp, sargs)
            s = module.synth
            ref_k = 16
            if not same(s(*(v[:ref_k] for v in sargs)), s.reference(*(v[:ref_k] for v in sargs))):
                raise AssertionError("synthetic program: generated machine disagrees with Python")
            cases = [("fib", pcbatch.autobatch(fib.fn), (fib_inputs(TARGET_BATCH, fib_top),)),  # default options
                     ("collatz", collatz, (collatz_inputs(TARGET_BATCH, collatz_top),)),
                     ("synthetic", s, sargs), ("Tree-LSTM", *treelstm_case()), ("NUTS", *nuts_case())]
            for name, f, args in cases:
                crow.append(compile_time(name, f, args, fresh=1 if a.quick else 3))
        print_table(["program", "blocks", "pcbatch passes", "first call", "steady", "compile", "(cpu time)",
                     "JAX trace", "to MLIR", "XLA", "target"],
                    [[c.prog, str(c.blocks), fmt_time(c.lower_s), fmt_time(c.first_s), fmt_time(c.steady_s),
                      fmt_time(c.total_s), fmt_time(c.cpu_s)]
                     + [fmt_time(c.jax_s.get(k, 0.0)) for k in ("trace", "to MLIR", "XLA")]
                     + [f"<= {c.target_s:g} s {'PASS' if c.total_s <= c.target_s else 'MISS'}"]
                     for c in crow])
        print("  compile = pcbatch passes (f.lowered: frontend, lowering, types, layout) + first call - steady call; "
              "JAX trace / to MLIR / XLA: JAX's own compile events in the first call (nested jits counted in "
              "their parent too); PASS/MISS on wall time; cpu time = the process's CPU seconds, less sensitive "
              "to other load.")

    if not a.skip_hlo:
        print(f"\nCopies per VM step in the optimized HLO (what XLA inserts around lax.switch; "
              f"'NsC' = N scatters in that branch){'' if a.hlo else '  (--hlo DIR writes the HLO)'}")
        for name, f, hands, make in programs:
            copy_analysis(name, f, hands, make(max(batches)), a.hlo)
    print(f"\nload average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())} ({os.cpu_count()} cpus)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
