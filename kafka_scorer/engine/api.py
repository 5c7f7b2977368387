"""The engine's surface for its clients beside the worker: the bench and in-process users.

Everything here is meant to stay: the Scorer and how to open one, the device and dtype rules (and the
CPU feature bf16 runs natively on), the token-budget scheduler the worker batches with, the attention
backends, the ways to run a Scorer's engine for a side-by-side comparison (`run/variants.py`: a variant
read from `scorer.describe().loaded`, entered with `scorer.engine.running(variant)`), the prepare stage's
token counts the bench reports and the slow image processor class a vision-language checkpoint is read
with (`vision/checkpoint.py`).
The bench imports the engine only through this module (tests/test_layout.py), except its kernel
micro-benchmarks, which time engine parts by design and are listed there by name.
"""

from kafka_scorer.engine.attention.registry import BACKENDS
from kafka_scorer.engine.load.precision import native_bf16_feature
from kafka_scorer.engine.load.transformers_parts import resolve_device, resolve_dtype
from kafka_scorer.engine.pack.scheduler import TokenBudgetScheduler
from kafka_scorer.engine.prepare.chunking import window_ranges
from kafka_scorer.engine.prepare.template_tokens import tokenize_templated
from kafka_scorer.engine.run.variants import Layers, Variant, layer_choices, variant
from kafka_scorer.engine.scorer import Scorer, open_scorer
from kafka_scorer.engine.vision.checkpoint import slow_image_processor_class

__all__ = [
    "BACKENDS",
    "Layers",
    "Scorer",
    "TokenBudgetScheduler",
    "Variant",
    "layer_choices",
    "native_bf16_feature",
    "open_scorer",
    "resolve_device",
    "resolve_dtype",
    "slow_image_processor_class",
    "tokenize_templated",
    "variant",
    "window_ranges",
]
