"""New-style typed PRNG keys (`jax.random.key`, dtype `key<fry>`) as
arguments (batched and shared), locals reassigned in loops, values kept on the
stacks across recursive calls, results (also in pytrees) and under
`jax.grad`: each result is compared with the plain Python function run
example by example."""
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

import pcbatch
from pcbatch.errors import TypeMismatchError, UnsupportedSyntaxError

KEYS = jax.random.split(jax.random.key(0), 4)
NS = jnp.array([0, 1, 3, 2])


def plain(leaf):
    """A key as its key data (uint32), anything else as a NumPy array."""
    return np.asarray(jax.random.key_data(leaf)) if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key) \
        else np.asarray(leaf)


def same(got, want):
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(plain(g), plain(w), rtol=1e-6)


def per_example(fn, *args, shared=()):
    """`fn` run on each example in a Python loop, results stacked (the
    positions in `shared` are passed whole)."""
    batch = len(NS)
    outs = [fn(*(a if k in shared else jax.tree_util.tree_map(lambda x: x[i], a) for k, a in enumerate(args)))
            for i in range(batch)]
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *outs)


def walk(key, n):
    if n <= 0:
        return jax.random.uniform(key)
    k1, k2 = jax.random.split(key)
    a = walk(k1, n - 1)  # `key` is live across both calls: kept on a stack
    b = walk(k2, n - 2)
    return a + b * jax.random.normal(key)


@pytest.mark.parametrize("fork", [False, True])
def test_a_key_argument_through_recursion(fork):
    want = per_example(walk, KEYS, NS)
    f = pcbatch.autobatch(walk, fork=fork)
    same(f(KEYS, NS), want)
    same(f.reference(KEYS, NS), want)


def chain(seed, n):
    key = jax.random.key(seed)
    draws = 0.0
    while n > 0:  # the key is reassigned around the loop
        key, sub = jax.random.split(key)
        draws = draws + jax.random.uniform(sub)
        n = n - 1
    return {"key": key, "draws": draws}


def test_a_key_made_inside_reassigned_in_a_loop_and_returned():
    seeds = jnp.array([3, 1, 4, 1])
    want = per_example(chain, seeds, NS)
    f = pcbatch.autobatch(chain, fork=False)
    same(f(seeds, NS), want)
    same(jax.jit(f)(seeds, NS), want)
    same(f.reference(seeds, NS), want)  # the reference stacks the keys (a raw TypeError before)


def descend(key, n):
    if n <= 0:
        return key, jax.random.uniform(key)
    return descend(jax.random.fold_in(key, n), n - 1)


def test_a_returned_key_with_forks_and_a_shared_key():
    f = pcbatch.autobatch(descend, fork=True)
    same(f(KEYS, NS), per_example(descend, KEYS, NS))
    shared = pcbatch.autobatch(descend, fork=True, in_axes=(None, 0))
    same(shared(KEYS[1], NS), per_example(descend, KEYS[1], NS, shared=(0,)))


def scaled(x, key, n):
    if n <= 0:
        return x * jax.random.normal(key)
    return x * scaled(x, jax.random.fold_in(key, n), n - 1)


def test_grad_with_a_key_argument():
    xs = jnp.array([1.0, 2.0, -1.0, 0.5])
    want = per_example(jax.grad(scaled), xs, KEYS, NS)
    f = pcbatch.autobatch(scaled, fork=False)
    dx, dkey = jax.grad(lambda x, k: f(x, k, NS).sum(), argnums=(0, 1), allow_int=True)(xs, KEYS)
    np.testing.assert_allclose(dx, want, rtol=1e-6)
    assert dkey.dtype == jax.dtypes.float0 and dkey.shape == KEYS.shape  # a key's tangent


def key_or_count(key, n):
    k = key
    if n > 1:
        k = n
    return k


def test_a_key_joined_with_a_number_is_a_named_error():
    with pytest.raises(TypeMismatchError, match="typed PRNG key"):
        pcbatch.autobatch(key_or_count)(KEYS, NS)


def uniform_of(key, n):
    return jax.random.uniform(jax.random.fold_in(key, n))


def rbg_inside(n):
    key = jax.random.key(n, impl="rbg")
    return jax.random.uniform(key)


def rbg_in_one_line(n):
    return jax.random.uniform(jax.random.key(n, impl="rbg"))  # no variable holds the key


def raw_key_in_one_line(n):
    return jax.random.uniform(jax.random.PRNGKey(n))  # a raw uint32 key, rbg under the default below


def bit_generator(n):
    return lax.rng_bit_generator(jnp.stack([n, n, n, n]).astype(jnp.uint32), (2,))[1]


def test_rbg_keys_are_a_named_error():
    # JAX batches rbg's random bits untruly (google/jax#20094): no batched run could match the Python
    rbg = jax.random.split(jax.random.key(0, impl="rbg"), 4)
    assert not np.allclose(jax.vmap(uniform_of)(rbg, NS), per_example(uniform_of, rbg, NS))
    with pytest.raises(UnsupportedSyntaxError, match="rbg"):
        pcbatch.autobatch(uniform_of)(rbg, NS)
    with pytest.raises(UnsupportedSyntaxError, match="rbg"):
        pcbatch.autobatch(rbg_inside)(NS)
    with pytest.raises(UnsupportedSyntaxError, match="rbg") as err:
        pcbatch.autobatch(rbg_in_one_line)(NS)
    assert "no variable holds the key" in str(err.value)  # it quotes the line
    with pytest.raises(UnsupportedSyntaxError, match="rng_bit_generator"):
        pcbatch.autobatch(bit_generator)(NS.astype(jnp.uint32))


def test_raw_keys_under_an_rbg_default_are_a_named_error():
    ns = jnp.arange(4, dtype=jnp.uint32)
    with jax.default_prng_impl("rbg"):
        # The trap: batched, rbg draws other numbers than one example at a time.
        assert not np.allclose(jax.vmap(raw_key_in_one_line)(ns), per_example(raw_key_in_one_line, ns))
        with pytest.raises(UnsupportedSyntaxError, match="rbg"):
            pcbatch.autobatch(raw_key_in_one_line)(ns)
    # Under the default (threefry) the same function runs and equals the Python.
    np.testing.assert_array_equal(pcbatch.autobatch(raw_key_in_one_line)(ns), per_example(raw_key_in_one_line, ns))
