"""Benchmarks for pcbatch (run as modules, e.g. `python -m benchmarks.vm_overhead`)."""
