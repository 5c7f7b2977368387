"""kafka-scorer: LLM scoring jobs from Kafka, micro-batched onto a GPU or CPU.

`Scorer` (which serves any checkpoint, its kind chosen in `engine/kinds/choice.py`) and
`open_scorer` (the same, under its older name) are imported lazily: `import kafka_scorer` (and
`kafka-scorer --help`) should not pay for importing torch and transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["Scorer", "__version__", "open_scorer"]

if TYPE_CHECKING:
    from kafka_scorer.engine.scorer import Scorer, open_scorer


def __getattr__(name: str):
    if name == "Scorer":
        from kafka_scorer.engine.scorer import Scorer

        return Scorer
    if name == "open_scorer":
        from kafka_scorer.engine.scorer import open_scorer

        return open_scorer
    raise AttributeError(name)
