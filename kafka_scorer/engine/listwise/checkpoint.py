"""A jina-reranker-v3 checkpoint (`JinaForRanking`): how it is recognised and loaded.

The published layout (jinaai/jina-reranker-v3's `modeling.py`, and vLLM's
`vllm/model_executor/models/jina.py`, which loads the same files): a Qwen3 `config.json` whose
`architectures` names `JinaForRanking` (custom code the engine does not run), one `model.safetensors`
holding the Qwen3 body under `model.` and the projector under `projector.0.weight` and
`projector.2.weight` (an `nn.Sequential` of Linear, ReLU, Linear, both without bias), and a tokenizer
that knows the two marker tokens. The body is transformers' own `Qwen3Model` and the projector is
rebuilt from its two weight matrices, so nothing of the checkpoint's Python is imported, and the
projector's width is read from its weights (512 in the published model) rather than assumed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from kafka_scorer.engine.load.precision import choose_precision
from kafka_scorer.engine.load.revision import checkpoint_revision
from kafka_scorer.engine.load.transformers_parts import resolve_device
from kafka_scorer.engine.models.loaded import Architecture, LoadedModel, ModelLoadError

ARCHITECTURE = "JinaForRanking"
DOCUMENT_MARKER = "<|embed_token|>"
"""Ends every document: its hidden state is the document's vector."""
QUERY_MARKER = "<|rerank_token|>"
"""Ends the query's second copy, after the documents: its hidden state is the query's vector."""
PROJECTOR_KEYS = ("projector.0.weight", "projector.2.weight")


def is_listwise(model_path: str) -> bool:
    """A local checkpoint directory whose config names `JinaForRanking` (read before anything loads)."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and ARCHITECTURE in (config.get("architectures") or [])


@dataclass
class ListwiseModel(LoadedModel):
    """A loaded listwise checkpoint: the `LoadedModel` fields (`head` is the projector) and its markers."""

    document_marker_id: int = -1
    query_marker_id: int = -1
    pad_id: int = 0


def projector_from(weights: dict[str, torch.Tensor]) -> nn.Sequential:
    """Linear(hidden, hidden/2) -> ReLU -> Linear(hidden/2, width), no bias, from the saved matrices."""
    first, second = (weights[key] for key in PROJECTOR_KEYS)
    down = nn.Linear(first.shape[1], first.shape[0], bias=False)
    out = nn.Linear(second.shape[1], second.shape[0], bias=False)
    with torch.no_grad():
        down.weight.copy_(first)
        out.weight.copy_(second)
    return nn.Sequential(down, nn.ReLU(), out)


def read_projector(model_path: str) -> dict[str, torch.Tensor]:
    """The projector's two matrices, from `model.safetensors` or the shard the index names."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    files = {key: "model.safetensors" for key in PROJECTOR_KEYS}
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = {key: weight_map.get(key, "") for key in PROJECTOR_KEYS}
    weights = {}
    for key, name in files.items():
        try:
            with safe_open(str(root / name), framework="pt") as handle:
                weights[key] = handle.get_tensor(key)
        except Exception as exc:  # a missing file or key: the checkpoint is not in the published layout
            raise ModelLoadError(
                f"model: {model_path!r} names {ARCHITECTURE} but its weights lack {key} ({exc}); the "
                "listwise kind needs the projector saved beside the Qwen3 body"
            ) from exc
    return weights


def check_layer_pattern(config: Any, model_path: str) -> None:
    """jina-reranker-v3.5's sliding-window layers need their width: transformers' `Qwen3Config` keeps
    `sliding_window` only with `use_sliding_window` true, and a `sliding_attention` layer without one
    cannot run, so such a config stops the worker here with its cause instead of failing in a forward."""
    windowed = "sliding_attention" in (getattr(config, "layer_types", None) or [])
    if windowed and getattr(config, "sliding_window", None) is None:
        raise ModelLoadError(
            f"model: {model_path!r} has sliding_attention layers in layer_types but no sliding_window "
            "(transformers drops it unless use_sliding_window is true); set both in its config.json"
        )


def marker_id(tokenizer: Any, token: str, model_path: str) -> int:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ModelLoadError(
            f"model: the tokenizer of {model_path!r} does not know the marker {token!r} as one token "
            f"(it gives {ids}); a {ARCHITECTURE} tokenizer has both markers"
        )
    return int(ids[0])


def load_listwise(
    model_path: str, *, served_name: str | None, dtype: str, device: str, trust_remote_code: bool
) -> ListwiseModel:
    """transformers' `Qwen3Model` (the `model.` prefix is its base prefix, so the body's weights load
    into it as they are) and the projector, in the served dtype on the served device."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

    torch_device = resolve_device(device)
    precision = choose_precision(dtype, torch_device, "listwise")
    torch_dtype = precision.dtype
    try:
        config = Qwen3Config.from_pretrained(model_path)
        check_layer_pattern(config, model_path)
        body: Any = Qwen3Model.from_pretrained(model_path, config=config, dtype=torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(
            f"model: cannot load the {ARCHITECTURE} checkpoint {model_path!r}: {exc}"
        ) from exc
    weights = read_projector(model_path)
    projector = projector_from(weights).to(torch_dtype)
    body.to(torch_device).eval().requires_grad_(False)
    projector.to(torch_device).eval().requires_grad_(False)
    vocab = int(body.get_input_embeddings().num_embeddings)
    pad = tokenizer.pad_token_id
    return ListwiseModel(
        name=served_name or model_path,
        architecture=Architecture.LISTWISE,
        model=body,
        body=body,
        head=projector,
        tokenizer=tokenizer,
        device=torch_device,
        dtype=torch_dtype,
        dtype_reason=precision.reason,
        input_vocab_size=vocab,
        output_vocab_size=int(weights[PROJECTOR_KEYS[1]].shape[0]),  # the projector's width
        max_positions=getattr(config, "max_position_embeddings", None),
        mis_block_reason="a listwise model reads a job's documents together, by design",
        sliding_window=getattr(config, "sliding_window", None),  # reported only: transformers' own masks
        revision=checkpoint_revision(model_path),
        document_marker_id=marker_id(tokenizer, DOCUMENT_MARKER, model_path),
        query_marker_id=marker_id(tokenizer, QUERY_MARKER, model_path),
        pad_id=int(pad) if pad is not None and 0 <= int(pad) < vocab else 0,
    )
