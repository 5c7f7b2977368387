"""What every workload of one run shares: the device, the measuring tools, and models loaded once.

A checkpoint is written once per model kind (causal or classification) and loaded once into a `Scorer`
and once into the `BaselineScorer`, so no workload pays another's loading time and (a), (b) and (d)
really run on the same `Scorer`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from kafka_scorer.heap import freeze_loaded_heap
from kafka_scorer_bench.baseline import BaselineScorer
from kafka_scorer_bench.models import ModelShape, build_shaped_model
from kafka_scorer_bench.probes import RunProbe


@dataclass
class Environment:
    device: torch.device
    dtype: torch.dtype
    shape: ModelShape
    model_root: Path
    peak: dict
    probe: RunProbe
    template: str = ""
    """The causal scorer's prompt template (`--template`); its checkpoint then has a chat tokenizer."""
    decoder_forward: str = "auto"
    scorers: dict[str, object] = field(default_factory=dict)
    baselines: dict[str, BaselineScorer] = field(default_factory=dict)

    def checkpoint(self, kind: str) -> Path:
        dtype = str(self.dtype).removeprefix("torch.")
        chat = bool(self.template) and kind == "causal"
        path = self.model_root / f"{self.shape.name}-{kind}-{dtype}{'-chat' * chat}"
        if not (path / "config.json").exists():
            init_device = "cuda" if self.device.type == "cuda" else "cpu"
            build_shaped_model(path, self.shape, kind, dtype=dtype, init_device=init_device, chat=chat)  # type: ignore[arg-type]  # kind is a Kind literal from the workloads
        return path

    def scorer(self, kind: str, max_batch_tokens: int):
        from kafka_scorer.engine.api import Scorer

        if kind not in self.scorers:
            self.scorers[kind] = Scorer(
                str(self.checkpoint(kind)),
                served_model_name=f"bench-{self.shape.name}-{kind}",
                dtype=str(self.dtype).removeprefix("torch."),
                device=str(self.device),
                max_batch_tokens=max_batch_tokens,
                template=self.template if kind == "causal" else "",
                # the contenders' timed runs repeat the same jobs: a prefix cache would serve the repeats
                # from memory; it is measured on its own (`--workload judge`, prefix.py)
                prefix_cache_mb=0,
                decoder_forward=self.decoder_forward,
            )
            freeze_loaded_heap()  # as the worker does after loading: every contender alike
        return self.scorers[kind]

    def baseline(self, kind: str) -> BaselineScorer:
        if kind not in self.baselines:
            self.baselines[kind] = BaselineScorer(
                str(self.checkpoint(kind)), dtype=self.dtype, device=self.device
            )
        return self.baselines[kind]
