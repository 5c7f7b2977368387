"""What loading any transformers checkpoint takes, whichever kind serves it: the device and dtype the
settings name, the weights in them, and the tokenizer (or none: token-id jobs only).

The HF model is loaded unchanged; only its attention function is swapped for ours (registered in
transformers' attention registry), so any decoder whose attention goes through that registry gets
packing and MIS without a model rewrite, and any encoder gets varlen pairs without padding.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from kafka_scorer.engine.attention.registry import ATTENTION_IMPLEMENTATION, register_attention
from kafka_scorer.engine.load.precision import choose_precision
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.models.loaded import ModelLoadError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kafka_scorer.engine.load.checkpoint import Checkpoint

log = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    """The torch device `device` names; a name torch does not know, or a GPU this process cannot use,
    is the `device` setting's fault and says so in one line (not a traceback from inside torch)."""
    from kafka_scorer.errors import SettingError

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        raise SettingError(
            "device", f"device={device!r} is not a torch device: use auto, cpu, cuda or cuda:N (--device)"
        ) from None
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise SettingError(
                "device",
                f"device={device!r} but this torch has no usable CUDA GPU (a CPU-only build, or no GPU "
                "visible): use --device auto or cpu, or install torch's CUDA build",
            )
        if resolved.index is not None and resolved.index >= count:
            raise SettingError("device", f"device={device!r} but only {count} GPU(s) are visible (--device)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device, kind: str = "") -> torch.dtype:
    """The torch dtype `dtype` means for a `kind` (`engine/load/precision.py`; no kind: float32 where
    auto would need the kind's measured fidelity to choose)."""
    return choose_precision(dtype, device, kind).dtype


@dataclass
class Weights:
    """A transformers checkpoint loaded for serving: its model (eval, no grad) on the device, in the
    dtype chosen for the kind, and its tokenizer."""

    model: PreTrainedModel
    tokenizer: Any | None  # a Hugging Face tokenizer (called and indexed as one; None: token ids only)
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str


class CommonFields(TypedDict):
    """The `LoadedModel` fields every transformers kind fills the same way from its `Weights`."""

    name: str
    model: PreTrainedModel
    tokenizer: Any | None
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    input_vocab_size: int
    revision: str


def common_fields(checkpoint: Checkpoint, weights: Weights, served_name: str | None) -> CommonFields:
    return CommonFields(
        name=served_name or checkpoint.path,
        model=weights.model,
        tokenizer=weights.tokenizer,
        device=weights.device,
        dtype=weights.dtype,
        dtype_reason=weights.dtype_reason,
        input_vocab_size=input_vocab_size(weights.model),
        revision=checkpoint_revision(checkpoint.path),
    )


def load_weights(
    checkpoint: Checkpoint, auto_class: Any, precision_kind: str, dtype: str, device: str
) -> Weights:
    """`auto_class` (an `AutoModelFor...`) from the checkpoint, with the engine's attention, in the
    precision `dtype` means for `precision_kind` (`engine/load/precision.py`)."""
    register_attention()
    torch_device = resolve_device(device)
    precision = choose_precision(dtype, torch_device, precision_kind)
    try:
        model = auto_class.from_pretrained(
            checkpoint.path,
            dtype=precision.dtype,
            attn_implementation=ATTENTION_IMPLEMENTATION,
            trust_remote_code=checkpoint.trust_remote_code,
        )
    except Exception as exc:
        raise ModelLoadError(f"model: cannot load weights of {checkpoint.path!r}: {exc}") from exc
    model.to(torch_device).eval()
    model.requires_grad_(False)
    tokenizer = load_tokenizer(checkpoint)
    return Weights(model, tokenizer, torch_device, precision.dtype, precision.reason)


def load_tokenizer(checkpoint: Checkpoint) -> Any | None:
    """The checkpoint's tokenizer, or None (with a warning): then only token-id jobs can be served."""
    from transformers import AutoTokenizer

    path = checkpoint.path
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=checkpoint.trust_remote_code)
    except Exception as exc:
        log.warning("no tokenizer for %s (%s): only token-id jobs can be served", path, exc)
        return None
    if len(tokenizer.get_vocab()) < 2:
        # transformers 5 builds an empty tokenizer when a checkpoint ships none; it would turn every
        # text into zero tokens, so treat it as missing.
        log.warning("no tokenizer files in %s: only token-id jobs can be served", path)
        return None
    return tokenizer


def input_vocab_size(model: PreTrainedModel) -> int:
    return int(model.get_input_embeddings().num_embeddings)  # type: ignore[arg-type]  # an input embedding (nn.Embedding's shape) has an int num_embeddings; nn.Module types every attribute Tensor | Module
