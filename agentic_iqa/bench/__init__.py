"""Benchmarks: the synthetic KADID-style generator, the manifest format and the evaluation metrics."""
