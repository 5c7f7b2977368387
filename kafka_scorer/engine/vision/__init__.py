"""Vision-language rerankers (Qwen3-VL): queries, items and documents with images (SPEC §11).

`images.py` checks and decodes a job's image bytes against the worker's limits and `jobs.py` says
whether a job carries content parts at all (the one question every other kind asks, to refuse such a
job as `unsupported`). Both are torch-free. The kind itself (its checkpoint, preparer, forward and
`Scorer`) is in the other modules of this package.
"""
