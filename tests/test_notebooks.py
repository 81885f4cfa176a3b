"""The notebooks in notebooks/ run top to bottom, and are stored without outputs.

Kernel: each notebook is executed with nbclient under the kernel name
``python3`` (what the notebooks' metadata names).  So that the kernel is
always *this* interpreter (the venv's python running pytest, where pcbatch and
ipykernel are installed) and never some other ``python3`` kernelspec on the
machine, the test writes a ``python3`` kernelspec whose argv is
``sys.executable -m ipykernel_launcher`` into a temporary directory and puts it
first on ``JUPYTER_PATH``.  The kernel inherits the test's environment
(``JAX_PLATFORMS=cpu`` from conftest).
"""
import json
import os
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def _nbformat():
    return pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[notebooks]')")


def test_there_are_notebooks():
    names = {p.name for p in NOTEBOOKS}
    assert {"01_quickstart.ipynb", "02_schedules.ipynb", "03_nuts.ipynb"} <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
    # Plain JSON, so this check runs even without the notebook extras.
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    for k, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"{path.name} cell {k} has stored outputs"
            assert cell["execution_count"] is None, f"{path.name} cell {k} has an execution count"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_valid(path):
    nbformat = _nbformat()
    nbformat.validate(nbformat.read(path, as_version=4))


@pytest.fixture(scope="module")
def python3_kernel(tmp_path_factory):
    """A `python3` kernelspec running this interpreter, first on JUPYTER_PATH."""
    pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[notebooks]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[notebooks]')")
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (pcbatch tests)",
        "language": "python",
    }))
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root)] + ([saved] if saved else []))
    try:
        from jupyter_client.kernelspec import KernelSpecManager

        assert KernelSpecManager().get_kernel_spec("python3").argv[0] == sys.executable
        yield "python3"
    finally:
        if saved is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = saved


# The schedules, NUTS, memory-layout and AST-classifier walkthroughs (8-30 s each on CI's
# two cores) run under `make test-matrix`: what they call, tests/fsm, tests/mcmc,
# tests/memory, tests/grad (training a tree model with optax) and test_viz.py check. The
# quickstart, a user's first run, stays in make test.
WALKTHROUGHS = {"02_schedules", "03_nuts", "04_memory_layout", "05_ast_classifier"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=(pytest.mark.matrix,) if p.stem in WALKTHROUGHS else ())
                                  for p in NOTEBOOKS], ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, python3_kernel):
    nbformat = _nbformat()
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name=python3_kernel, timeout=CELL_TIMEOUT_S,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    elapsed = time.perf_counter() - start
    errors = [(k, out.get("ename")) for k, cell in enumerate(nb.cells) if cell.cell_type == "code"
              for out in cell.outputs if out.output_type == "error"]
    assert not errors, f"{path.name}: cells raised {errors}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "some cells did not run"
    # Every figure-returning cell displayed an image.
    images = sum("image/png" in out.get("data", {}) for c in code for out in c.outputs)
    assert images >= 3, f"{path.name}: only {images} figures were displayed"
    print(f"{path.name}: executed in {elapsed:.1f}s")
