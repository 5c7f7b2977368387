"""The listwise kind's parts: a query and its documents read in one causal sequence (jina-reranker-v3)."""
