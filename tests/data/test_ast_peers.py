"""The peers of the AST workload: DyNet's Child-Sum Tree-LSTM in `benchmarks/treelstm_ast.py`
(same weights) computes what pcbatch's natural-loop model computes (skipped without dynet38),
and (slow) `examples/train_ast_classifier.py` beats its bag-of-node-types baseline."""
from __future__ import annotations

import os
import sys

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the repo root: `benchmarks`

from pcbatch import data  # noqa: E402
from pcbatch.models import child_sum_loop  # noqa: E402

MODULES = ["bisect", "heapq", "textwrap", "json.decoder", "colorsys", "fnmatch"]


def test_dynet_peer_matches_pcbatch():
    pytest.importorskip("dynet", reason="dynet38 is not installed (pip install -e '.[bench-dynet]')")
    from benchmarks import treelstm_ast

    dy = treelstm_ast.load_dynet()
    assert dy is not None
    got = data.load_ast_trees("all", max_nodes=40, max_children=8, modules=MODULES, min_nodes=2, max_trees=6)
    trees = data.batch(got.trees)
    params = child_sum_loop.init_params(jax.random.PRNGKey(3), len(data.AST_VOCAB), 8)
    h, c = child_sum_loop.child_sum_tree_lstm_loop(params, trees, trees.root)
    dh, dc = treelstm_ast.DynetChildSum(dy, params)(trees)
    np.testing.assert_allclose(dh, np.asarray(h), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(dc, np.asarray(c), rtol=1e-4, atol=1e-5)
    assert np.abs(dh).max() > 1e-2          # not trivially zero


@pytest.mark.slow
def test_example_beats_bag_of_types(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_ast_classifier

    r = train_ast_classifier.main(["--no-progress", "--plot", str(tmp_path / "loss.png")])
    assert r["tree_lstm_validation"] > r["bag_validation"] + 0.05
    assert r["tree_lstm_test"] > r["bag_test"] + 0.05
    assert (tmp_path / "loss.png").stat().st_size > 1000
