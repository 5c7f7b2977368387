"""Results as a person reads them: a ranking with each item's text, and the provenance said once.

A result's `ranking` is `[{index, score}]`: right for a program, unreadable in a terminal, where the
question is "which documents won". Both `kafka-scorer submit` (its summary on stderr) and the demo's
rankings table show it the same way, one line per ranked item: rank, index in `items`, score, and the
item's text cut to one short line. Provenance (`model_revision`, template, dtype) is the same on every
result a worker gives, so it is printed once per distinct value, not once per job.
"""

from __future__ import annotations

from kafka_scorer.wire.protocol import Job, Result

ITEM_WIDTH = 30
"""Characters of an item's text shown beside its rank; the rest is cut with an ellipsis."""


def ranking_lines(job: Job, result: Result) -> list[str]:
    """`1. #2 0.9731 Sacramento is the capital of…`: rank, index in `items`, score, the item's text."""
    lines = []
    for rank, entry in enumerate(result.ranking or [], start=1):
        item = job.items[entry.index] if 0 <= entry.index < len(job.items) else None
        text = "" if item is None else " " + shorten(item)
        lines.append(f"{rank}. #{entry.index} {entry.score:.4f}{text}")
    return lines


def shorten(item: str | list[int], width: int = ITEM_WIDTH) -> str:
    """An item on one short line: text with its whitespace folded and cut with an ellipsis; token ids
    (no text to show) as their count."""
    if isinstance(item, list):
        return f"<{len(item)} token ids>"
    text = " ".join(item.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def provenance_lines(results: list[Result | None]) -> list[str]:
    """`provenance: template qwen3-reranker (hash …), model_revision sha256:…, dtype float32`, once per
    distinct value among the successful results (more than one: a rollout is in progress, or two
    workers serve different checkpoints on one topic), with how many results carried each."""
    seen: dict[tuple[str, str, str], int] = {}
    for result in results:
        if result is None or result.error is not None:
            continue
        template = f"{result.template.name} (hash {result.template.hash})" if result.template else "none"
        key = (template, result.model_revision or "unknown", result.dtype or "unknown")
        seen[key] = seen.get(key, 0) + 1
    return [
        f"provenance: template {template}, model_revision {revision}, dtype {dtype}"
        + (f" ({count} result{'s' * (count != 1)})" if len(seen) > 1 else "")
        for (template, revision, dtype), count in seen.items()
    ]
