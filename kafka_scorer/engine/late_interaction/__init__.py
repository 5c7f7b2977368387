"""Late-interaction rerankers (ColBERT): per-token embeddings of the query and of each document, scored
by MaxSim — for each query token the best dot product with any document token, summed.

`checkpoint.py` reads a PyLate / sentence-transformers ColBERT directory, `loading.py` builds the
`LoadedModel`, `preparer.py` encodes jobs as the checkpoint defines, `forward.py` packs the query and the
documents of many jobs into one unpadded forward, `maxsim.py` scores one job at a time on the device,
`embedding_cache.py` keeps document token embeddings across queries, and `scorer.py` is the `Scorer`
for this kind.
"""
