"""Deterministic mode: a job's scores bit-identical whatever else its forward holds.

Three things make a token's result depend on its batch-mates in the default engine, each measured on
the CPU (issue 24, item 8; docs/engine.md): matmul kernels chosen by the row count, attention blocked
by the batch's layout, and the prefix cache's hit path computing the attention in another order than
the miss path. Deterministic mode removes each:

- the fused decoder pads the stream to whole row blocks and runs every projection at one fixed shape
  (`layers/invariant.py`), eagerly (a compiled region may pick kernels per shape);
- attention is computed by each token's own run only: fused flash calls shaped by that run on the
  CPU (`attention/segmented.py`); on CUDA the span kernel over spans aligned to each run
  (`attention/aligned_spans.py`: one launch per layer), the tiles (`attention/tiled.py`) for what it
  does not serve and wherever triton is missing (a call per item would launch thousands of kernels);
- the heads run by fixed-shape row blocks (`invariant_heads.py`);
- the prefix cache stays on where the attention is the CPU's segmented one: each job's query is
  computed in pieces cut at its prefix marks (the cache's own boundaries), each piece seeing the
  pieces before it, so a prefix's states are a function of its tokens alone, and a hit attends its
  cached head by the very calls its miss would make (`attention/cached.py`'s segment calls). On
  CUDA the cache is off: every job computes its head itself.
Encoders (cross-encoders and ColBERT's) keep transformers' layers: their stream is padded to whole row
blocks around the stock body (`models/fixed_rows_encoder.py`) and every `nn.Linear` of the model and
its heads is swapped for the fixed-shape one (`layers/invariant.py`). A ColBERT model keeps its
document embedding cache: a document's vectors no longer depend on what they were computed with, so a
cached copy is the vectors the document would get now (`late_interaction/forward.py`).
The price is stated in docs/performance.md. Decoder families without the engine's own layers are
refused with a line naming the setting.
"""

from __future__ import annotations

import dataclasses

import torch

from kafka_scorer.engine.kernels.runs_on import triton_runs_on
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.errors import SettingError

BACKEND = "deterministic"
"""The tiles: the mode's attention on CUDA where the span kernel cannot run (no triton)."""
SPANS_BACKEND = "deterministic-spans"
"""The mode's attention on CUDA: the span kernel over aligned spans, the tiles for the rest."""
CPU_BACKEND = "segmented"
"""The mode's attention on the CPU."""
BACKENDS = (BACKEND, SPANS_BACKEND, CPU_BACKEND)
"""What `Scorer(attention_backend=...)` may name in the mode (the tests run CUDA's on the CPU); "auto"
takes the device's (`mode_backend`)."""


def keeps_prefix_cache(backend: str) -> bool:
    """Whether the mode's attention `backend` has a hit path that computes what a miss does."""
    return backend == CPU_BACKEND


def make_deterministic(loaded: LoadedModel, attention_backend: str) -> str:
    """Switch `loaded`'s body to fixed-shape blocks, eager; returns the attention backend to use (its
    registry name: the one named, or for "auto" the device's, `mode_backend`)."""
    from kafka_scorer.engine.models.decoder import FusedDecoder
    from kafka_scorer.engine.models.decoder_layer import Regions

    body = loaded.body
    if loaded.recurrent is not None:
        raise SettingError(
            "deterministic",
            f"deterministic=true is not served for {loaded.name!r}, a hybrid linear-attention model "
            "(Gated DeltaNet layers): it runs transformers' layers, not the fixed-shape decoder, and its "
            "recurrence runs in padded groups shaped by the batch, so a score's last bits follow its "
            "batch-mates: unset --deterministic (KAFKA_SCORER_DETERMINISTIC) for it",
        )
    if loaded.encoder is None and not isinstance(body, FusedDecoder):
        raise SettingError(
            "deterministic",
            f"deterministic=true needs the engine's own decoder layers, but {loaded.name!r} runs "
            f"{type(body).__name__} (a family outside the fused decoder, or decoder_forward=transformers): "
            "unset --deterministic (KAFKA_SCORER_DETERMINISTIC) for it",
        )
    if attention_backend not in ("auto", *BACKENDS):
        raise SettingError(
            "deterministic",
            f"deterministic=true computes attention with its own backend, not attention_backend="
            f"{attention_backend!r}: unset --attention-backend (KAFKA_SCORER_ATTENTION_BACKEND)",
        )
    encoder = loaded.encoder is not None
    backend = mode_backend(loaded.device, encoder) if attention_backend == "auto" else attention_backend
    if encoder:
        _fix_encoder(loaded)
    elif isinstance(body, FusedDecoder):  # always, past the check above: a decoder here is fused
        body.shape = dataclasses.replace(body.shape, fixed_rows=True)
        body.regions = Regions.eager(body.shape)
    return backend


def mode_backend(device: torch.device, encoder: bool = False) -> str:
    """The mode's attention on `device`: a call per segment on the CPU; on CUDA the span kernel where
    triton runs it, else the tiles, which serve encoders (bidirectional pairs) in any case."""
    if device.type == "cpu":
        return CPU_BACKEND
    return SPANS_BACKEND if triton_runs_on(device) and not encoder else BACKEND


def _fix_encoder(loaded: LoadedModel) -> None:
    """The stock encoder body padded to whole row blocks, its and its heads' matmuls by fixed blocks."""
    from kafka_scorer.engine.layers.invariant import fix_linears
    from kafka_scorer.engine.models.fixed_rows_encoder import FixedRowsEncoder

    assert loaded.encoder is not None
    fix_linears(loaded.model)
    fix_linears(loaded.head)  # a ColBERT projection lives outside the model; a classifier's is inside
    loaded.body = FixedRowsEncoder(loaded.body, loaded.encoder)
