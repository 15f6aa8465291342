"""Benchmarks (`make bench-*`): figures go to docs/benchmarks.md, never into timed tests."""
