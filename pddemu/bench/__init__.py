"""Benchmarks behind `make bench`: one module per area, each with `run(quick) -> dict`."""
