"""A Qwen3-VL checkpoint: how it is recognised, and how it is loaded with its image processor.

The model is transformers' own `Qwen3VLForConditionalGeneration` (or Qwen2-VL's, the family of
MonoQwen2-VL and jina-reranker-m0's base, or Qwen2.5-VL's): its vision tower, the merger that turns 2x2
patches into one token, Qwen3-VL's deepstack features and the multimodal rotary positions (M-RoPE,
computed by its own `get_rope_index`) run as the model defines them, so a score is the one
transformers gives for the same pair (packed jobs: `packing.py`).

The image processor is transformers' slow one (PIL and numpy), never the "fast" torchvision one:
torchvision is not a dependency (on the CPU wheels it would add ~1 GB, and its builds must match
torch's exactly). transformers 5.1 names the slow class `Qwen2VLImageProcessor` (the fast one
`...Fast`); later 5.x releases renamed them (`Qwen2VLImageProcessorPil` is the slow one and
`Qwen2VLImageProcessor` needs torchvision), so the class is chosen by what the installed version
has. The `Qwen3VLProcessor` itself is not used: it insists on a video processor, which needs
torchvision; its one job for images — each `<|image_pad|>` repeated once per merged patch — is done
by the preparer (`prompt.py`), from the grid the image processor returns.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_scorer.engine.load.precision import choose_precision
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.load.transformers_parts import resolve_device
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel, ModelLoadError

FAMILIES = {
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
}
"""`model_type` -> transformers' class, for the families served by this kind."""


def model_type(model_path: str) -> str | None:
    try:
        return json.loads((Path(model_path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def is_vision_language(model_path: str) -> bool:
    """A local checkpoint directory of a served vision-language family."""
    return model_type(model_path) in FAMILIES


def slow_image_processor_class() -> Any:
    """transformers' PIL/numpy Qwen2-VL image processor of the installed version (see the docstring)."""
    import transformers.models.qwen2_vl as qwen2_vl

    slow = getattr(qwen2_vl, "Qwen2VLImageProcessorPil", None)
    return slow if slow is not None else qwen2_vl.Qwen2VLImageProcessor


@dataclass
class VisionModel(LoadedModel):
    """A loaded vision-language checkpoint: the `LoadedModel` fields and what images need."""

    image_processor: Any = None
    image_token: str = "<|image_pad|>"
    image_token_id: int = -1
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"
    merge_size: int = 2
    marks_image_tokens: bool = False
    """Whether the forward takes `mm_token_type_ids` (newer transformers compute M-RoPE from them)."""


def load_vision_language(
    model_path: str, *, served_name: str | None, dtype: str, device: str, trust_remote_code: bool
) -> VisionModel:
    import transformers
    from transformers import AutoTokenizer

    torch_device = resolve_device(device)
    precision = choose_precision(dtype, torch_device, "vision")
    torch_dtype = precision.dtype
    model_class = getattr(transformers, FAMILIES[str(model_type(model_path))])
    try:
        model: Any = model_class.from_pretrained(model_path, dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        processor = slow_image_processor_class().from_pretrained(model_path)
    except Exception as exc:
        raise ModelLoadError(
            f"model: cannot load the vision-language checkpoint {model_path!r}: {exc}"
        ) from exc
    model.to(torch_device).eval().requires_grad_(False)
    config = model.config
    head: Any = model.get_output_embeddings()
    return VisionModel(
        name=served_name or model_path,
        architecture=Architecture.CAUSAL_LM,
        model=model,
        body=model.model,
        head=head,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        dtype_reason=precision.reason,
        input_vocab_size=int(model.get_input_embeddings().num_embeddings),
        output_vocab_size=int(head.out_features),
        max_positions=getattr(config.text_config, "max_position_embeddings", None),
        mis_block_reason=None,  # packing is exact (packing.py)
        sliding_window=None,
        revision=checkpoint_revision(model_path),
        image_processor=processor,
        image_token_id=int(config.image_token_id),
        merge_size=int(getattr(processor, "merge_size", 2)),
        marks_image_tokens="mm_token_type_ids" in inspect.signature(model.model.forward).parameters,
    )
