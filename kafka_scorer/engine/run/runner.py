"""ForwardBatch -> hidden states -> scores, for the text kinds with one code path.

The decoder (or encoder) runs once over the flat stream, called with what its kind adds to the stream
(`body_options`: a decoder's turns transformers' KV cache off, an encoder's is empty, so this stage
asks nothing of which it is); only the scoring rows are gathered, and the kind says which head scores
them (`labels`: the LM head at the job's label tokens, else the head's classes). An encoder's row is its
pair's first token, or the mean over the pair's tokens (ModernBERT's mean pooling: the batch's
`token_rows`), and its head is the stock classifier (`engine/models/encoder_family.py`).
The single device->host copy is at the end, when scores (and the hidden rows that were asked for)
come back. A forward padded to a captured bucket replays its CUDA graph for the body
(`engine/graphs/`); the rest is the same.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

import torch

from kafka_scorer.engine.attention.cached import PrefixedMetadata
from kafka_scorer.engine.attention.registry import METADATA_KWARG
from kafka_scorer.engine.graphs.forward_graphs import ForwardGraphs
from kafka_scorer.engine.kernels.label_scores import Backend, resolve_backend
from kafka_scorer.engine.models.loaded import LoadedModel
from kafka_scorer.engine.pack.batch import ForwardBatch
from kafka_scorer.engine.recurrent.runs import RUNS_KWARG, RunPrefixes, StateEntry, build_runs
from kafka_scorer.engine.run.heads import causal_label_scores, classification_scores
from kafka_scorer.engine.run.invariant_heads import invariant_classification_scores, invariant_label_scores

CAUSAL_BODY: Mapping[str, object] = MappingProxyType({"use_cache": False})
"""A decoder body's options: transformers' decoders would build a KV cache each forward, for nothing
(the engine's own decoder ignores it)."""


@dataclass
class BatchOutput:
    scores: torch.Tensor
    """[R, C] float32 on the CPU: C = max label count (CausalLM) or number of classes."""
    hidden: torch.Tensor
    """[rows asked for, hidden] in the model dtype on the CPU, in `ForwardBatch.hidden_rows` order."""


class ModelRunner:
    def __init__(
        self,
        model: LoadedModel,
        deterministic: bool = False,
        graphs: ForwardGraphs | None = None,
        *,
        labels: bool = False,
        body_options: Mapping[str, object] = CAUSAL_BODY,
    ) -> None:
        """`labels`: the kind scores label tokens through the LM head (a label scorer), else its head's
        classes (a classifier, a cross-encoder). `body_options`: what the body is called with beside
        the stream, as the kind says (a decoder's by default; an encoder's forward may not take them)."""
        self.model = model
        self.labels = labels
        self.body_options = body_options
        self.deterministic = deterministic
        """Heads by fixed-shape row blocks (`engine/run/invariant_heads.py`)."""
        self.graphs = graphs
        """The body's CUDA graphs (`engine/graphs/`), used once captured; None where they do not apply."""
        self.label_backend: Backend = "auto"
        """The label kernels' backend (`kernels/label_scores.py`): Triton on CUDA, unless the warm-up
        found it broken here (`engine/load/warm_up_fallbacks.py`); deterministic mode has its own."""

    @property
    def label_kernels(self) -> str:
        """How this runner computes label scores: "triton", "torch", "invariant" (deterministic mode's
        fixed-shape blocks) or "none" (a classifier); what the start-up line says and what the warm-up
        may fall back from."""
        if not self.labels:
            return "none"
        if self.deterministic:
            return "invariant"
        return resolve_backend(self.label_backend, self.model.device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> BatchOutput:
        model = self.model
        device = model.device

        def to_device(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(device, non_blocking=True)

        hidden = self.graphs.hidden(batch) if self.graphs is not None else None
        if hidden is None:
            hidden = self._body(batch, to_device)
        if batch.token_rows is not None:
            mean = _ordered_mean_rows if self.deterministic else _mean_rows
            rows = mean(hidden, to_device(batch.token_rows), batch.score_index.numel())
        else:
            rows = hidden.index_select(0, to_device(batch.score_index))
        softmax_rows = to_device(batch.softmax_rows)
        if self.labels:
            label_scores = (
                invariant_label_scores
                if self.deterministic
                else functools.partial(causal_label_scores, backend=self.label_backend)
            )
            scores = label_scores(
                rows,
                model.head,
                to_device(batch.label_ids),
                to_device(batch.label_mask),
                softmax_rows,
                need_softmax=batch.any_softmax_rows,
                need_logprob=batch.any_logprob_rows,
                softcap=model.final_logit_softcap,
            )
        else:
            head = invariant_classification_scores if self.deterministic else classification_scores
            scores = head(rows, model.head, softmax_rows, to_device(batch.sigmoid_rows))
        pooled = rows.index_select(0, to_device(batch.hidden_rows))
        return BatchOutput(scores=scores.cpu(), hidden=pooled.cpu())

    def _body(self, batch: ForwardBatch, to_device) -> torch.Tensor:
        """The model body run from Python: [T] tokens -> [T, hidden]."""
        inputs = {
            **self.body_options,
            "input_ids": to_device(batch.input_ids)[None],
            "position_ids": to_device(batch.positions)[None],
            # Once per batch, before the model body: every layer reads these device tensors.
            METADATA_KWARG: batch.attention.to(self.model.device),
        }
        recurrent = self.model.recurrent
        if recurrent is not None:
            # Hybrid decoders' stateful layers run each sequence and item from its own state (`recurrent/`).
            attention = batch.attention
            prefixes = _run_prefixes(attention) if isinstance(attention, PrefixedMetadata) else None
            pin = self.model.device.type == "cuda"
            runs = build_runs(batch.layout, recurrent.window, pin=pin, prefixes=prefixes)
            inputs[RUNS_KWARG] = runs.to(self.model.device)
        if batch.token_types is not None:
            inputs["token_type_ids"] = to_device(batch.token_types)[None]
        return self.model.body(**inputs)[0][0]


def _run_prefixes(attention: PrefixedMetadata) -> RunPrefixes:
    """A forward's prefixes as a hybrid's stateful layers need them: the cut sequences start from their
    head's state; the fills and extensions keep theirs (`engine/recurrent/runs.py`)."""
    stores = {start: entry for entry, start in attention.fills}
    stores.update({start: entry for entry, _, start in attention.extends})
    # the attention layers name only the keys and values they use; the entries are the prefix cache's,
    # which keep the stateful layers' states too (`engine/pack/prefix_cache.py`)
    entries = cast("list[StateEntry]", attention.entries)
    return RunPrefixes(tuple(entries), dict(attention.starts), stores)


def _mean_rows(hidden: torch.Tensor, token_rows: torch.Tensor, count: int) -> torch.Tensor:
    """Mean of each pair's token states ([T, H] -> [count, H]), as ModernBERT's mean pooling computes it."""
    sums = torch.zeros(count, hidden.shape[-1], dtype=hidden.dtype, device=hidden.device)
    sums.index_add_(0, token_rows, hidden)
    sizes = torch.bincount(token_rows, minlength=count).to(hidden.dtype)
    return sums / sizes[:, None]


def _ordered_mean_rows(hidden: torch.Tensor, token_rows: torch.Tensor, count: int) -> torch.Tensor:
    """`_mean_rows` one pair at a time: each sum a reduction of that pair's rows alone (on CUDA
    `index_add_` adds by atomics, in no fixed order), for deterministic mode."""
    sizes = torch.bincount(token_rows, minlength=count).tolist()
    return torch.stack([pair.mean(0) for pair in hidden.split(sizes)])
