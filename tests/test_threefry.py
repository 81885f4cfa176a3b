"""`pcbatch.threefry` (threefry unrolled for XLA) equals `jax.random`: keys
and [0, 1) uniforms bit for bit; scaled uniforms and normals to the last bit
or one ulp (XLA may contract the affine map into a fused multiply-add).

`split` and `uniform` are jitted in `threefry` itself; `normal` (which the samplers do
not call) runs under `jax.jit` here, as in a machine: eagerly, each of its ops would
compile a kernel of its own per shape."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pcbatch import threefry

split, uniform = threefry.split, threefry.uniform
normal = jax.jit(threefry.normal, static_argnums=(1, 2))


@pytest.mark.parametrize("seed", [0, 1, 2 ** 31 - 1])
def test_equals_jax_random(seed):
    with jax.threefry_partitionable(True):
        key = jax.random.PRNGKey(seed)
        raw = jax.random.key_data(key)
        for num in (2, 3, 4):
            np.testing.assert_array_equal(split(raw, num), jax.random.split(key, num))
        for shape in ((), (5,), (3, 7)):
            np.testing.assert_array_equal(uniform(raw, shape), jax.random.uniform(key, shape))
            np.testing.assert_allclose(normal(raw, shape), jax.random.normal(key, shape), rtol=3e-7, atol=1e-7)
        np.testing.assert_allclose(uniform(raw, (4,), minval=-2.0, maxval=3.0),
                                   jax.random.uniform(key, (4,), minval=-2.0, maxval=3.0), rtol=3e-7, atol=1e-7)
        # batched, as the machine runs it
        keys = jax.random.split(key, 6)
        np.testing.assert_array_equal(jax.vmap(lambda k: split(k, 4))(jax.random.key_data(keys)),
                                      jax.vmap(lambda k: jax.random.split(k, 4))(keys))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_other_float_dtypes_equal_jax_random(dtype):
    """As JAX draws them: 16 bits for float16, a byte for bfloat16 (a mantissa under 8
    bits), 64 for float64 (the two hash words side by side): the samplers' noise is
    drawn in the positions' dtype (`inputs.split_keys`)."""
    with jax.threefry_partitionable(True), jax.enable_x64(dtype == "float64"):
        key = jax.random.PRNGKey(3)
        raw = jax.random.key_data(key)
        np.testing.assert_array_equal(uniform(raw, (4, 3), dtype), jax.random.uniform(key, (4, 3), dtype))
        got, want = normal(raw, (4, 3), dtype), jax.random.normal(key, (4, 3), dtype)
        assert got.dtype == want.dtype == jnp.dtype(dtype)
        np.testing.assert_array_equal(got, want)


def test_integers_are_refused():
    with pytest.raises(ValueError, match="floats"):
        threefry.uniform(jax.random.key_data(jax.random.PRNGKey(0)), (), jnp.int32)


def test_model_weights_are_jax_randoms_draws():
    """The model zoo draws its weights with `threefry` (one fast compile a shape): the same
    numbers as `jax.random`, from a raw or a typed key; another PRNG falls back to `jax.random`."""
    from pcbatch.models import child_sum
    key = jax.random.PRNGKey(3)
    keys = jax.random.split(key, 5)
    params = child_sum.init_params(key, 50, 8)
    want = {"embed": jax.random.normal(keys[0], (50, 8)) / np.sqrt(np.float32(8)),
            "U_f": jax.random.normal(keys[4], (8, 8)) / np.sqrt(np.float32(8))}
    for name, value in want.items():
        np.testing.assert_allclose(params[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    typed = child_sum.init_params(jax.random.key(3), 50, 8)
    np.testing.assert_array_equal(typed["embed"], params["embed"])
    rbg_key = jax.random.key(3, impl="rbg")
    rbg = child_sum.init_params(rbg_key, 50, 8)
    np.testing.assert_array_equal(rbg["embed"], jax.random.normal(jax.random.split(rbg_key, 5)[0], (50, 8))
                                  / np.sqrt(np.float32(8)))
