"""Benchmarks of the context store, each printed as a ratio against a baseline measured in the same run."""
