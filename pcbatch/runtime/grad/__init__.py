"""Reverse-mode gradients of an autobatched program: a recorded forward loop
and a backward loop that replays the recorded steps in reverse.

`lax.while_loop` has no reverse-mode rule, so `Autobatched` gives the machine
a `jax.custom_jvp` (`Differentiable`) whose tangent is one linear primitive
(`linear.py`): evaluated, it is JAX's forward mode of the plain machine;
transposed, it replays the tape. Without differentiation the plain machine
runs (no tape, same cost as before). Differentiated, the JVP rule runs the
same machine with a `Recorder` riding along its loop
(`loop.while_loop_recorded`) and the backward rule runs a second
`lax.while_loop` that walks the recorded steps from last to first.

The program's straight-line code is differentiated block by block: one block
on a batch of lanes is a pure function (`machine.block_dataflow`, which both
machines run) from what it reads -- registers not assigned earlier in the
block, the stack tops it pops or peeks, the children's return values a Join
gathers, per-example invariants, machine constants -- to what it writes --
float registers and the values it pushes. Control flow (branch conditions,
integers, program counters, stack pointers) gets no cotangent.

Forward (the tape; memory grows with the work executed)
-------------------------------------------------------
Only blocks that write a float value (a register, a push, a child's
parameter) are recorded; the rest cannot move a cotangent. Each recorded step
appends to two kinds of append-only arrays of static capacity:

* the step log: `(block, lanes it ran)`, one entry per step;
* the block's own tape: one row per lane the step ran (compacted: the lanes
  are gathered, nothing is stored for idle lanes), holding the lane, its
  example, the registers the block reads, the stack tops it pops or peeks,
  for a Join the children's lanes and return values, for a Fork the lanes it
  spawned. Stacks are overwritten later, so a popped value is taped at the
  step that reads it.

A pushed value's cotangent must reach the push from the pop that later reads
it. Instead of cotangent stacks mirroring the stacks (`max_stack_depth x
lanes` values each: a GiB for a Tree-LSTM lane pool) every push gets an event
id (its block's tape row) and the recorder keeps, per float stack, the id of
the event whose value each slot holds (`[depth, lanes]` integers); a pop tapes
that id. In the backward pass a pop adds its cotangent at the push's event
and the push reads it there: the stack cotangents are as large as the tape.

Backward (a second while loop, last step first)
-----------------------------------------------
State: a cotangent per float register and lane (`[lanes, ...]`), the event
accumulators of the float stacks, the sums for machine constants, and per
example for invariants. For step t, block b and its n taped rows:

1. Fork (the children were spawned after the block's code): a child's
   parameter cotangent adds into the parent's argument (register, invariant
   or constant); the child lane's cotangents are cleared (the lane held
   someone else's values before the spawn).
2. The cotangents of what b wrote: the registers it assigns (then cleared:
   the values they overwrote were not read afterwards) and its pushes' events.
3. `jax.vjp` of b's code on the n rows (re-run from the taped inputs: the
   block's internal values are not taped, so the tape holds inputs only),
   added into the registers and stack events it read, the children's return
   registers (Join), the invariants' example rows and the constants' sums.

Steps 1-3 compute b's updates under the step's conditional (a `lax.cond`
per block, or one `lax.switch` with `Tuning.grad_switch`); the scatters that
apply them run after it, with every index pointed past its array for the
blocks that did not run. Scattered inside a branch, the cotangent registers
were copied every step unless XLA's copy insertion used region analysis,
which a caller's own `jax.jit` does not; where they are smaller than all the
blocks' masked rows, the scatters stay in the branch (`updates_inside`).

Rows are processed in width buckets (like the lane pool's); padding rows copy
row 0's inputs and get zero cotangents, so junk data never reaches a VJP
(no NaN from `sqrt(0)` or `1/0` of an idle lane). Lowering hoists constants
and invariants out of their blocks into the prelude, which computes them for
every example; the prelude's VJP is masked per example by what the recorded
blocks read (`masked_prelude`), for the same reason.

Why the forward stays cheap: the recorder reads the pre-step state before
the step updates it in place (`while_loop_recorded` makes the step's block
index depend on what the recorder wrote; reading after would make XLA copy
the stacks and registers every step), and it writes only the step's width
bucket of rows (with `Tuning.grad_switch`, every recorded block's bucket,
all but the chosen one's into overflow rows, and every row it gathers feeds
that dependency).

The capacity (`tape_size` rows per block per example) is static. Each block
counts its rows even past the capacity, so an overflow is detected: outside
`jit` the forward is re-run once with a tape large enough (that size is kept
for the signature), or, when the user chose `tape_size`, it raises
`TapeOverflowError` naming the size needed; inside `jit` the gradients are NaN
and a checkify error names it. Examples that overflowed their stacks or ran
out of `max_steps` get NaN gradients (a shared parameter: if any did), never
garbage.

JAX's transformations compose: forward mode (`jax.jvp`, `jax.jacfwd`,
`jax.linearize`, also of a `jit`-compiled caller) evaluates the linear map,
reverse mode transposes it, forward over reverse (`jax.hessian`) is JAX's jvp
of the backward loop, `vmap` batches both sides. Reverse over reverse would
transpose the backward `while_loop`, which JAX cannot (its own error). Eager forward mode alone
skips the tape: `pcbatch/call.py` runs the plain machine under JAX's jvp.

Constants whose values depend on no float input (a `jnp.zeros` of a
parameter's shape) enter the VJPs as plain values: no cotangent is computed
for them (`inert`; the Tree-LSTM's training step 1.06x faster).

Modules, by job: `floats` (float leaves, the only ones with cotangents),
`plan` (what each block reads and writes; tape layout), `recorder` (the
forward: tape rows), `backward` (the reverse loop), `inert` (constants
without a derivative), `prelude` (the prelude's masked VJP), `linear` (the linear primitive and its transpose),
`differentiable` (the custom_jvp tying them together).

>>> import jax, jax.numpy as jnp, pcbatch
>>> @pcbatch.autobatch
... def power(x, n):
...     if n == 0:
...         return 1.0
...     return x * power(x, n - 1)
>>> jax.grad(lambda x: power(x, jnp.array([3, 2])).sum())(jnp.array([2.0, 5.0]))
Array([12., 10.], dtype=float32)
"""
from pcbatch.runtime.grad.differentiable import DEFAULT_TAPE_SIZE, Differentiable, TapeInfo
from pcbatch.runtime.grad.floats import is_float
from pcbatch.runtime.grad.plan import Plan
from pcbatch.runtime.grad.recorder import Recorder
from pcbatch.runtime.grad.backward import Backward

__all__ = ["DEFAULT_TAPE_SIZE", "Backward", "Differentiable", "Plan", "Recorder", "TapeInfo", "is_float"]
