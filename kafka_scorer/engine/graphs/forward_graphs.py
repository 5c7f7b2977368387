"""The decoder body captured as one CUDA graph per token bucket, and replayed for the forwards that fit.

Launching a forward's kernels from Python costs the same whatever the batch's size: for a 28-layer
decoder, hundreds of launches and the Python between them. A small forward (a quiet minute's lone job)
spends more time launching than computing; a graph launches them all at once. SGLang turns its graphs
off for multi-item scoring because its attention metadata changes shape with every batch; here the
stream is padded to a bucket (`buckets.py`), and the metadata lives in static buffers (`static.py`), so
every MIS batch of a bucket's size replays the same graph.

`prepare` runs at warm-up (after the compiles), largest bucket first, so that the smaller graphs share
the largest one's memory pool. Off CUDA (`capture=False`) nothing is captured: the body runs on the same
static buffers, which is what the CPU tests check. The graph covers the body only: the heads, the
gather of scoring rows and the copy to the host run after it, as for an uncaptured forward.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kafka_scorer.engine.attention.flex import BLOCK
from kafka_scorer.engine.attention.registry import METADATA_KWARG
from kafka_scorer.engine.graphs.static import StaticInputs
from kafka_scorer.engine.pack.batch import ForwardBatch
from kafka_scorer.engine.pack.buckets import AUTO_GRAPH_TOKENS, GraphBuckets

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE  # torch's name for a graph's memory-pool token (`CUDAGraph.pool`)

log = logging.getLogger(__name__)

_WARM_RUNS = 2
"""Forwards per bucket before its capture: the first may compile or autotune, the second runs warm."""


@dataclass(frozen=True)
class GraphStats:
    """For the worker's /metrics (`kafka_scorer_cuda_graph_*`)."""

    replays: int
    """Forwards whose body replayed a graph (off CUDA: ran from the static buffers)."""
    buckets: int
    """Token buckets with a graph."""


@dataclass
class _Captured:
    inputs: StaticInputs
    output: torch.Tensor
    """[tokens, hidden]: the body's output, overwritten by every replay of this (or another) bucket."""
    graph: torch.cuda.CUDAGraph | None


@dataclass
class ForwardGraphs:
    body: torch.nn.Module
    """The engine's fused decoder (`engine/models/decoder.py`)."""
    device: torch.device
    buckets: GraphBuckets
    window: int | None = None
    """The smallest sliding window of the model's layers: a batch with a longer sequence would take the
    dense path in those layers, which the graphs did not record, so it runs uncaptured."""
    capture: bool = True
    _captured: dict[int, _Captured] = field(default_factory=dict)
    replays: int = 0
    """Forwards that ran from a graph (or, off CUDA, from the static buffers)."""

    @property
    def ready(self) -> bool:
        return bool(self._captured)

    def bucket_for(self, tokens: int) -> int | None:
        """The packing thread's padding target (`build_forward_batch(pad_to=...)`): None until captured."""
        return self.buckets.bucket_for(tokens) if self._captured else None

    @torch.inference_mode()
    def prepare(self) -> None:
        """Capture every bucket, largest first. A failure leaves no graph at all (one warning line): the
        forwards then run as before, unpadded."""
        pool: _POOL_HANDLE | None = None
        try:
            for tokens in sorted(self.buckets.sizes, reverse=True):
                inputs = StaticInputs.allocate(tokens, self.device)
                captured = self._capture(inputs, pool)
                pool = captured.graph.pool() if captured.graph is not None else None
                self._captured[tokens] = captured
        except Exception as exc:  # a kernel that cannot be captured: serve uncaptured, as before
            log.warning("CUDA graphs off: capture failed (%s: %s)", type(exc).__name__, exc)
            self.drop()

    def stats(self) -> GraphStats:
        return GraphStats(self.replays, len(self._captured))

    def drop(self) -> None:
        """Forget every graph (and its memory): forwards run uncaptured and unpadded from now on."""
        self._captured.clear()

    def hidden(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The body's output [T, hidden] for `batch` from its bucket's graph, or None when the batch has
        none (no bucket of its size, another backend, a sequence longer than a window)."""
        captured = self._captured.get(batch.num_tokens)
        if captured is None or (self.window is not None and batch.layout.longest > self.window):
            return None
        try:
            if not captured.inputs.load(batch):
                return None
            if captured.graph is not None:
                captured.graph.replay()
            else:
                captured.output.copy_(self._run(captured.inputs))
        except Exception as exc:  # never a job's failure: this forward and the next run from Python
            log.warning("CUDA graphs off: a replay failed (%s: %s)", type(exc).__name__, exc)
            self.drop()
            return None
        self.replays += 1
        return captured.output

    def _run(self, inputs: StaticInputs) -> torch.Tensor:
        kwargs = {METADATA_KWARG: inputs.metadata}
        return self.body(input_ids=inputs.input_ids, position_ids=inputs.positions, **kwargs)[0][0]

    def _capture(self, inputs: StaticInputs, pool: _POOL_HANDLE | None) -> _Captured:
        if not self.capture:
            return _Captured(inputs, self._run(inputs).clone(), None)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(_WARM_RUNS):
                self._run(inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            output = self._run(inputs)
        torch.cuda.synchronize(self.device)
        return _Captured(inputs, output, graph)


def graphs_for(
    body: torch.nn.Module,
    device: torch.device,
    setting: int,
    max_batch_tokens: int,
    model_window: int | None = None,
) -> ForwardGraphs | None:
    """The graphs the `cuda_graph_tokens` setting asks for over `body`, or None where they do not apply.

    -1 (the default): forwards up to `AUTO_GRAPH_TOKENS` on CUDA, none elsewhere; 0: none; N > 0:
    forwards up to N tokens (off CUDA uncaptured, on the same padded buffers: the CPU tests' path).
    Only the engine's own decoder layers are captured (transformers' bodies build masks and caches in
    Python), and never beyond the token budget. `model_window` is the window of layers that do not
    name their own (`LoadedModel.sliding_window`)."""
    from kafka_scorer.engine.models.decoder import FusedDecoder

    largest = AUTO_GRAPH_TOKENS if setting < 0 and device.type == "cuda" else max(setting, 0)
    largest = min(largest, max_batch_tokens)
    if not largest or not isinstance(body, FusedDecoder):
        if setting > 0:
            log.info("cuda_graph_tokens=%d: no graphs for this model (transformers' layers)", setting)
        return None
    windows = [w for layer in body.layers if (w := layer.window if layer.names_window else model_window)]
    if min(windows, default=BLOCK) < BLOCK:  # the padding's own blocks would take the dense path
        return None
    return ForwardGraphs(
        body,
        device,
        GraphBuckets.up_to(largest),
        window=int(min(windows)) if windows else None,
        capture=device.type == "cuda",
    )
