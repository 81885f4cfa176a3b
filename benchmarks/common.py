"""Timing helpers shared by the benchmarks."""
from __future__ import annotations

import re
import statistics
import time
from typing import Any, Callable

import jax


def block(x: Any) -> Any:
    return jax.block_until_ready(x)


def time_calls(fns: dict[str, Callable[[], Any]], repeats: int, min_time: float = 0.0,
               warm: bool = False) -> dict[str, float]:
    """Median wall time (s) of each `fn()`, after one excluded warm-up call each
    (none with `warm=True`: the caller has called each one already).

    The functions are timed round-robin (repeat 1 of each, then repeat 2 of
    each, ...), so a change in background load hits them all alike. Each
    repeat calls a function enough times to last at least `min_time` seconds
    and records the mean of those calls."""
    inner = {}
    for k, fn in fns.items():
        if not warm:
            block(fn())  # warm-up (compilation, caches): excluded
        t0 = time.perf_counter()
        block(fn())
        one = time.perf_counter() - t0
        inner[k] = max(1, int(min_time / max(one, 1e-9))) if min_time > 0 else 1
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                block(fn())
            samples[k].append((time.perf_counter() - t0) / inner[k])
    return {k: statistics.median(v) for k, v in samples.items()}


def time_call(fn: Callable[[], Any], repeats: int, min_time: float = 0.0) -> float:
    """Median wall time (s) of `fn()`; see `time_calls`."""
    return time_calls({"fn": fn}, repeats, min_time)["fn"]


def fmt_time(seconds: float) -> str:
    if seconds != seconds:  # nan
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e9:.0f} ns"


def fmt_rate(per_s: float) -> str:
    if per_s != per_s:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if per_s >= scale:
            return f"{per_s / scale:.2f}{unit}"
    return f"{per_s:.0f}"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


# --- optimized-HLO inspection ---------------------------------------------

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
                "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO array shape such as `s32[64,1024]{1,0}`."""
    m = re.match(r"(\w+)\[([\d,]*)\]", shape)
    if not m or m.group(1) not in _DTYPE_BYTES:
        return 0
    n = 1
    for d in filter(None, m.group(2).split(",")):
        n *= int(d)
    return n * _DTYPE_BYTES[m.group(1)]


def hlo_computations(text: str) -> dict[str, list[str]]:
    comps: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%?([\w.\-]+) \(", line)
        if m and line.rstrip().endswith("{"):
            name = m.group(1)
            comps[name] = []
        elif line.startswith("}"):
            name = None
        elif name is not None:
            comps[name].append(line.strip())
    return comps


def machine_loop(comps: dict[str, list[str]], where: Callable[[str], bool] | None = None) -> tuple[str, str] | None:
    """(condition, body) of the machine's while loop: the one with the largest
    body (among those whose `while` line passes `where`: its op_name says
    which transformation made it, e.g. `transpose(` for a backward loop)."""
    loops = []
    for lines in comps.values():
        for ln in lines:
            m = re.search(r"\bwhile\(.*condition=%?([\w.\-]+).*body=%?([\w.\-]+)", ln)
            if m and (where is None or where(ln)):
                loops.append((len(comps.get(m.group(2), [])), m.group(1), m.group(2)))
    return max(loops)[1:] if loops else None


def hlo_copy_report(text: str) -> str:
    """Per VM step: bytes moved by `copy` instructions in the while body and
    in each branch of its `conditional` (the `lax.switch`), and scatters."""
    comps = hlo_computations(text)

    def copies(lines: list[str]) -> tuple[int, int]:
        n = b = 0
        for ln in lines:
            m = re.match(r"%[\w.\-]+ = (\S+) copy\(", ln)
            if m:
                n += 1
                b += _shape_bytes(m.group(1))
        return n, b

    loop = machine_loop(comps)
    if loop is None or loop[1] not in comps:
        return "no while loop found"
    body = loop[1]
    branches: list[str] = []
    for ln in comps[body]:
        m = re.search(r"conditional\(.*branch_computations=\{([^}]*)\}", ln)
        if m:
            branches = [s.strip().lstrip("%") for s in m.group(1).split(",")]
    n, b = copies(comps[body])
    parts = [f"loop body {n} copies/{b / 1024:.0f} KiB"]
    per = []
    for br in branches:
        cn, cb = copies(comps.get(br, []))
        sc = sum(1 for ln in comps.get(br, []) if re.match(r"(ROOT )?%[\w.\-]*scatter[\w.\-]* = |.* scatter\(", ln))
        per.append(f"{cn}/{cb / 1024:.0f}K" + (f"/{sc}sC" if sc else ""))
    if branches:
        parts.append(f"{len(branches)} branches (copies/KiB): " + " ".join(per))
    return "; ".join(parts)


_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
                     r"|branch_computations=\{([^}]*)\}")
_KINDS = ("fusion", "copy", "conditional", "scatter", "custom-call")


def hlo_step_counts(text: str, where: Callable[[str], bool] | None = None) -> dict[str, dict[str, int]]:
    """What a VM step runs, from the optimized HLO: kernels in the machine's
    while loop (the largest one) and in what it calls, split into `every
    step` (the loop's body and condition outside any `conditional`) and `in
    branches` (summed over every branch of its conditionals: a step runs one
    branch of each). A fusion is one kernel (its inside is not counted);
    `scatter` counts scatter fusions too."""
    comps = hlo_computations(text)
    out = {"every step": dict.fromkeys(_KINDS, 0), "in branches": dict.fromkeys(_KINDS, 0)}
    loop = machine_loop(comps, where)
    if loop is None:
        return out
    cond, body = loop
    seen: set[str] = set()

    def walk(name: str, where: str) -> None:
        if name in seen or name not in comps:
            return
        seen.add(name)
        for ln in comps[name]:
            lhs, eq, rhs = ln.partition(" = ")
            op = re.search(r"\s([a-z][a-z\-]*)\(", rhs)  # the opcode follows the (maybe tuple) shape
            if not eq or not op:
                continue
            kind = op.group(1)
            if kind == "fusion" and "scatter" in lhs:
                out[where]["scatter"] += 1
            if kind in _KINDS:
                out[where][kind] += 1
            if kind == "fusion":
                continue
            inner = "in branches" if kind == "conditional" else where
            for m in _CALLED.finditer(ln):
                for callee in ([m.group(1)] if m.group(1) else [x.strip().lstrip("%") for x in m.group(2).split(",")]):
                    walk(callee, inner)

    walk(body, "every step")
    walk(cond, "every step")
    return out


def fmt_step_counts(counts: dict[str, dict[str, int]]) -> str:
    def one(c: dict[str, int]) -> str:
        return (f"{c['fusion']} fusions, {c['copy']} copies, {c['conditional']} conditionals, "
                f"{c['scatter']} scatters" + (f", {c['custom-call']} custom calls" if c["custom-call"] else ""))
    return f"every step: {one(counts['every step'])}; in branches (all summed): {one(counts['in branches'])}"
