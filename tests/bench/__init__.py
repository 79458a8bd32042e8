"""Benchmarks (`make bench`): performance targets live here, not in timed tests."""
