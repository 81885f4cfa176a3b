"""What a user passes `nuts.sample`: bad input is a named pcbatch error (also a ValueError)
before any sampling, and a call under the user's `jax.jit` leaves nothing behind that
breaks later calls (the sampler caches small constants and compiled programs)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pcbatch
from pcbatch.mcmc import nuts


def gaussian(x):
    return -0.5 * jnp.sum(x ** 2)


def laplace(x):
    return -jnp.sum(jnp.abs(x))


KEY = jax.random.PRNGKey(0)
# One shape and length for the tests that only need a run: each (log density, shape, length)
# compiles a sampler once, so these tests share `gaussian`'s and `half_line`'s.
CHAINS, DRAWS = 3, 3


def half_line(x):
    """Support x[0] > 0: -inf outside (a user's bounded parameter, unconstrained wrongly)."""
    return jnp.where(x[0] > 0, -0.5 * jnp.sum(x ** 2), -jnp.inf)


def test_a_jitted_call_caches_no_tracer():
    """The default mass matrix, a scalar step size and the budget are cached arrays: made
    under the first call's jit, they were tracers that broke every later call.
    The positions are closed over, so known inside the jit: the start check's values were
    tracers there (TracerArrayConversionError)."""
    x0 = jnp.ones((CHAINS, 2))
    run = lambda f, k: nuts.sample(f, x0, k, step_size=0.4, num_samples=DRAWS)  # noqa: E731
    inside = jax.jit(lambda k: run(gaussian, k))(KEY)
    eager = run(gaussian, KEY)
    np.testing.assert_array_equal(np.asarray(inside.position), np.asarray(eager.position))
    other = run(half_line, KEY)  # another log density after the jitted call
    assert np.isfinite(np.asarray(other.position)).all()


@pytest.mark.matrix  # window adaptation's differential test (test_adaptation.py) stays in make test
def test_window_adaptation_under_jit_equals_eager():
    run = lambda k: nuts.sample(gaussian, jnp.zeros(2), k, num_warmup=30, num_samples=5,  # noqa: E731
                                adaptation="window", num_chains=3)
    inside, eager = jax.jit(run)(KEY), run(KEY)
    np.testing.assert_array_equal(np.asarray(inside.position), np.asarray(eager.position))


@pytest.mark.parametrize("positions, kwargs, says", [
    ({"a": jnp.zeros((4, 2))}, {}, "ravel_pytree"),
    (jnp.zeros((0, 2)), {}, "at least one chain"),
    (jnp.array([[0.0, jnp.nan], [1.0, 0.0]]), {}, r"chain\(s\) \[0\] are not finite"),
    (jnp.zeros((2, 2)), {"step_size": 0.0}, "step_size must be finite and positive"),
    (jnp.zeros((2, 2)), {"step_size": -0.5}, "step_size must be finite and positive"),
    (jnp.zeros((2, 2)), {"step_size": jnp.array([0.3, jnp.nan])}, "step_size must be finite and positive"),
    (jnp.zeros((2, 2)), {"inverse_mass_matrix": jnp.array([-1.0, 1.0])},
     "inverse_mass_matrix must be finite and positive"),
    # These were raw JAX/Python errors (a broadcast to -1 rows, a string step size), and
    # complex positions lost their imaginary part silently.
    (jnp.zeros(2), {"num_chains": -1}, "num_chains must be a positive integer"),
    (jnp.zeros((2, 2)), {"step_size": "fast"}, "step_size must be an array of numbers"),
    (jnp.zeros((2, 2), jnp.complex64), {}, "initial_positions must be real"),
])
def test_bad_input_is_a_named_error(positions, kwargs, says):
    kwargs = {"step_size": 0.4, **kwargs}
    with pytest.raises(pcbatch.ArgumentError, match=says) as info:
        nuts.sample(gaussian, positions, KEY, num_samples=3, **kwargs)
    assert isinstance(info.value, ValueError)


def test_a_chain_starting_where_the_density_is_not_finite_is_a_named_error():
    # Before: chain 1 stayed at -inf for every draw (energy inf), silently.
    x0 = jnp.ones((CHAINS, 2)).at[1, 0].set(-1.0)
    with pytest.raises(pcbatch.ArgumentError, match=r"1 chain\(s\) \(chain 1: log density -inf\)"):
        nuts.sample(half_line, x0, KEY, num_samples=DRAWS, step_size=0.3)
    with pytest.raises(pcbatch.ArgumentError, match=r"2 chain\(s\) \(chain 0: log density nan"):
        nuts.sample(lambda x: jnp.sum(jnp.log(x)), -jnp.ones((2, 2)), KEY, num_samples=3, step_size=0.3)
    out = nuts.sample(half_line, jnp.ones((CHAINS, 2)), KEY, num_samples=DRAWS, step_size=0.3)  # inside: runs
    assert np.isfinite(np.asarray(out.logdensity)).all()


def test_float64_under_x64_equals_the_chain_by_chain_python():
    # Before: "runs in float32" for float64 positions, and int32 draw buffers under x64.
    with jax.enable_x64(True):
        x0 = jax.random.normal(jax.random.PRNGKey(3), (3, 2), jnp.float64)
        args, per_step, per_mass = nuts.prepare(x0, KEY, 0.3, None, 6)
        prog = nuts.sampler(laplace, num_samples=4, num_warmup=2, per_chain_step_size=per_step,
                            per_chain_mass=per_mass)
        out, status = prog.checked(*args)
        ref = prog.reference(*args)
        assert not np.asarray(status.overflow).any() and not np.asarray(status.unfinished).any()
        assert out.position.dtype == jnp.float64 and out.info.num_integration_steps.dtype == jnp.int64
        assert out.num_draws.dtype == jnp.int64
        np.testing.assert_array_equal(np.asarray(out.info.num_integration_steps),
                                      np.asarray(ref.info.num_integration_steps))
        np.testing.assert_allclose(np.asarray(out.position), np.asarray(ref.position), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(out.step_size), np.asarray(ref.step_size), rtol=1e-10)
        assert (np.asarray(out.step_size) != 0.3).all()   # the warm-up adapted it
        with pytest.raises(pcbatch.ArgumentError, match="float32 \\(or float64 under jax_enable_x64\\)"):
            nuts.sample(laplace, x0.astype(jnp.float16), KEY, num_samples=4, step_size=0.3)


@pytest.mark.parametrize("kwargs, says", [
    ({"num_samples": 2.5}, "num_samples must be an integer"),
    ({"num_samples": 3, "max_delta_energy": -1.0}, "max_delta_energy must be positive"),
    ({"num_samples": 3, "num_warmup": -5}, "num_warmup at least 0"),
    ({"num_samples": None}, "num_samples must be an integer"),
    # A fractional one ran as its floor, a string was int()'s raw ValueError.
    ({"num_samples": 3, "progress_bar": True, "progress_every": 2.5}, "progress_every must be an integer"),
])
def test_bad_settings_are_named_errors(kwargs, says):
    """A fractional `num_samples` ran as its floor and a negative `max_delta_energy` made every
    transition divergent, both silently; a negative total of transitions (or None) was a raw
    error from building the arguments, before the settings were checked."""
    with pytest.raises(pcbatch.ArgumentError, match=says):
        nuts.sample(gaussian, jnp.zeros((2, 2)), KEY, step_size=0.4, **kwargs)


def test_summary_of_fewer_than_four_draws_is_a_named_error():
    assert DRAWS < 4
    out = nuts.sample(gaussian, jnp.zeros((CHAINS, 2)), KEY, step_size=0.4, num_samples=DRAWS)
    with pytest.raises(pcbatch.ArgumentError, match="at least 4 draws"):
        out.summary()


# A cell of (positions' dtype x x64), a compile of its own: make test runs float64 under x64
# (above, against the reference) and float32 without x64 (every other test).
@pytest.mark.matrix
def test_float32_positions_under_x64_stay_float32():
    """The momenta are drawn in the positions' dtype (as BlackJAX does): float64 noise
    promoted the float32 chains, and JAX warned of a float64 scatter into float32 draws.
    A density over float64 data returns float64 for them: its value changed the chain's
    state's type between paths (pcbatch's TypeJoinWarning) and was scattered into float32
    draws; it is cast to the positions' dtype."""
    import warnings
    with jax.enable_x64(True), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", pcbatch.errors.TypeJoinWarning)
        scale = jnp.ones((), jnp.float64)
        out = nuts.sample(lambda x: gaussian(x) * scale, jnp.zeros((2, 3), jnp.float32), KEY, step_size=0.5,
                          num_samples=4)
    assert out.position.dtype == out.logdensity.dtype == jnp.float32
    assert np.isfinite(np.asarray(out.position)).all()


@pytest.mark.parametrize("logdensity, got", [
    (lambda x: -0.5 * x ** 2, r"float32\[2\]"),
    (lambda x: jnp.sum(x > 0).astype(jnp.int32), r"int32\[\]"),
    (lambda x: -0.5 * jnp.sum(x ** 2, keepdims=True), r"float32\[1\]"),
])
def test_a_log_density_that_is_not_a_float_scalar_is_a_named_error(logdensity, got):
    """It was JAX's TypeError from inside the sampler's gradient."""
    with pytest.raises(pcbatch.ArgumentError, match="must return a float scalar .*, got " + got):
        nuts.sample(logdensity, jnp.zeros((2, 2)), KEY, step_size=0.4, num_samples=3)


class ScaledGaussian:
    """A model object as users write them: a dataclass-like class with `__eq__` and no hash
    (so `__hash__` is None), holding an array, as a log density."""
    __hash__ = None

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, ScaledGaussian) and bool(jnp.all(self.scale == other.scale))

    def __call__(self, x):
        return -0.5 * jnp.sum((x / self.scale) ** 2)


def test_an_unhashable_log_density_samples_like_a_function():
    scale = jnp.ones(2)  # unit scales: the model is `gaussian`, whose sampler the tests above compiled
    model = ScaledGaussian(scale)
    run = lambda f: nuts.sample(f, jnp.ones((CHAINS, 2)), KEY, step_size=0.5, num_samples=DRAWS)  # noqa: E731
    out = run(model)
    np.testing.assert_allclose(np.asarray(out.position), np.asarray(run(gaussian).position), rtol=1e-6)
    again = run(model)  # the compiled program is reused, by identity
    np.testing.assert_array_equal(np.asarray(again.position), np.asarray(out.position))
    program = lambda f: nuts.sampler(f, num_samples=DRAWS)  # noqa: E731 (built, not compiled)
    assert program(model) is program(model)
    assert program(ScaledGaussian(scale)) is not program(model)  # another object: another program
