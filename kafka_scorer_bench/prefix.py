"""`kafka-scorer bench --workload judge`: the engine with the prefix cache on and off, side by side
(issue 20).

Three workloads, each run by two scorers over the same checkpoint (`prefix_cache_mb` auto and 0):
- judge: an LLM-as-judge prompt, a ~400-token rubric in the template before `{query}`, a short
  question and one ~40-token answer per job, yes/no labels. The rubric is the same for every job, so
  with the cache a job runs only its question and answer.
- rerank (qwen3-reranker): the rerank shape as text through the preset template, MIS on: the
  template's system prompt and instruction recur, each job's query does not.
- no shared prefix: token-id jobs, every query new (MIS on), so the cache can only cost.

Each scorer first serves the jobs once untimed (the cache then holds what a running worker's would),
then the two take turns for `repeats` timed passes; the fastest pass of each is reported, with the
token ratio (tokens run without the cache over tokens run with it), the speedup, the largest score
difference between the two, and the cache's peak size.

Batch invariance: for a sample of judge jobs, the largest difference of a job's scores across batch
compositions (alone, among all jobs in order, reversed, shuffled), with the cache on and off, in
float32 and bfloat16.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kafka_scorer.wire.protocol import Job, Result
from kafka_scorer_bench.models import FIRST_REGULAR_ID, SHAPES, build_shaped_model
from kafka_scorer_bench.templated import _text

GOAL_JUDGE = 0.9
"""judge: speedup at least this fraction of the token ratio."""
GOAL_NO_PREFIX = 0.97
"""no shared prefix: at least this fraction of the speed without the cache."""


@dataclass(frozen=True)
class PrefixBenchSpec:
    judge_jobs: int
    rubric_tokens: int
    question_tokens: int
    answer_tokens: int
    rerank_jobs: int
    rerank_items: int
    rerank_query_tokens: int
    rerank_item_tokens: int
    plain_jobs: int
    plain_query_tokens: int
    plain_items: int
    plain_item_tokens: int
    invariance_sample: int
    invariance_batch: int
    max_batch_tokens: int


FULL = PrefixBenchSpec(48, 400, 8, 40, 8, 16, 24, 32, 16, 128, 8, 32, 4, 16, 8192)
QUICK = PrefixBenchSpec(8, 60, 4, 8, 2, 3, 6, 6, 4, 16, 3, 4, 2, 6, 1024)


def judge_template(rubric: str) -> dict:
    """A judge's prompt: the rubric (system message) and the instruction precede the question."""
    text = (
        "<|im_start|>system\nYou judge answers. Use this rubric.\n"
        + rubric
        + "\nReply yes or no.<|im_end|>\n"
        "<|im_start|>user\n<Instruct>: {instruction}\n<Question>: {query}\n<Answer>: {item}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    return {
        "name": "judge",
        "text": text,
        "instruction": "Does the answer follow the rubric",
        "label_tokens": ["yes", "no"],
    }


def run_prefix_bench(
    *,
    device: str,
    dtype: str,
    model_shape: str | None,
    quick: bool,
    seed: int,
    model_dir: str | None,
    repeats: int,
    log=print,
) -> dict:
    from kafka_scorer.engine.api import Scorer

    spec = QUICK if quick else FULL
    shape = SHAPES[model_shape or ("tiny" if quick else "cpu-small")]
    rng = random.Random(f"prefix:{seed}")
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-prefix-") as tmp:
        root = Path(model_dir or tmp)
        path = str(build_shaped_model(root / f"{shape.name}-causal-chat", shape, "causal", chat=True))
        template_file = root / "judge-template.json"
        from transformers import AutoTokenizer

        rubric = _text(AutoTokenizer.from_pretrained(path), rng, spec.rubric_tokens)
        template_file.write_text(json.dumps(judge_template(rubric)))

        def scorers(template: str, kind: str = dtype) -> tuple[Any, Any]:
            options = dict(
                dtype=kind, device=device, template=template, max_batch_tokens=spec.max_batch_tokens
            )
            return Scorer(path, prefix_cache_mb=0, **options), Scorer(path, prefix_cache_mb=-1, **options)

        runs: dict[str, dict] = {}
        off, on = scorers(str(template_file))
        tokenizer = on.describe().loaded.tokenizer

        def judge(rng: random.Random) -> list[Job]:
            return [
                Job(
                    id=f"judge-{n}",
                    query=_text(tokenizer, rng, spec.question_tokens),
                    items=[_text(tokenizer, rng, spec.answer_tokens)],
                    apply_softmax=True,
                )
                for n in range(spec.judge_jobs)
            ]

        log(f"judge: {spec.judge_jobs} jobs a pass")
        runs["judge"] = _compare(off, on, judge, repeats, seed)
        # batch-mates for the invariance check: the first `invariance_batch` jobs of a fresh pass
        sample = judge(random.Random(f"prefix:{seed}:invariance"))[: spec.invariance_batch]
        invariance = {"float32": _invariance(off, on, sample, spec.invariance_sample, rng)}
        if device == "cpu" or dtype != "bfloat16":
            off16, on16 = scorers(str(template_file), "bfloat16")
            invariance["bfloat16"] = _invariance(off16, on16, sample, spec.invariance_sample, rng)

        off, on = scorers("qwen3-reranker")

        def rerank(rng: random.Random) -> list[Job]:
            return [
                Job(
                    id=f"rerank-{n}",
                    query=_text(tokenizer, rng, spec.rerank_query_tokens),
                    items=[_text(tokenizer, rng, spec.rerank_item_tokens) for _ in range(spec.rerank_items)],
                    apply_softmax=True,
                    multi_item=True,
                )
                for n in range(spec.rerank_jobs)
            ]

        log(f"rerank (qwen3-reranker): {spec.rerank_jobs} jobs a pass")
        runs["rerank (qwen3-reranker)"] = _compare(off, on, rerank, repeats, seed)

        off, on = scorers("")

        labels = [FIRST_REGULAR_ID, FIRST_REGULAR_ID + 1]

        def plain(rng: random.Random) -> list[Job]:
            def ids(n: int) -> list[int]:
                return [rng.randrange(FIRST_REGULAR_ID, shape.vocab_size) for _ in range(n)]

            return [
                Job(
                    id=f"plain-{n}",
                    query=ids(spec.plain_query_tokens),
                    items=[ids(spec.plain_item_tokens) for _ in range(spec.plain_items)],
                    label_token_ids=labels,
                    multi_item=True,
                )
                for n in range(spec.plain_jobs)
            ]

        log(f"no shared prefix: {spec.plain_jobs} jobs a pass")
        runs["no shared prefix"] = _compare(off, on, plain, repeats, seed)
    return {
        "spec": asdict(spec),
        "model_shape": shape.name,
        "device": device,
        "dtype": dtype,
        "runs": runs,
        "invariance": invariance,
        "goal": {"judge_speedup_over_token_ratio": GOAL_JUDGE, "no_prefix_speedup": GOAL_NO_PREFIX},
    }


def _timed(scorer: Any, jobs: list[Job]) -> tuple[float, list[Result]]:
    started = time.perf_counter()
    results = scorer.score_jobs(jobs)
    return time.perf_counter() - started, results


def _compare(off: Any, on: Any, make: Callable[[random.Random], list[Job]], repeats: int, seed: int) -> dict:
    """Untimed pass each (steady state), then alternating timed passes; the fastest of each. Every pass
    gets new jobs of the same shape (what recurs is what the workload shares, never a whole job)."""
    warm = make(random.Random(f"prefix:{seed}:warm"))
    off.score_jobs(warm)
    on.score_jobs(warm)
    best_off = best_on = float("inf")
    results_off: list[Result] = []
    results_on: list[Result] = []
    for attempt in range(repeats):
        jobs = make(random.Random(f"prefix:{seed}:{attempt}"))
        took, results_off = _timed(off, jobs)
        best_off = min(best_off, took)
        took, results_on = _timed(on, jobs)
        best_on = min(best_on, took)
    errors = [r.error.message for r in results_off + results_on if r.error is not None]
    if errors:
        raise RuntimeError(f"prefix bench: jobs failed: {errors[:3]}")
    run_off = sum(r.prompt_tokens for r in results_off)
    run_on = sum(r.prompt_tokens for r in results_on)
    stats = on.describe().prefix_cache
    return {
        "jobs": len(results_on),
        "tokens_without_cache": run_off,
        "tokens_with_cache": run_on,
        "cached_tokens": sum(r.cached_tokens for r in results_on),
        "token_ratio": run_off / run_on,
        "seconds_without_cache": best_off,
        "seconds_with_cache": best_on,
        "speedup": best_off / best_on,
        "max_score_diff": _max_diff(results_off, results_on),
        "cache": asdict(stats) if stats is not None else None,
    }


def _max_diff(a: list[Result], b: list[Result]) -> float:
    return max(
        (
            abs(x - y)
            for ra, rb in zip(a, b)
            for rowa, rowb in zip(ra.scores, rb.scores)
            for x, y in zip(rowa, rowb)
        ),
        default=0.0,
    )


def _invariance(off: Any, on: Any, jobs: list[Job], sample: int, rng: random.Random) -> dict:
    """Each sampled job's scores across batch compositions and cache states; the largest spread."""
    picked = jobs[:sample]
    shuffled = list(jobs)
    rng.shuffle(shuffled)
    compositions = {"in order": list(jobs), "reversed": list(reversed(jobs)), "shuffled": shuffled}
    seen: dict[str, list[list[list[float]]]] = {job.id or "": [] for job in picked}
    for scorer in (off, on, on):  # cache off, then on (cold: the first pass fills it), then on (warm)
        for job in picked:
            seen[job.id or ""].append(scorer.score_jobs([job])[0].scores or [])
        for batch in compositions.values():
            for result in scorer.score_jobs(batch):
                if result.id in seen:
                    seen[result.id].append(result.scores or [])
    spread = 0.0
    for rows in seen.values():
        for other in rows[1:]:
            spread = max(spread, max(abs(x - y) for ra, rb in zip(rows[0], other) for x, y in zip(ra, rb)))
    return {"jobs": len(picked), "compositions": 1 + len(compositions), "cache_states": 3, "max_diff": spread}


def format_prefix_report(report: dict) -> str:
    lines = [
        f"prefix cache on {report['device']} ({report['dtype']}), model {report['model_shape']}",
        "| workload | tokens off | tokens on | token ratio | s off | s on | speedup | speedup / ratio "
        "| max score diff | cache peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, run in report["runs"].items():
        cache = run["cache"] or {}
        cells = [
            name,
            f"{run['tokens_without_cache']:,}",
            f"{run['tokens_with_cache']:,}",
            f"{run['token_ratio']:.2f}x",
            f"{run['seconds_without_cache']:.3f}",
            f"{run['seconds_with_cache']:.3f}",
            f"{run['speedup']:.2f}x",
            f"{run['speedup'] / run['token_ratio']:.2f}",
            f"{run['max_score_diff']:.1e}",
            f"{cache.get('peak_bytes', 0) / 2**20:.1f} MiB",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for dtype, inv in report["invariance"].items():
        lines.append(
            f"batch invariance ({dtype}): {inv['jobs']} jobs x {inv['compositions']} batch compositions x "
            f"{inv['cache_states']} cache states (off, cold, warm): largest difference {inv['max_diff']:.1e}"
        )
    judge = report["runs"].get("judge")
    plain = report["runs"].get("no shared prefix")
    goal = report["goal"]
    if judge and plain:
        judge_goal, plain_goal = goal["judge_speedup_over_token_ratio"], goal["no_prefix_speedup"]
        judge_met = judge["speedup"] >= judge_goal * judge["token_ratio"]
        plain_met = plain["speedup"] >= plain_goal
        lines.append(
            f"goal: judge speedup >= {judge_goal} x token ratio: {'met' if judge_met else 'NOT met'}; "
            f"no shared prefix >= {plain_goal}x: {'met' if plain_met else 'NOT met'}"
        )
    return "\n".join(lines)
