"""Train a Child-Sum Tree-LSTM on real trees: does a stdlib function return a value?

    python examples/train_ast_classifier.py                 # a few minutes on 2 CPU cores
    python examples/train_ast_classifier.py --max-nodes 128 --max-children 16 --hidden 64 --epochs 12

Data (`pcbatch.data.load_ast_trees`, no download): the syntax trees of the functions in
this interpreter's standard library, split into train / validation / test by module. Label
(`task="returns_value"`): 1 if one of the function's own `return`s returns a value. The
telltale is masked: every `Return` node is relabelled `Expr`, so the model has to see
*where* an expression statement sits and what it holds (a bare `Name` as a statement, an
expression at the end of a branch) rather than count node types. Classes are balanced
by subsampling (chance = 50%).

Model: `pcbatch.models.child_sum_loop`, a Child-Sum Tree-LSTM written for ONE tree as a
loop over a node's children that recurses into each, autobatched by pcbatch (gradients
through the batched recursion), a linear layer on the root's h, Adam (optax).
Baseline: logistic regression on the bag of node types (log counts; the same masked trees,
the same split), also fitted with optax. Both accuracies are printed; a loss curve is
saved (`--plot`).
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pcbatch import data
from pcbatch.models import child_sum_loop, tree_classifier


def balanced(ds: data.AstTrees, size: int | None, seed: int) -> tree_classifier.LabelledTrees:
    """At most `size` trees, half of each class (subsampled with `seed`), as one batch."""
    rng = np.random.default_rng(seed)
    pos, neg = (rng.permutation(np.flatnonzero(ds.labels == k)) for k in (1, 0))
    per = min(len(pos), len(neg), (size or 10**9) // 2)
    idx = rng.permutation(np.concatenate([pos[:per], neg[:per]]))
    return tree_classifier.LabelledTrees(data.batch([ds.trees[i] for i in idx]), ds.labels[idx])


def bag_of_types(trees: data.Tree) -> np.ndarray:
    """[batch, vocab] log(1 + count) of each node type per tree."""
    word = np.asarray(trees.word)
    counts = np.zeros((word.shape[0], len(data.AST_VOCAB)), np.float32)
    rows = np.broadcast_to(np.arange(word.shape[0])[:, None], word.shape)
    np.add.at(counts, (rows[word >= 0], word[word >= 0]), 1.0)
    return np.log1p(counts)


def logistic_regression(x_train, y_train, *, l2: float = 1e-3, steps: int = 2000) -> tuple[jax.Array, jax.Array]:
    """Full-batch logistic regression (standardized features, L2), fitted with optax's L-BFGS."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-6

    def loss(p):
        z = ((x_train - mu) / sd) @ p["w"] + p["b"]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(z, y_train)) + l2 * jnp.sum(p["w"] ** 2)

    opt = optax.lbfgs()
    p = {"w": jnp.zeros(x_train.shape[1]), "b": jnp.zeros(())}
    state = opt.init(p)
    value_and_grad = optax.value_and_grad_from_state(loss)

    @jax.jit
    def step(p, state):
        value, grad = value_and_grad(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state

    for _ in range(steps // 20):
        p, state = step(p, state)
    return lambda x: np.asarray(((x - mu) / sd) @ p["w"] + p["b"] > 0, np.int32)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train-size", type=int, default=4096, help="training trees (balanced)")
    ap.add_argument("--eval-size", type=int, default=512, help="validation / test trees (balanced)")
    ap.add_argument("--max-nodes", type=int, default=64, help="skip functions with more AST nodes")
    ap.add_argument("--min-nodes", type=int, default=8)
    ap.add_argument("--max-children", type=int, default=8, help="skip functions with a wider node")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="ast_classifier_loss.png", help="loss curve (PNG); '' for none")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    kw = dict(max_nodes=a.max_nodes, min_nodes=a.min_nodes, max_children=a.max_children, task="returns_value")
    train = balanced(data.load_ast_trees("train", **kw), a.train_size, a.seed)
    valid = balanced(data.load_ast_trees("validation", **kw), a.eval_size, a.seed + 1)
    test = balanced(data.load_ast_trees("test", **kw), a.eval_size, a.seed + 2)
    n_train = len(train.labels) // a.batch_size * a.batch_size
    print(f"stdlib function ASTs ({time.perf_counter() - t0:.0f} s to parse): train {len(train.labels)}, "
          f"validation {len(valid.labels)}, test {len(test.labels)} trees of {a.min_nodes}-{a.max_nodes} nodes, "
          f"<= {a.max_children} children per node; task: returns a value (Return nodes masked as Expr), "
          f"balanced (chance 50%)")

    # baseline: bag of node types
    predict = logistic_regression(bag_of_types(train.trees), jnp.asarray(train.labels, jnp.float32))
    base_valid = float(np.mean(predict(bag_of_types(valid.trees)) == valid.labels))
    base_test = float(np.mean(predict(bag_of_types(test.trees)) == test.labels))
    print(f"bag-of-node-types logistic regression: validation {base_valid:.3f}  test {base_test:.3f}")

    # the Tree-LSTM; stacks as deep as the tallest tree, a tape row per node and block
    encoder = child_sum_loop.child_sum_tree_lstm_loop.with_options(max_stack_depth=a.max_nodes,
                                                                   tape_size=2 * a.max_nodes)
    key_tree, key_out = jax.random.split(jax.random.PRNGKey(a.seed))
    params = {"tree": child_sum_loop.init_params(key_tree, len(data.AST_VOCAB), a.hidden),
              "out": {"W": jax.random.normal(key_out, (2, a.hidden)) / np.sqrt(a.hidden), "b": jnp.zeros(2)}}
    schedule = optax.cosine_decay_schedule(a.lr, a.epochs * (n_train // a.batch_size))
    optimizer = optax.adam(schedule)
    opt_state = optimizer.init(params)
    step = tree_classifier.make_step(optimizer, encoder)
    predict_tree = jax.jit(lambda p, trees: jnp.argmax(tree_classifier.logits(p, trees, encoder), -1))

    def accuracy(split: tree_classifier.LabelledTrees) -> float:
        return float(np.mean(np.asarray(predict_tree(params, split.trees)) == split.labels))

    rng = np.random.default_rng(a.seed)
    losses, history = [], []
    for epoch in range(1, a.epochs + 1):
        order = rng.permutation(len(train.labels))[:n_train].reshape(-1, a.batch_size)
        bar = tqdm(order, desc=f"epoch {epoch}/{a.epochs}", disable=a.no_progress)
        for idx in bar:
            trees = jax.tree_util.tree_map(lambda x: np.asarray(x)[idx], train.trees)
            params, opt_state, value = step(params, opt_state, trees, train.labels[idx])
            losses.append(float(value))
            bar.set_postfix(loss=f"{np.mean(losses[-len(order):]):.3f}")
        val = accuracy(valid)
        history.append({"epoch": epoch, "loss": float(np.mean(losses[-len(order):])), "validation_accuracy": val})
        print(f"epoch {epoch}: train loss {history[-1]['loss']:.3f}  validation accuracy {val:.3f}", flush=True)

    result = {"tree_lstm_validation": history[-1]["validation_accuracy"], "tree_lstm_test": accuracy(test),
              "bag_validation": base_valid, "bag_test": base_test, "losses": losses, "history": history,
              "seconds": time.perf_counter() - t0}
    print(f"\n{'':38s}validation   test\n"
          f"{'Child-Sum Tree-LSTM (pcbatch, loop)':38s}{result['tree_lstm_validation']:10.3f}{result['tree_lstm_test']:7.3f}\n"
          f"{'bag-of-node-types logistic regression':38s}{base_valid:10.3f}{base_test:7.3f}\n"
          f"total {result['seconds']:.0f} s")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(losses, alpha=0.35, label="minibatch")
        w = max(1, n_train // a.batch_size)
        ax.plot(np.arange(w - 1, len(losses)), np.convolve(losses, np.ones(w) / w, "valid"), label="epoch mean")
        ax.set(xlabel="step", ylabel="cross-entropy", title="Child-Sum Tree-LSTM on stdlib ASTs")
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
        print(f"loss curve: {a.plot}")
    return result


if __name__ == "__main__":
    main()
