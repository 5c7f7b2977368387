"""The bench: kafka-scorer measured against itself, the transformers baseline and the reference libraries.

Developer tooling beside the product, not in its wheel (issue 47): an installed worker carries no
benchmark code, and the bench uses the product as any client would (the engine through
`kafka_scorer/engine/api.py`, but for the kernel micro-benchmarks tests/test_layout.py names). It runs
from a checkout: `kafka-scorer bench` (`command.py`; `./dev run bench ARGS`, or `python -m kafka_scorer
bench` from the checkout's root) and the engine-alone benches as `python -m kafka_scorer_bench.NAME`.
docs/performance.md says what each measures.
"""
