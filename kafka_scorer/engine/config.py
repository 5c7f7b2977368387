"""What the engine is built from: a plain record, so the engine imports no settings machinery.

`kafka_scorer.config.EngineSettings.engine_config()` builds one from the environment and flags; a
program that embeds the engine without Kafka may build one by hand. The fields mirror `Scorer`'s
keyword arguments and the settings of the same names (docs/configuration.md says what each means).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    model: str
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    attention_backend: str = "auto"
    decoder_forward: str = "auto"
    max_batch_tokens: int = 0
    """0: `default_batch_tokens` of the device."""
    max_items_per_job: int = 1024
    max_pair_tokens: int = 0
    truncate: bool = False
    max_labels_per_job: int = 256
    template: str = ""
    model_revision: str = ""
    chunking: str = ""
    """The default `chunking` as the job field's JSON object; "": none (docs/message-schema.md)."""
    max_chunks_per_job: int = 256
    max_images_per_job: int = 32
    max_image_bytes: int = 10 * 2**20
    max_image_pixels: int = 7680 * 4320
    """The image limits (`engine/vision/images.py`), read by vision-language models only."""
    prefix_cache_mb: int = -1
    embedding_cache_mb: int = -1
    deterministic: bool = False
    """Scores bit-identical whatever a job's batch-mates and the cache hold
    (`engine/load/deterministic.py`)."""
    cuda_graph_tokens: int = -1
    """Forwards up to this many tokens replay CUDA graphs (`engine/graphs/`); -1: 8192 on CUDA, 0: off."""


DEFAULT_BATCH_TOKENS = {"cuda": 16384, "cpu": 8192}
"""The token budget where the setting leaves it to the device. CUDA (H100, the 0.6B shape, SGLang's MIS
request shape, engine alone): 8192 -> 288k tokens/s, 16384 -> 307k, 32768 -> 322k; 16384 keeps 95 % of
the largest budget's throughput with half its time per forward, which a request's latency waits on."""


def default_batch_tokens(device_type: str) -> int:
    return DEFAULT_BATCH_TOKENS.get(device_type, DEFAULT_BATCH_TOKENS["cpu"])
