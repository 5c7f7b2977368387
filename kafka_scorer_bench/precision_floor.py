"""The `bf16-floor` workload: every kind in float32 and in bfloat16 side by side, against the GEMM probe.

Issue 49 asks how much of the speed-up bf16 matmuls offer over float32 on this CPU each kind's forward
keeps. For each kind (`precision_kinds.py`) the same jobs run through every contender loaded in both
precisions, in alternating rounds (float32, bfloat16, float32, ...) so that load from other processes
falls on both alike; the fastest round of each is kept, as everywhere in the bench. The GEMM probe times
the kind's own MLP matmul in both precisions. The floor fraction is the measured bf16/fp32 speed-up over
the probe's: 1.0 means the kind kept all of what the matmul gains (the issue's goal is 0.8).

A contender's float32 scores are checked against the kind's reference contender (summary.py's
tolerance); bf16 scores are reported against float32, not judged (the fidelity table in
docs/performance.md judges them). Both precisions must answer the same jobs: the report carries a
digest of the jobs each was sent and the score rows each returned.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.contenders import Contender, drive, warmup_jobs
from kafka_scorer_bench.matmul_peak import gemm_rate
from kafka_scorer_bench.precision_kinds import PrecisionKind
from kafka_scorer_bench.probes import RunProbe, cpu_model
from kafka_scorer_bench.records import RunRecord, fastest
from kafka_scorer_bench.summary import max_abs_diff, tolerance

PRECISIONS = ("float32", "bfloat16")
KINDS = ("cross-encoder", "rerank", "late-interaction")
CPU = torch.device("cpu")


def jobs_digest(jobs: list[Job]) -> str:
    """What a precision's run was sent, in 16 hex digits: equal digests, the same jobs."""
    return hashlib.sha256(msgspec.json.encode(jobs)).hexdigest()[:16]


def gemm_probe(shape: tuple[int, int, int], quick: bool) -> dict:
    """The kind's MLP matmul in both precisions, FLOP/s, and bf16's speed-up over float32."""
    repeats = 2 if quick else 10
    rates = {dtype: gemm_rate(shape, CPU, getattr(torch, dtype), repeats) for dtype in PRECISIONS}
    return {"shape": list(shape), **rates, "ratio": rates["bfloat16"] / rates["float32"]}


def alternate(
    makes: dict[str, Callable[[], Contender]], jobs: list[Job], window: int, repeats: int, probe: RunProbe
) -> dict[str, tuple[RunRecord, str]]:
    """One contender in every precision: a warm-up each, then `repeats` rounds taking turns; per
    precision the fastest run and the digest of the jobs it was sent."""
    for make in makes.values():
        drive(make(), warmup_jobs(jobs), window, probe)
    runs: dict[str, list[RunRecord]] = {dtype: [] for dtype in makes}
    for _ in range(repeats):
        for dtype, make in makes.items():
            runs[dtype].append(drive(make(), jobs, window, probe))
    return {dtype: (fastest(records), jobs_digest(jobs)) for dtype, records in runs.items()}


def figures(record: RunRecord, digest: str, items: int, tokens: int) -> dict:
    """One precision of one contender: throughput, and what it answered."""
    wall = max(record.wall_s, 1e-9)
    errors = [e for e in record.errors if e]
    return {
        "items_per_s": items / wall,
        "tokens_per_s": tokens / wall,
        "wall_s": record.wall_s,
        "jobs_digest": digest,
        "score_rows": sum(len(s) for s in record.scores if s is not None),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "foreign_cpu_load": record.foreign_cpu_load,
        "runs": record.runs,
    }


def run_kind(kind: PrecisionKind, repeats: int, quick: bool, log: Callable) -> dict:
    """Every contender of `kind` in both precisions, the probe, and the figures side by side."""
    log(f"{kind.name}: {len(kind.jobs)} jobs, {kind.items} items; loading both precisions ...")
    loaded = {dtype: kind.load(dtype) for dtype in PRECISIONS}
    probe = RunProbe(CPU)
    records: dict[str, dict[str, tuple[RunRecord, str]]] = {}
    for name in loaded[PRECISIONS[0]]:
        log(f"  {name}, {' and '.join(PRECISIONS)} in turn ...")
        makes = {dtype: loaded[dtype][name] for dtype in PRECISIONS}
        records[name] = alternate(makes, kind.jobs, kind.window, repeats, probe)
    log("  GEMM probe ...")
    gemm = gemm_probe(kind.gemm_shape, quick)
    engine = records["engine"]["float32"][0]
    tokens = engine.forward_tokens  # what the engine reads for these jobs: one numerator for all
    reference = records[kind.reference]["float32"][0].scores
    contenders = {
        name: contender_row(by_dtype, kind.items, tokens, gemm["ratio"], reference)
        for name, by_dtype in records.items()
    }
    return {
        "model": kind.model,
        "jobs": len(kind.jobs),
        "items": kind.items,
        "tokens": tokens,
        "engine_tokens": {d: records["engine"][d][0].forward_tokens for d in PRECISIONS},
        "reference": kind.reference,
        "gemm": gemm,
        "contenders": contenders,
    }


def contender_row(
    by_dtype: dict[str, tuple[RunRecord, str]], items: int, tokens: int, gemm_ratio: float, reference
) -> dict:
    fp32, bf16 = (by_dtype[d][0] for d in PRECISIONS)
    row: dict = {d: figures(record, digest, items, tokens) for d, (record, digest) in by_dtype.items()}
    ratio = row["bfloat16"]["items_per_s"] / row["float32"]["items_per_s"]
    row["bf16_over_fp32"] = ratio
    row["floor_fraction"] = ratio / gemm_ratio
    row["max_abs_diff_bf16_vs_fp32"] = max_abs_diff(bf16.scores, fp32.scores)
    row["max_abs_diff_fp32_vs_reference"] = max_abs_diff(fp32.scores, reference)
    return row


def kind_ok(report: dict) -> bool:
    """Both precisions answered every job of the same jobs; float32 agrees with the reference."""
    checks = []
    for row in report["contenders"].values():
        fp32, bf16 = (row[d] for d in PRECISIONS)
        checks += [
            fp32["jobs_digest"] == bf16["jobs_digest"],
            fp32["score_rows"] == bf16["score_rows"] == report["items"],
            fp32["errors"] == bf16["errors"] == 0,
            row["max_abs_diff_fp32_vs_reference"] <= tolerance(torch.float32),
        ]
    same_tokens = len(set(report["engine_tokens"].values())) == 1
    return all(checks) and same_tokens


def run_precision_floor_bench(
    *,
    kinds: tuple[str, ...] = KINDS,
    model_shape: str | None = None,
    jobs: int | None = None,
    quick: bool = False,
    seed: int = 0,
    model_dir: str | None = None,
    repeats: int = 2,
    max_batch_tokens: int = 8192,
    log: Callable = print,
) -> dict:
    """CPU only: the question is this processor's bf16 floor (`--device` is not read)."""
    import tempfile

    from kafka_scorer.engine.api import native_bf16_feature

    with tempfile.TemporaryDirectory(prefix="kafka-scorer-floor-") as scratch:
        root = Path(model_dir or scratch)
        root.mkdir(parents=True, exist_ok=True)
        results = {}
        for name in kinds:
            kind = _kind(name, root, model_shape, jobs, quick, seed, max_batch_tokens)
            results[name] = run_kind(kind, repeats, quick, log)
            results[name]["ok"] = kind_ok(results[name])
    return {
        "cpu": cpu_model(),
        "native_bf16": native_bf16_feature(),
        "torch_threads": torch.get_num_threads(),
        "quick": quick,
        "repeats": repeats,
        "kinds": results,
        "ok": all(r["ok"] for r in results.values()),
    }


def _kind(
    name: str, root: Path, model_shape: str | None, jobs: int | None, quick: bool, seed: int, budget: int
) -> PrecisionKind:
    from kafka_scorer_bench import precision_kinds
    from kafka_scorer_bench.models import SHAPES

    if name == "cross-encoder":
        return precision_kinds.cross_encoder_kind(
            root, quick=quick, seed=seed, queries=jobs or 1, budget=budget
        )
    if name == "late-interaction":
        return precision_kinds.late_interaction_kind(
            root, quick=quick, seed=seed, queries=jobs or 1, budget=budget
        )
    if name == "rerank":
        shape = SHAPES[model_shape or ("tiny" if quick else "cpu-small")]
        return precision_kinds.rerank_kind(
            root, shape, quick=quick, seed=seed, jobs=jobs or (3 if quick else 2), budget=budget
        )
    raise ValueError(f"bf16-floor: {name!r} is not one of {KINDS}")
