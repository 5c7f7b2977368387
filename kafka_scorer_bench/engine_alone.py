"""What the engine-alone benches (`deterministic.py`, `graphs.py`) share: the device, dtype
and model shape a run resolves to, and one timed `score_jobs` call."""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from kafka_scorer.engine.api import Scorer
from kafka_scorer.wire.protocol import Job, Result
from kafka_scorer_bench import report_file
from kafka_scorer_bench.models import SHAPES, ModelShape, build_shaped_model


@dataclass(frozen=True)
class EngineRun:
    device: str
    dtype: str
    shape: ModelShape
    name: str
    model_dir: str | None = None

    @cached_property
    def root(self) -> Path:
        """Where the generated checkpoints go (`--model-dir`, else a fresh temporary folder, made when
        the first checkpoint is: a bench that builds none leaves none behind)."""
        return Path(self.model_dir or tempfile.mkdtemp(prefix=f"kafka-scorer-{self.name}-"))

    def checkpoint(self, kind: str = "causal", chat: bool = False) -> Path:
        """The run's random checkpoint of `kind` (`chat`: with a chat tokenizer, for a prompt template),
        built once per `--model-dir`."""
        path = self.root / f"{self.shape.name}-{kind}{'-chat' if chat else ''}-{self.dtype}"
        if not (path / "config.json").exists():
            build_shaped_model(path, self.shape, kind, dtype=self.dtype, chat=chat)
        return path


def engine_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The flags every engine-alone bench takes (`resolve_run` reads them); each adds its own."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--model-shape", choices=sorted(SHAPES), default=None)
    parser.add_argument("--quick", action="store_true", help="tiny model and jobs (seconds)")
    parser.add_argument("--model-dir", default=None, help="keep the generated checkpoints here")
    parser.add_argument("--json", default=None, help="also write the report here")
    return parser


def resolve_run(args: argparse.Namespace, name: str) -> EngineRun:
    """`--device auto` is CUDA where there is one; the shape the 0.6B on CUDA, cpu-small on the CPU, tiny
    with `--quick`; the dtype bf16 on CUDA, float32 elsewhere."""
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    shape = SHAPES[
        args.model_shape or ("tiny" if args.quick else "qwen3-0.6b" if device == "cuda" else "cpu-small")
    ]
    dtype = args.dtype if args.dtype != "auto" else ("bfloat16" if device.startswith("cuda") else "float32")
    return EngineRun(device, dtype, shape, name, args.model_dir)


def timed(scorer: Scorer, jobs: list[Job]) -> tuple[float, list[Result]]:
    """Seconds for `scorer.score_jobs(jobs)` (the device idle at the start), and its results."""
    if scorer.describe().loaded.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    results = scorer.score_jobs(jobs)
    return time.perf_counter() - started, results


def write_report(args: argparse.Namespace, report: dict) -> None:
    """The report as JSON to `--json`, when given (whole or not at all: `report_file.py`)."""
    if args.json:
        report_file.write_report(args.json, report)
