PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-matrix demo fuzz bench notebooks clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# uv installs the same packages as pip in about a quarter of the time (parallel downloads and
# unpacking; 18 s against 98 s on a loaded 2-core machine, warm caches); pip does it where uv cannot be had.
# Neither byte-compiles: the tests' first imports do (below).
$(STAMP): $(BIN)/python pyproject.toml
	( $(BIN)/python -m pip install -q uv && $(BIN)/python -m uv pip install -q --python $(BIN)/python -e ".[test,notebooks]" ) \
	  || $(BIN)/python -m pip install -q --no-compile -e ".[test,notebooks]"
	touch $(STAMP)

# Bytecode is written as modules are first imported, even where PYTHONDONTWRITEBYTECODE is set
# (as on CI): else every test worker and every subprocess a test starts compiles what it imports
# from source (~7 s each). Writing it on import compiles the ~1,700 modules the tests import,
# where byte-compiling the environment up front compiled all ~6,800 (15 s before the first test).
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15

# The combinations `make test` leaves out of its cross products (schedulers x programs, fork modes x programs).
test-matrix: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n 2 --dist loadfile -m matrix

demo: $(STAMP)
	$(BIN)/python examples/demo.py

fuzz: $(STAMP)
	PCBATCH_FUZZ_EXAMPLES=$${PCBATCH_FUZZ_EXAMPLES:-10000} $(BIN)/python -m pytest -q -m slow tests/fuzz

bench: $(STAMP)
	$(BIN)/python -m benchmarks.vm_overhead
	$(BIN)/python -m benchmarks.treelstm
	$(BIN)/python -m benchmarks.block_layout
	$(BIN)/python -m benchmarks.treelstm_train
	$(BIN)/python -m benchmarks.schedule_quality
	$(BIN)/python -m benchmarks.schedule_time

notebooks: $(STAMP)
	$(BIN)/python -m pip install -q -e ".[jupyter]"
	$(BIN)/python -m jupyter lab notebooks/

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
