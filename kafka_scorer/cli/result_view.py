"""Results as a person reads them: a ranking with each item's text, and the provenance said once.

A result's `ranking` is `[{index, score}]`: right for a program, unreadable in a terminal, where the
question is "which documents won". Both `kafka-scorer submit` (its summary on stderr) and the demo's
rankings table show it the same way, one line per ranked item: rank, index in `items`, score, and the
item's text cut to one short line. Provenance (`model_revision`, template, dtype) is the same on every
result a worker gives, so it is printed once per distinct value, not once per job.
"""

from __future__ import annotations

from kafka_scorer.wire.content import Content, ImagePart
from kafka_scorer.wire.protocol import Job, Result

ITEM_WIDTH = 30
"""Characters of an item's text shown beside its rank; the rest is cut with an ellipsis."""


def ranked_entries(result: Result) -> list[tuple[int, float]] | None:
    """(index, score) of a result's order: its `ranking`, or a rerank-shaped job's `results`."""
    if result.results is not None:
        return [(entry.index, entry.relevance_score) for entry in result.results]
    if result.ranking is not None:
        return [(entry.index, entry.score) for entry in result.ranking]
    return None


def ranking_lines(job: Job, result: Result) -> list[str]:
    """`1. #2 0.9731 Sacramento is the capital of…`: rank, index in `items` (or `documents`), score,
    the item's text."""
    lines = []
    inputs = job.inputs
    for rank, (index, score) in enumerate(ranked_entries(result) or [], start=1):
        item = inputs[index] if 0 <= index < len(inputs) else None
        text = "" if item is None else " " + shorten(item)
        lines.append(f"{rank}. #{index} {score:.4f}{text}")
    return lines


def shorten(item: str | list[int] | dict | Content, width: int = ITEM_WIDTH) -> str:
    """An item on one short line: text with its whitespace folded and cut with an ellipsis; token ids
    (no text to show) as their count; content parts as their text with `[image]` for each image; an
    object document by its `text` field, else its field names."""
    if isinstance(item, list):
        return f"<{len(item)} token ids>"
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        item = " ".join(
            "[image]" if part.get("type") == "image" else str(part.get("text", ""))
            for part in item["content"]
            if isinstance(part, dict)
        )
    elif isinstance(item, Content):
        item = " ".join("[image]" if isinstance(part, ImagePart) else part.text for part in item.content)
    if isinstance(item, dict):
        text = item.get("text")
        item = text if isinstance(text, str) else "{" + ", ".join(map(str, item)) + "}"
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
