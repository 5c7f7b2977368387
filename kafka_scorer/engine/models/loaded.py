"""What the engine knows of a served checkpoint once it is loaded: one record every stage reads.

Below the stages on purpose: preparing reads its tokenizer and limits, packing its window and device,
running its body and head, so the record sits beneath all of them and its loaders
(`engine/load/decoder.py`, `engine/load/encoder.py`, and the kinds' own) build it from above. A kind
that needs more extends it (`late_interaction/spec.py`'s `LateModel`, `vision/checkpoint.py`'s `VisionModel`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from kafka_scorer.engine.models.encoder_family import EncoderSpec
from kafka_scorer.engine.recurrent.detection import RecurrentSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class Architecture(str, enum.Enum):
    """What the checkpoint is built as (its config's architecture, or a layout of its own), which the
    start-up line reports as `kind`; the engine's model kind, the object that serves it, is
    `engine/kinds/`'s."""

    CAUSAL_LM = "causal_lm"
    CLASSIFICATION = "classification"
    LATE_INTERACTION = "late_interaction"
    """A ColBERT checkpoint: per-token vectors scored by MaxSim (`engine/late_interaction/`)."""
    LISTWISE = "listwise"
    """A jina-reranker-v3 checkpoint: a job's documents in one causal sequence (`engine/listwise/`)."""


class ModelLoadError(RuntimeError):
    """The checkpoint cannot be served; the message says why and what to do."""


@dataclass
class LoadedModel:
    name: str
    architecture: Architecture
    model: PreTrainedModel
    """The checkpoint as transformers loaded it."""
    body: nn.Module
    """The decoder stack whose output is the final-norm hidden state (SPEC §6)."""
    head: nn.Module
    """LM head (CausalLM) or classification head; applied only to scoring rows."""
    tokenizer: Any | None  # a Hugging Face tokenizer (called and indexed as one; None: token ids only)
    device: torch.device
    dtype: torch.dtype
    input_vocab_size: int
    output_vocab_size: int
    max_positions: int | None
    mis_block_reason: str | None
    """Why packing would change results for this model (None: MIS is exact)."""
    sliding_window: int | None
    final_logit_softcap: float | None = None
    """Gemma 2's `cap · tanh(logit / cap)` on LM-head logits; CausalLM only, since transformers' score
    heads (e.g. Gemma2ForSequenceClassification) do not apply it."""
    encoder: EncoderSpec | None = None
    """Set for encoder cross-encoders (bidirectional, first-token or mean pooling); None for decoders."""
    num_classes: int = 0
    """Columns of a classification head's output (0 for CausalLM: its columns are the job's labels)."""
    revision: str = ""
    """A stable hash of the checkpoint's config, weight and tokenizer files (`engine/load/revision.py`)."""
    dtype_reason: str = "set"
    """Why `dtype` (`engine/load/precision.py`: the operator's setting, or what auto measured)."""
    recurrent: RecurrentSpec | None = None
    """Set for hybrid decoders (Qwen3.5, Qwen3-Next): their Gated DeltaNet layers are wrapped to run each
    packed sequence from its own state (`engine/recurrent/`); the runner hands them the batch's runs."""
