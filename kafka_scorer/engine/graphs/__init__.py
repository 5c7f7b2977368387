"""CUDA graphs for the MIS forward: token-count buckets, static inputs, captured bodies (issue 24)."""
