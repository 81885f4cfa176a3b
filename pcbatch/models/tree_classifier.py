"""Training a Tree-LSTM classifier with gradients through pcbatch (issue 6).

The encoder is the binary Tree-LSTM `nary.nary_tree_lstm`, written for ONE
tree and autobatched (fork-join); a linear layer on the root's `h` gives the
class logits. `jax.grad` of the loss runs pcbatch's recorded forward and
replayed backward (`pcbatch.runtime.grad`); optax's Adam updates the
parameters. The task is synthetic (`labelled_trees`): random binary trees
(`pcbatch.data.random_binary_trees`) whose label follows from their words
*and* their structure (`left_majority`).

    train_set = labelled_trees(512, seed=0)
    test_set = labelled_trees(256, seed=1)
    params = init_params(jax.random.PRNGKey(0), vocab=VOCAB, hidden=32)
    params, history = train(params, train_set, test_set, steps=150)
    history[-1]["test_accuracy"]        # well above chance (0.5)

See `examples/train_treelstm.py`.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pcbatch.data import Tree, batch, random_binary_trees
from pcbatch.models import nary
from pcbatch.models._common import dense, split

__all__ = ["VOCAB", "LabelledTrees", "accuracy", "encoder", "init_params", "labelled_trees", "left_majority",
           "logits", "loss", "make_step", "train"]

#: Words 0 .. VOCAB/2 - 1 are "positive", the rest "negative".
VOCAB = 100

#: The Tree-LSTM used for training, sized for trees of up to 64 leaves (the
#: sizes matter: a jitted training step allocates, and zero-fills, the stacks
#: and the gradient tape every call). Fork-join gives every node a lane of
#: its own (the pool holds 128 per example), so no lane recurses: 2 stack
#: frames are slack enough (the model's default is 128; every frame costs
#: `lanes x (2 H + 3) x 4` bytes, 4 MiB per frame at batch 32, H 128, and a
#: step whose temporary memory passes glibc's 32 MiB mmap threshold gets
#: fresh pages, page-faulted, every call: 8 frames made the step 1.3x
#: slower). The tape holds 64 rows per block per example: a leaf runs the
#: leaf block once, an internal node the join block once (with `fork=False`
#: one block runs for every node: pass `tape_size=128`;
#: `encoder.tape_info(...)` says what a batch needs). Larger trees raise
#: `StackOverflowError` / `TapeOverflowError` (under jit: NaN and a checkify
#: error), never silently wrong; `with_options` changes both.
encoder = nary.nary_tree_lstm.with_options(fork=True, max_stack_depth=2, tape_size=64)


class LabelledTrees(NamedTuple):
    """A batch of trees (`data.Tree`, leading batch axis) and their labels."""

    trees: Tree
    labels: np.ndarray


def _subtree_words(tree: Tree, node: int) -> list[int]:
    stack, words = [node], []
    while stack:
        j = stack.pop()
        left, right = int(tree.children[j, 0]), int(tree.children[j, 1])
        if left < 0:
            words.append(int(tree.word[j]))
        else:
            stack += [left, right]
    return words


def left_majority(tree: Tree, vocab: int = VOCAB) -> int:
    """The label of one tree: 1 if the root's LEFT subtree has more positive
    words (id < vocab / 2) than negative ones, else 0; a single leaf: its own
    polarity. It depends on the words and on where the root splits them."""
    root = int(tree.root)
    left = int(tree.children[root, 0])
    words = _subtree_words(tree, root if left < 0 else left)
    positive = sum(w < vocab // 2 for w in words)
    return int(positive > len(words) - positive)


def labelled_trees(count: int, *, seed: int = 0, min_leaves: int = 4, max_leaves: int = 24, vocab: int = VOCAB,
                   max_nodes: int | None = None) -> LabelledTrees:
    """`count` random binary trees (every shape of `data.random_binary_trees`)
    with `left_majority` labels, as one batch."""
    trees = random_binary_trees(count, seed=seed, min_leaves=min_leaves, max_leaves=max_leaves, vocab=vocab,
                                max_nodes=max_nodes, shape=("random", "balanced", "left", "right", "frontier"))
    return LabelledTrees(batch(trees), np.asarray([left_majority(t, vocab) for t in trees], np.int32))


def init_params(key: jax.Array, vocab: int = VOCAB, hidden: int = 32, classes: int = 2) -> dict:
    """`{"tree": nary.init_params(...), "out": {"W": [classes, hidden], "b": [classes]}}`."""
    k1, k2 = split(key)
    return {"tree": nary.init_params(k1, vocab, hidden),
            "out": {"W": dense(k2, classes, hidden),
                    "b": jnp.zeros((classes,), jnp.float32)}}


def logits(params: dict, trees: Tree, model: Callable = encoder) -> jax.Array:
    """[batch, classes]: the linear layer on each root's h."""
    h, _ = model(params["tree"], trees, trees.root)
    return h @ params["out"]["W"].T + params["out"]["b"]


def loss(params: dict, trees: Tree, labels: jax.Array, model: Callable = encoder) -> jax.Array:
    """Mean softmax cross-entropy."""
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits(params, trees, model), labels))


def accuracy(params: dict, data: LabelledTrees, model: Callable = encoder) -> float:
    return float(jnp.mean(jnp.argmax(logits(params, data.trees, model), axis=-1) == data.labels))


def make_step(optimizer: optax.GradientTransformation, model: Callable = encoder) -> Callable:
    """One jitted training step: `(params, opt_state, trees, labels) ->
    (params, opt_state, loss)`; gradients by `jax.value_and_grad` through the
    autobatched model."""
    @jax.jit
    def step(params, opt_state, trees, labels):
        value, grads = jax.value_and_grad(loss)(params, trees, labels, model)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    return step


def _take(data: LabelledTrees, idx: np.ndarray) -> LabelledTrees:
    return LabelledTrees(jax.tree_util.tree_map(lambda a: np.asarray(a)[idx], data.trees), data.labels[idx])


def train(params: dict, train_set: LabelledTrees, test_set: LabelledTrees | None = None, *, steps: int = 150,
          batch_size: int = 32, learning_rate: float = 1e-2, seed: int = 0, eval_every: int = 25,
          model: Callable = encoder, progress: bool = True) -> tuple[dict, list[dict[str, Any]]]:
    """Adam on minibatches of `train_set` (reshuffled every epoch, equal batch
    sizes: one compilation). Returns the parameters and a history of
    `{"step", "loss", "train_accuracy", "test_accuracy"}` every `eval_every`
    steps (loss: mean over those steps). `progress`: a tqdm bar."""
    from tqdm.auto import tqdm

    optimizer = optax.adam(learning_rate)
    step = make_step(optimizer, model)
    opt_state = optimizer.init(params)
    n = len(train_set.labels)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the training set ({n} trees)")
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(n), 0
    history: list[dict[str, Any]] = []
    losses: list[float] = []
    bar = tqdm(range(1, steps + 1), desc="train", disable=not progress)
    for k in bar:
        if at + batch_size > n:
            order, at = rng.permutation(n), 0
        minibatch = _take(train_set, order[at:at + batch_size])
        at += batch_size
        params, opt_state, value = step(params, opt_state, minibatch.trees, minibatch.labels)
        losses.append(float(value))
        if k % eval_every == 0 or k == steps:
            entry = {"step": k, "loss": float(np.mean(losses)),
                     "train_accuracy": accuracy(params, _take(train_set, order[:min(n, 256)]), model)}
            if test_set is not None:
                entry["test_accuracy"] = accuracy(params, test_set, model)
            history.append(entry)
            losses = []
            bar.set_postfix({k: f"{v:.3f}" for k, v in entry.items() if k != "step"})
    return params, history
