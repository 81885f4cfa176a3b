"""The training module (`pcbatch.models.tree_classifier`): a few jitted Adam
steps through the autobatched Tree-LSTM lower the loss (the gradients
themselves are checked against Python in test_grad_models.py), and the labels
follow the documented rule."""
from __future__ import annotations

import jax
import numpy as np
import optax

from grad_helpers import assert_close
from pcbatch.models import tree_classifier as tc
from weights import numpy_weights  # tests/ is on sys.path (its conftest)


def test_labels_follow_the_rule():
    data = tc.labelled_trees(40, seed=3, min_leaves=1, max_leaves=6)
    assert 0 < data.labels.mean() < 1
    trees = [jax.tree_util.tree_map(lambda a: np.asarray(a)[i], data.trees) for i in range(40)]
    for t, y in zip(trees, data.labels):
        root = int(t.root)
        if t.children[root, 0] < 0:                       # a single leaf: its own polarity
            assert y == int(t.word[root] < tc.VOCAB // 2)
    # by hand: left = leaves {0, 1}, right = leaf 2
    children = np.full_like(trees[0].children, -1)
    children[3] = [0, 1]
    children[4] = [3, 2]
    word = np.full_like(trees[0].word, -1)
    word[:3] = [1, 2, 99]                                  # left: two positive words
    t = trees[0]._replace(children=children, word=word, root=np.int32(4), num_nodes=np.int32(5))
    assert tc.left_majority(t) == 1
    word[:3] = [1, 98, 0]                                  # left: one of each: not a majority
    assert tc.left_majority(t._replace(word=word)) == 0


def test_a_few_adam_steps_lower_the_loss():
    data = tc.labelled_trees(8, seed=0, min_leaves=2, max_leaves=6)
    model = tc.encoder.with_options(lane_width=16)
    params = first = numpy_weights(tc.init_params, hidden=8, zero_biases=True)
    optimizer = optax.adam(0.05)
    step = tc.make_step(optimizer, model)
    state = optimizer.init(params)
    losses = []
    for _ in range(6):
        params, state, value = step(params, state, data.trees, data.labels)
        losses.append(float(value))
    assert losses[-1] < 0.8 * losses[0], losses
    assert_close(losses[0], float(tc.loss(first, data.trees, data.labels, model.reference)))


def test_train_rejects_counts_below_one():
    """`eval_every=0` divided by zero; `batch_size` 0 or negative trained on empty batches (NaN losses)."""
    import pytest
    data = tc.labelled_trees(8, seed=0, min_leaves=2, max_leaves=6)
    params = numpy_weights(tc.init_params, hidden=8, zero_biases=True)
    for kwargs in ({"eval_every": 0}, {"batch_size": 0}, {"batch_size": -4}, {"steps": 0}):
        with pytest.raises(ValueError, match=f"{next(iter(kwargs))} must be an int >= 1"):
            tc.train(params, data, **{"steps": 2, "batch_size": 4, "progress": False, **kwargs})
