"""`pcbatch.Options` and `pcbatch.Tuning`: validated once, named errors, and
the same results whichever way the options are given."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch


def fib(n):
    if n <= 1:
        return n
    return fib(n - 1) + fib(n - 2)


def fib_py(n: int) -> int:
    return n if n <= 1 else fib_py(n - 1) + fib_py(n - 2)


X = jnp.array([0, 1, 5, 9, 3])
WANT = np.array([fib_py(int(n)) for n in X])


@pytest.mark.parametrize("bad, option", [
    (dict(max_stack_depth=0), "max_stack_depth"),
    (dict(max_steps=-3), "max_steps"),
    (dict(max_lanes=2.5), "max_lanes"),
    (dict(lane_width=True), "lane_width"),
    (dict(tape_size="big"), "tape_size"),
    (dict(layout="some"), "layout"),
    (dict(layout=1), "layout"),
    (dict(fork=1), "fork"),
    (dict(axis_name="batch"), "axis_name"),
    (dict(schedule="fastest"), "schedule"),
    (dict(tuning={"max_widths": 2}), "tuning"),
])
def test_bad_option_is_a_named_error_at_decoration(bad, option):
    with pytest.raises(pcbatch.OptionError) as e:
        pcbatch.autobatch(fib, **bad)
    assert e.value.option == option
    with pytest.raises(pcbatch.OptionError) as e:
        pcbatch.Options(**bad)
    message = str(e.value)
    assert message.startswith(f"{option}: ")
    if option not in ("tuning", "schedule"):  # those name the value's type / list the choices instead
        assert repr(bad[option]) in message and "\nHint: " in message


def test_unknown_option_names_the_closest():
    with pytest.raises(pcbatch.OptionError, match="did you mean max_stack_depth") as e:
        pcbatch.autobatch(fib, max_stak_depth=8)
    assert e.value.option == "max_stak_depth"
    with pytest.raises(pcbatch.OptionError, match="unknown"):
        pcbatch.autobatch(fib).with_options(lanes=4)


@pytest.mark.parametrize("bad", [dict(max_widths=0), dict(min_width=-1), dict(switch_max_leaves=-2),
                                 dict(min_lane_width=4096), dict(large_register_bytes=1.5),
                                 dict(masked_follow=1), dict(masked_follow="auto"), dict(carry_stacks=0),
                                 dict(masked_pool_updates="yes"), dict(grad_switch=1)])
def test_bad_tuning_is_a_named_error(bad):
    with pytest.raises(pcbatch.OptionError, match="tuning"):
        pcbatch.Tuning(**bad)


def test_masked_follow_resolves_by_backend():
    import jax
    assert pcbatch.Tuning().follow_masked() == (jax.default_backend() != "cpu")
    assert pcbatch.Tuning(masked_follow=True).follow_masked() is True
    assert pcbatch.Tuning(masked_follow=False).follow_masked() is False


def test_masked_pool_updates_resolve_by_backend():
    import jax
    assert pcbatch.Tuning().pool_updates_masked() == (jax.default_backend() != "cpu")
    assert pcbatch.Tuning(masked_pool_updates=True).pool_updates_masked() is True


def test_grad_switch_resolves_by_backend(monkeypatch):
    import jax
    assert pcbatch.Tuning(grad_switch=True).grad_switched() is True
    monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
    assert pcbatch.Tuning().grad_switched() is False
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert pcbatch.Tuning().grad_switched() is True
    assert pcbatch.Tuning(grad_switch=False).grad_switched() is False


def test_carry_stacks_resolves_by_lanes_and_backend(monkeypatch):
    import jax
    assert [pcbatch.Tuning().switch_carries_stacks(n) for n in (1, 2, 1024)] == [jax.default_backend() != "cpu",
                                                                                 True, True]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert pcbatch.Tuning().switch_carries_stacks(1) is True
    assert pcbatch.Tuning(carry_stacks=False).switch_carries_stacks(1024) is False
    assert pcbatch.Tuning(carry_stacks=True).switch_carries_stacks(1) is True


def test_tuning_widths_halve_to_the_minimum():
    assert pcbatch.Tuning().widths(256) == [256]  # one compiled width by default
    assert pcbatch.Tuning(max_widths=4).widths(256) == [32, 64, 128, 256]
    assert pcbatch.Tuning(max_widths=2).widths(256) == [128, 256]
    assert pcbatch.Tuning(max_widths=4, min_width=100).widths(256) == [128, 256]
    assert pcbatch.Tuning(max_widths=4).widths(20) == [20]


def test_options_object_keywords_and_with_options_agree():
    opts = pcbatch.Options(max_stack_depth=16, fork=False)
    by_object = pcbatch.autobatch(fib, options=opts)
    by_keywords = pcbatch.autobatch(fib, max_stack_depth=16, fork=False)
    changed = pcbatch.autobatch(fib, options=opts, max_stack_depth=32)
    assert by_object.options.max_stack_depth == 16 and not by_object.fork
    assert changed.max_stack_depth == 32 and not changed.fork
    assert by_object.with_options(fork=True).fork and not by_object.fork  # a copy; the original is unchanged
    # (The fork=True copy's machine, a pool compiling for seconds, runs in the tuning cells below.)
    for f in (by_object, by_keywords, changed):
        np.testing.assert_array_equal(f(X), WANT)
    assert opts.replace(max_steps=5).max_steps == 5 and opts.max_steps is None


_TUNINGS = [
    pcbatch.Tuning(max_widths=1),
    pcbatch.Tuning(min_width=1, max_widths=3),
    pcbatch.Tuning(large_register_bytes=1, switch_max_leaves=-1),
    pcbatch.Tuning(lanes_per_example=2, width_per_example=1, min_lane_width=1),
]
# Each cell compiles a machine. `make test` runs each tuning on the machine it changes (the widths
# and lanes on the fork-join pool, registers on one lane per example; max_widths=1, the default
# width, on the latter) and each fork mode; `make test-matrix` the other four cells (for fib,
# two of them compile the very program of a cell kept, the others the default's).
_TUNING_KEPT = {(0, False), (1, True), (2, False), (3, True)}


@pytest.mark.parametrize("tuning, fork", [
    pytest.param(tuning, fork, id=f"tuning{k}-{fork}", marks=() if (k, fork) in _TUNING_KEPT else (pytest.mark.matrix,))
    for k, tuning in enumerate(_TUNINGS) for fork in (True, False)])
def test_tuning_never_changes_results(tuning, fork):
    f = pcbatch.autobatch(fib, fork=fork, tuning=tuning)
    np.testing.assert_array_equal(f(X), WANT)


def test_unknown_tuning_field_is_an_option_error_with_the_closest_name():
    with pytest.raises(pcbatch.OptionError, match="did you mean max_widths"):
        pcbatch.Tuning(max_width=2)


@pytest.mark.parametrize("options, named", [({"max_stack_depth": 2 ** 31}, "max_stack_depth"),
                                            ({"fork": True, "max_lanes": 2 ** 31}, "max_lanes")])
def test_stacks_larger_than_the_device_are_a_named_error(options, named):
    """Before: JAX's raw RESOURCE_EXHAUSTED once XLA tried to allocate them (tens of GiB to TiB)."""
    f = pcbatch.autobatch(fib, **options)
    with pytest.raises(pcbatch.OptionError, match=rf"^{named}: the machine's stacks take .* GiB .* more than"):
        f(jnp.array([3, 5]))
