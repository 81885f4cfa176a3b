"""The differential-test corpus: autobatched programs written for ONE example.

Every program is module-level and decorated with `@pcbatch.autobatch(...)`.
Each `Case` pairs a program with

* `example`: a hypothesis strategy for ONE example (a tuple with one value per
  *batched* argument, numpy-typed so that stacking gives int32/float32 arrays),
* `divergent`: hand-picked examples that, batched together, take very
  different paths (recursion depths, zero-trip loops, early returns, ...),
* `shared`: values of the `in_axes=None` arguments, by argument position.

Sizes are kept small so that recursion and loop counts stay modest.

Constructs covered (issue 2, "Supported Python"), with the programs that use them:
  assignment / tuple unpacking / augmented assignment: collatz, digit_stats, divmod_rec, bubble_sort
  arithmetic, comparison, `and`/`or`/`not`, chained comparisons: classify, or_values, count_primes
  short-circuit guarding a recursive call: tri_guard, has_factor, odd_digits
  jnp / lax expressions: newton, simulate, prefix_sums
  indexing per-example arrays: argmax_prefix, bubble_sort, dot_rec, minmax_rec, comp_sum
  indexing shared (in_axes=None) arrays: poly, bsearch, bsearch_rec, table_walk
  if / elif / else: classify, grade
  conditional expressions: collatz, sum_ifexp, sign_mix
  while with data-dependent conditions: collatz, count_primes, halvings, bsearch
  for i in range(a, b, step) (data-dependent bounds, negative and dynamic steps): range_sum, range_forms, poly
  break / continue / pass: loop_mix, count_primes, find_pair, with_pass, fib_sum
  early return, return inside loops: loop_mix, find_pair, first_square_above, search_loop
  recursion, mutual recursion (both definition orders): fib, is_even/is_odd, hof_m/hof_f
  calls inside loops (and in a while condition): fib_sum, search_loop, fib_index
  nested calls in arguments: ack, mc91, hof_m/hof_f
  parameter swaps / permutations: gcd, hanoi, two_calls
  multiple return values, tuple / dict / NamedTuple returns: divmod_rec, poly, digit_stats, minmax_rec
  pytree arguments: simulate, dot_rec, tree_sum
  shared pytree params passed through recursion: tree_sum
  type joins: half_sum, mixed_return, loop_mix, tri_guard
  ordinary Python helpers (inlined): helper_user
  float and int programs: throughout
  keyword arguments and default parameter values: power, scaled_count, has_factor
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

import pcbatch


# --------------------------------------------------------------------------
# strategies for one example
# --------------------------------------------------------------------------

def ints(lo: int, hi: int) -> st.SearchStrategy:
    return st.integers(lo, hi).map(np.int32)


def floats(lo: float, hi: float) -> st.SearchStrategy:
    return st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False).map(np.float32)


def int_vec(n: int, lo: int, hi: int) -> st.SearchStrategy:
    return st.lists(st.integers(lo, hi), min_size=n, max_size=n).map(lambda v: np.asarray(v, np.int32))


def float_vec(n: int, lo: float, hi: float) -> st.SearchStrategy:
    return st.lists(st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False),
                    min_size=n, max_size=n).map(lambda v: np.asarray(v, np.float32))


def i32(*xs: int) -> tuple:
    return tuple(np.int32(x) for x in xs)


def f32(*xs: float) -> tuple:
    return tuple(np.float32(x) for x in xs)


@dataclass(frozen=True)
class Case:
    fn: Any                                  # the Autobatched program
    example: st.SearchStrategy               # one example: tuple of batched args
    divergent: tuple                         # tuple of example tuples
    shared: dict = field(default_factory=dict)   # position -> in_axes=None value
    is_float: bool = False

    @property
    def name(self) -> str:
        return self.fn.__name__

    def args(self, examples: list[tuple]) -> tuple:
        """Stack per-example tuples into batched args and insert shared ones."""
        batched = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *examples)
        batched = list(batched)
        out = []
        for pos in range(len(batched) + len(self.shared)):
            out.append(self.shared[pos] if pos in self.shared else batched.pop(0))
        return tuple(out)

    def batch(self, size: int) -> list[tuple]:
        """The divergent examples, cycled to exactly `size`."""
        return [self.divergent[i % len(self.divergent)] for i in range(size)]


# --------------------------------------------------------------------------
# plain Python helpers (not decorated: inlined as primitive code)
# --------------------------------------------------------------------------

def _square(v):
    return v * v


def _clip(v, lo, hi):
    return jnp.minimum(jnp.maximum(v, lo), hi)


class Stats(NamedTuple):
    count: Any
    total: Any
    mean: Any


# --------------------------------------------------------------------------
# the programs
# --------------------------------------------------------------------------

@pcbatch.autobatch
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


@pcbatch.autobatch
def gcd(a, b):
    if b == 0:
        return a
    return gcd(b, a % b)


@pcbatch.autobatch
def ack(m, n):
    if m == 0:
        return n + 1
    if n == 0:
        return ack(m - 1, 1)
    return ack(m - 1, ack(m, n - 1))


# Mutual recursion, callee defined AFTER the caller ...
@pcbatch.autobatch
def is_even(n):
    if n == 0:
        return True
    return is_odd(n - 1)


@pcbatch.autobatch
def is_odd(n):
    if n == 0:
        return False
    return is_even(n - 1)


# ... and Hofstadter's female/male sequences: each calls the other, with
# nested calls in the arguments.
@pcbatch.autobatch
def hof_m(n):
    if n == 0:
        return 0
    return n - hof_f(hof_m(n - 1))


@pcbatch.autobatch
def hof_f(n):
    if n == 0:
        return 1
    return n - hof_m(hof_f(n - 1))


@pcbatch.autobatch
def loop_mix(n):
    acc = 0
    for i in range(n):
        if i % 3 == 0:
            continue
        if i > 10:
            break
        acc = acc + 0.5 * i
    j = 0
    while True:
        j += 1
        if j * j > n:
            return acc, j
    return acc, -1


@pcbatch.autobatch(in_axes=(None, 0))
def poly(coeffs, x):
    out = 0.0
    for k in range(coeffs.shape[0] - 1, -1, -1):
        out = out * x + coeffs[k]
    return {"y": out, "x": x}


@pcbatch.autobatch(in_axes=(None, 0))
def tree_sum(params, n):
    W = params["w"]
    if n <= 0:
        return W[0]
    return tree_sum(params, n - 1) * 0.5 + tree_sum(params, n - 2) + W[1] * params["b"]


@pcbatch.autobatch
def range_sum(a, b, step):
    total = 0
    count = 0
    for i in range(a, b, step):
        total += i * count
        count += 1
    return total, count


@pcbatch.autobatch
def range_forms(n):
    s1 = 0
    for i in range(n):
        s1 += i
    s2 = 0
    for i in range(2, n):
        s2 += i * i
    s3 = 0
    for i in range(n, -1, -3):
        s3 = s3 * 2 + i
    s4 = 0
    for i in range(n - 5, n + 5, 4):
        s4 = s4 * 3 - i
    return s1, s2, s3, s4


@pcbatch.autobatch
def classify(x, lo, hi):
    inside = lo <= x < hi
    if inside and not x == 0:
        return 1
    elif x < lo or x >= hi and x != 7:
        return 2 if not (x % 2 == 0) else 3
    elif lo < hi < x:
        return 4
    else:
        return 0


@pcbatch.autobatch
def or_values(x, y):
    a = x or 7
    b = x and y
    c = not x
    d = (x > 0) != (y > 0)
    return a, b, c, d


@pcbatch.autobatch
def tri_guard(n):
    return n > 0 and n + tri_guard(n - 1)


@pcbatch.autobatch
def has_factor(n, d=2):
    return d * d <= n and (n % d == 0 or has_factor(n, d + 1))


@pcbatch.autobatch
def odd_digits(n):
    return n == 0 or (n % 2 == 1 and odd_digits(n // 10))


@pcbatch.autobatch
def find_pair(n, target):
    for i in range(1, n):
        for j in range(i, n):
            if i * j == target:
                return i, j
            if i * j > target:
                break
    return -1, -1


@pcbatch.autobatch
def count_primes(n):
    count = 0
    k = 2
    while k < n:
        d = 2
        is_prime = True
        while d * d <= k:
            if k % d == 0:
                is_prime = False
                break
            d += 1
        k += 1
        if not is_prime:
            continue
        count += 1
    return count


@pcbatch.autobatch
def fib_sum(n):
    s = 0
    for i in range(n):
        if i % 2 == 1:
            continue
        s += fib(i)
    return s


@pcbatch.autobatch
def search_loop(n, k):
    i = 0
    while i < n:
        if gcd(i, k) > 1 and fib(i % 8) % 2 == 0:
            return i
        i += 1
    return -1


@pcbatch.autobatch
def divmod_rec(a, b):
    if a < b:
        return 0, a
    q, r = divmod_rec(a - b, b)
    return q + 1, r


@pcbatch.autobatch
def digit_stats(n):
    count = 0
    total = 0
    while n > 0:
        n, d = n // 10, n % 10
        count += 1
        total += d
    mean = total / jnp.maximum(count, 1)
    return Stats(count, total, mean)


@pcbatch.autobatch
def simulate(state, n):
    pos = state["pos"]
    vel = state["vel"]
    for _ in range(n):
        vel = vel - 0.125 * pos
        pos = pos + 0.125 * vel
    out = {"pos": pos, "vel": vel}
    return jax.tree_util.tree_map(lambda a: a * 2.0, out)


@pcbatch.autobatch
def argmax_prefix(xs, n):
    best = xs[0]
    idx = 0
    for i in range(1, n):
        if xs[i] > best:
            best = xs[i]
            idx = i
    return idx, best


@pcbatch.autobatch(in_axes=(None, 0))
def bsearch(table, target):
    lo = 0
    hi = table.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if table[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@pcbatch.autobatch(in_axes=(None, 0, 0, 0))
def bsearch_rec(table, target, lo, hi):
    if lo >= hi:
        return lo
    mid = (lo + hi) // 2
    if table[mid] < target:
        return bsearch_rec(table, target, mid + 1, hi)
    return bsearch_rec(table, target, lo, mid)


@pcbatch.autobatch(in_axes=(None, 0))
def table_walk(table, start):
    """Follow a shared successor table until it reaches 0; count hops."""
    i = start
    hops = 0
    while table[i] != 0 and hops < 20:
        i = table[i]
        hops += 1
    return i, hops


@pcbatch.autobatch
def newton(x, iters):
    y = jnp.maximum(x, 1.0)
    for _ in range(iters):
        y = 0.5 * (y + x / y)
    z = lax.integer_pow(y, 2) * 0.01
    return y, jnp.tanh(z), lax.clamp(0.0, y, 2.0)


@pcbatch.autobatch
def halvings(x):
    k = 0
    while x > 1.0:
        x = x / 2.0
        k += 1
    return k, x


@pcbatch.autobatch
def half_sum(n):
    acc = 0
    for i in range(n):
        acc = acc + 0.5 * i
    return acc


@pcbatch.autobatch
def mixed_return(n):
    if n < 0:
        return 0
    if n % 2 == 0:
        return n * 0.25
    return n


@pcbatch.autobatch
def helper_user(n):
    s = 0
    for i in range(n):
        s += _clip(_square(i) - 10, 0, 50)
    return s + _square(n)


@pcbatch.autobatch
def power(x, n, acc=1.0):
    if n == 0:
        return acc
    if n % 2 == 1:
        return power(x, n - 1, acc=acc * x)
    return power(n=n // 2, x=x * x, acc=acc)


@pcbatch.autobatch
def scaled_count(n, k=3, offset=0):
    if n <= 0:
        return offset
    if n % 2 == 0:
        return scaled_count(n - 1, offset=offset + k)
    return scaled_count(n - 1, 1, offset=offset * 2)


@pcbatch.autobatch
def with_pass(n):
    out = 0
    for i in range(n):
        if i % 3 == 0:
            pass
        elif i % 3 == 1:
            out += i
        else:
            pass
    if n > 5:
        pass
    return out


@pcbatch.autobatch
def sum_ifexp(n):
    return 0 if n <= 0 else n + sum_ifexp(n - 1)


@pcbatch.autobatch
def sign_mix(x):
    s = 1 if x > 0 else (-1 if x < 0 else 0)
    return s * (x if x % 2 == 0 else 2 * x)


@pcbatch.autobatch
def grade(x):
    if x < 10:
        g = 0
    elif x < 20:
        g = 1
    elif x < 30:
        g = 2
    else:
        g = 3
    return g


@pcbatch.autobatch
def hanoi(n, a, b, c):
    if n == 0:
        return 0
    return hanoi(n - 1, a, c, b) + (a * 3 + b) + 7 * hanoi(n - 1, c, b, a)


@pcbatch.autobatch
def two_calls(n, a):
    if n == 0:
        return 0
    x = two_calls(n - 1, a + 1)
    y = two_calls(n - 1, a)
    return x + a + 10 * y


@pcbatch.autobatch
def fib_index(n):
    k = 0
    while fib(k) < n:
        k += 1
    return k


@pcbatch.autobatch
def fib_iter(n):
    state = (0, 1)
    for _ in range(n):
        state = (state[1], state[0] + state[1])
    return state


@pcbatch.autobatch(max_stack_depth=256)
def mc91(n):
    if n > 100:
        return n - 10
    return mc91(mc91(n + 11))


@pcbatch.autobatch
def partitions(n, k):
    if n == 0:
        return 1
    if n < 0 or k == 0:
        return 0
    return partitions(n - k, k) + partitions(n, k - 1)


@pcbatch.autobatch
def first_square_above(n):
    j = 0
    while True:
        j += 1
        if j * j > n:
            return j


@pcbatch.autobatch
def bubble_sort(xs, n):
    swapped = True
    while swapped:
        swapped = False
        for i in range(n - 1):
            a, b = xs[i], xs[i + 1]
            if a > b:
                xs = xs.at[i].set(b).at[i + 1].set(a)
                swapped = True
    return xs


@pcbatch.autobatch
def prefix_sums(xs):
    out = jnp.zeros_like(xs)
    total = 0
    for i in range(xs.shape[0]):
        total = total + xs[i]
        out = out.at[i].set(total)
    return out


@pcbatch.autobatch
def dot_rec(pair, n):
    xs, ys = pair
    if n <= 0:
        return 0.0
    return xs[n - 1] * ys[n - 1] + dot_rec(pair, n - 1)


@pcbatch.autobatch
def minmax_rec(xs, n):
    if n == 1:
        return {"lo": xs[0], "hi": xs[0]}
    sub = minmax_rec(xs, n - 1)
    return {"lo": jnp.minimum(sub["lo"], xs[n - 1]), "hi": jnp.maximum(sub["hi"], xs[n - 1])}


@pcbatch.autobatch
def comp_sum(xs, k):
    base = sum([xs[j] * (j + 1) for j in range(3)])
    while k > 0:
        base = base - k
        k -= 1
    return base


# --------------------------------------------------------------------------
# the cases
# --------------------------------------------------------------------------

TABLE = np.asarray([1, 3, 3, 4, 8, 9, 12, 15, 15, 20, 21, 30, 31, 40, 41, 50], np.int32)
SUCC = np.asarray([0, 5, 0, 1, 2, 9, 4, 6, 3, 8], np.int32)  # i -> SUCC[i]; 0 stops
COEFFS = np.asarray([1.0, -2.0, 0.5, 3.0], np.float32)
PARAMS = {"w": np.asarray([1.0, 2.0], np.float32), "b": np.float32(0.25)}

CASES: list[Case] = [
    Case(fib, st.tuples(ints(0, 12)), (i32(0), i32(1), i32(12), i32(5), i32(2))),
    Case(collatz, st.tuples(ints(1, 100)), (i32(1), i32(27), i32(2), i32(97), i32(16))),
    Case(gcd, st.tuples(ints(0, 300), ints(0, 300)),
         (i32(12, 18), i32(0, 0), i32(7, 0), i32(0, 9), i32(233, 144), i32(100, 75))),
    Case(ack, st.tuples(ints(0, 2), ints(0, 4)), (i32(0, 0), i32(2, 4), i32(3, 1), i32(1, 0), i32(0, 4))),
    Case(is_even, st.tuples(ints(0, 40)), (i32(0), i32(1), i32(40), i32(7))),
    Case(is_odd, st.tuples(ints(0, 40)), (i32(0), i32(39), i32(2), i32(13))),
    Case(hof_m, st.tuples(ints(0, 8)), (i32(0), i32(8), i32(1), i32(5))),
    Case(hof_f, st.tuples(ints(0, 8)), (i32(0), i32(8), i32(2), i32(6))),
    Case(loop_mix, st.tuples(ints(0, 40)), (i32(0), i32(1), i32(40), i32(12), i32(4)), is_float=True),
    Case(poly, st.tuples(floats(-2.0, 2.0)), (f32(0.0), f32(1.0), f32(-2.0), f32(0.5)),
         shared={0: COEFFS}, is_float=True),
    Case(tree_sum, st.tuples(ints(-2, 7)), (i32(-2), i32(0), i32(7), i32(1), i32(4)),
         shared={0: PARAMS}, is_float=True),
    Case(range_sum, st.tuples(ints(-10, 10), ints(-10, 10), st.sampled_from([-3, -2, -1, 1, 2, 3]).map(np.int32)),
         (i32(0, 10, 1), i32(10, 0, 1), i32(10, -10, -3), i32(-10, 10, -1), i32(5, 5, 2), i32(-7, 9, 2))),
    Case(range_forms, st.tuples(ints(-3, 20)), (i32(-3), i32(0), i32(20), i32(2), i32(7))),
    Case(classify, st.tuples(ints(-10, 10), ints(-5, 5), ints(-5, 5)),
         (i32(0, -5, 5), i32(3, -5, 5), i32(7, 0, 5), i32(8, 0, 5), i32(-9, 0, 5), i32(9, 1, 2), i32(2, 2, 2))),
    Case(or_values, st.tuples(ints(-3, 3), ints(-3, 3)), (i32(0, 0), i32(0, 5), i32(2, 0), i32(-1, 3))),
    Case(tri_guard, st.tuples(ints(-3, 40)), (i32(-3), i32(0), i32(40), i32(1))),
    Case(has_factor, st.tuples(ints(0, 300)), (i32(0), i32(1), i32(4), i32(293), i32(289), i32(97))),
    Case(odd_digits, st.tuples(ints(0, 100000)), (i32(0), i32(13579), i32(2), i32(99999), i32(19))),
    Case(find_pair, st.tuples(ints(0, 12), ints(0, 60)),
         (i32(0, 5), i32(12, 1), i32(12, 59), i32(3, 4), i32(10, 36), i32(12, 0))),
    Case(count_primes, st.tuples(ints(0, 60)), (i32(0), i32(3), i32(60), i32(2), i32(30))),
    Case(fib_sum, st.tuples(ints(0, 12)), (i32(0), i32(12), i32(1), i32(5))),
    Case(search_loop, st.tuples(ints(0, 20), ints(1, 12)), (i32(0, 3), i32(20, 1), i32(20, 12), i32(9, 7))),
    Case(divmod_rec, st.tuples(ints(0, 40), ints(1, 6)), (i32(0, 1), i32(40, 1), i32(3, 6), i32(37, 5))),
    Case(digit_stats, st.tuples(ints(0, 10**6)), (i32(0), i32(7), i32(999999), i32(10), i32(120034)),
         is_float=True),
    Case(simulate, st.tuples(st.fixed_dictionaries({"pos": float_vec(2, -4.0, 4.0), "vel": float_vec(2, -4.0, 4.0)}),
                             ints(0, 10)),
         (({"pos": np.asarray([1.0, 0.0], np.float32), "vel": np.asarray([0.0, 1.0], np.float32)}, np.int32(0)),
          ({"pos": np.asarray([-3.0, 2.5], np.float32), "vel": np.asarray([1.0, -1.0], np.float32)}, np.int32(10)),
          ({"pos": np.asarray([0.5, 0.5], np.float32), "vel": np.asarray([2.0, 0.0], np.float32)}, np.int32(3))),
         is_float=True),
    Case(argmax_prefix, st.tuples(int_vec(8, -50, 50), ints(1, 8)),
         ((np.arange(8, dtype=np.int32), np.int32(1)), (np.arange(8, dtype=np.int32), np.int32(8)),
          (np.asarray([5, 9, -1, 9, 30, 0, 2, 1], np.int32), np.int32(6)))),
    Case(bsearch, st.tuples(ints(-5, 60)), (i32(-5), i32(60), i32(15), i32(1), i32(22)), shared={0: TABLE}),
    Case(bsearch_rec, st.tuples(ints(-5, 60), st.just(np.int32(0)), st.sampled_from([0, 1, 8, 16]).map(np.int32)),
         (i32(-5, 0, 16), i32(60, 0, 16), i32(15, 0, 0), i32(20, 0, 8), i32(9, 0, 1)), shared={0: TABLE}),
    Case(table_walk, st.tuples(ints(0, 9)), (i32(0), i32(1), i32(7), i32(2), i32(9)), shared={0: SUCC}),
    Case(newton, st.tuples(floats(0.0, 100.0), ints(0, 6)),
         (f32(0.0) + i32(0), f32(2.0) + i32(6), f32(100.0) + i32(3), f32(0.25) + i32(1)), is_float=True),
    Case(halvings, st.tuples(floats(0.0, 1000.0)), (f32(0.0), f32(1.0), f32(1000.0), f32(1.5), f32(-3.0)),
         is_float=True),
    Case(half_sum, st.tuples(ints(0, 30)), (i32(0), i32(30), i32(1), i32(7)), is_float=True),
    Case(mixed_return, st.tuples(ints(-5, 20)), (i32(-5), i32(4), i32(7), i32(0), i32(19)), is_float=True),
    Case(helper_user, st.tuples(ints(0, 15)), (i32(0), i32(15), i32(3), i32(8))),
    Case(power, st.tuples(floats(-2.0, 2.0), ints(0, 10)),
         (f32(2.0) + i32(0), f32(-1.5) + i32(10), f32(0.5) + i32(7), f32(0.0) + i32(3)), is_float=True),
    Case(scaled_count, st.tuples(ints(-2, 20)), (i32(-2), i32(0), i32(20), i32(1), i32(9))),
    Case(with_pass, st.tuples(ints(0, 20)), (i32(0), i32(20), i32(2), i32(6))),
    Case(sum_ifexp, st.tuples(ints(-3, 50)), (i32(-3), i32(0), i32(50), i32(1))),
    Case(sign_mix, st.tuples(ints(-20, 20)), (i32(-20), i32(-7), i32(0), i32(7), i32(20))),
    Case(grade, st.tuples(ints(-5, 40)), (i32(-5), i32(10), i32(19), i32(29), i32(30), i32(40))),
    Case(hanoi, st.tuples(ints(0, 6), ints(0, 2), ints(0, 2), ints(0, 2)),
         (i32(0, 0, 1, 2), i32(6, 0, 1, 2), i32(3, 2, 0, 1), i32(1, 1, 2, 0))),
    Case(two_calls, st.tuples(ints(0, 5), ints(-5, 5)), (i32(0, 1), i32(5, -5), i32(1, 3), i32(2, 1), i32(3, 0))),
    Case(fib_index, st.tuples(ints(0, 150)), (i32(0), i32(150), i32(1), i32(2), i32(50))),
    Case(fib_iter, st.tuples(ints(0, 30)), (i32(0), i32(30), i32(1), i32(9))),
    Case(mc91, st.tuples(ints(0, 120)), (i32(0), i32(101), i32(120), i32(90), i32(100))),
    Case(partitions, st.tuples(ints(0, 10), ints(0, 10)), (i32(0, 0), i32(10, 10), i32(5, 0), i32(10, 1), i32(7, 3))),
    Case(first_square_above, st.tuples(ints(0, 400)), (i32(0), i32(400), i32(3), i32(99))),
    Case(bubble_sort, st.tuples(int_vec(6, -20, 20), ints(0, 6)),
         ((np.asarray([6, 5, 4, 3, 2, 1], np.int32), np.int32(6)),
          (np.asarray([6, 5, 4, 3, 2, 1], np.int32), np.int32(0)),
          (np.asarray([1, 2, 3, 4, 5, 6], np.int32), np.int32(6)),
          (np.asarray([3, -1, 3, 0, 9, -7], np.int32), np.int32(4)))),
    Case(prefix_sums, st.tuples(int_vec(5, -100, 100)),
         ((np.zeros(5, np.int32),), (np.asarray([1, -2, 3, -4, 5], np.int32),))),
    Case(dot_rec, st.tuples(st.tuples(float_vec(6, -3.0, 3.0), float_vec(6, -3.0, 3.0)), ints(0, 6)),
         (((np.ones(6, np.float32), np.arange(6, dtype=np.float32)), np.int32(0)),
          ((np.ones(6, np.float32), np.arange(6, dtype=np.float32)), np.int32(6)),
          ((np.full(6, 0.5, np.float32), np.full(6, -2.0, np.float32)), np.int32(3))),
         is_float=True),
    Case(minmax_rec, st.tuples(float_vec(6, -10.0, 10.0), ints(1, 6)),
         ((np.arange(6, dtype=np.float32), np.int32(1)), (np.arange(6, dtype=np.float32), np.int32(6)),
          (np.asarray([3.0, -1.0, 7.5, 0.0, 2.0, -8.0], np.float32), np.int32(5))),
         is_float=True),
    Case(comp_sum, st.tuples(int_vec(3, -10, 10), ints(-2, 10)),
         ((np.asarray([1, 2, 3], np.int32), np.int32(-2)), (np.asarray([1, 2, 3], np.int32), np.int32(10)),
          (np.asarray([0, 0, 0], np.int32), np.int32(1)))),
]

CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES) >= 30
