"""`kafka-scorer model NAME DIR`: write one of the demo's small random models to a directory.

Without a model hub (or before downloading gigabytes), a person trying the worker needs something to
serve. This writes a tiny random checkpoint and tokenizer with `save_pretrained`, so the worker loads it
through exactly the path a real checkpoint takes, and prints label ids that are valid for it, ready to
paste into a job. Scores from a random model mean nothing; the plumbing is what it shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from kafka_scorer.errors import EXIT_USER_ERROR

if TYPE_CHECKING:
    from kafka_scorer.checkpoints.tiny_models import Arch, Kind


@dataclass(frozen=True)
class Choice:
    """One model `kafka-scorer model` can write: what kind it is (which builder runs, which job it
    prints), the line the help and the summary show, and, for the plain decoder kinds, its family."""

    kind: str
    text: str
    arch: Arch = "qwen3"


MODELS = {
    "causal": Choice("causal", "a tiny Qwen3-shaped CausalLM (jobs ask for label-token probabilities)"),
    "classification": Choice("classification", "a tiny Qwen3-shaped classifier with 3 classes"),
    "colbert": Choice(
        "colbert",
        "a tiny late-interaction (ColBERT) reranker in PyLate's layout: one MaxSim score per item",
    ),
    "jina-reranker-v3": Choice(
        "listwise",
        "a tiny listwise reranker in jina-reranker-v3's layout (JinaForRanking): a job's items read in one "
        "prompt, each scored by cosine with the query",
    ),
    "jina-reranker-v3.5": Choice(
        "listwise-v3.5",
        "as jina-reranker-v3, with v3.5's layer pattern: sliding-window layers beside global ones",
    ),
    "qwen3-vl-reranker": Choice(
        "vl-reranker",
        "a tiny Qwen3-VL yes/no reranker that reads images (content parts) (--template qwen3-vl-reranker)",
    ),
    "qwen3-reranker": Choice(
        "reranker",
        "a tiny Qwen3-shaped yes/no reranker with a Qwen-style chat tokenizer (--template qwen3-reranker)",
    ),
    "qwen3.5": Choice(
        "causal",
        "a tiny Qwen3.5-shaped CausalLM: Gated DeltaNet linear attention beside full attention "
        "(needs transformers >= 5.9)",
        arch="qwen3_5",
    ),
    "qwen3.5-classification": Choice(
        "classification",
        "a tiny Qwen3.5-shaped classifier with 3 classes (hybrid, as qwen3.5)",
        arch="qwen3_5",
    ),
}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        choices=sorted(MODELS),
        help="which model: " + "; ".join(f"{name}: {c.text}" for name, c in sorted(MODELS.items())),
    )
    parser.add_argument(
        "directory", type=Path, help="where to write it (created; must be empty if it exists)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="weight seed")


def run(args: argparse.Namespace) -> int:
    directory: Path = args.directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        print(
            f"kafka-scorer model: error: {directory} exists and is not an empty directory; name a new one",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    from kafka_scorer.worker.logs import quiet_progress_bars

    quiet_progress_bars()  # before transformers loads: no `Writing model shards` bar into a pipe or file
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model, build_tiny_reranker

    choice = MODELS[args.name]
    kind = choice.kind
    serve = f"kafka-scorer worker --model {directory}"
    if kind == "reranker":  # text jobs get the preset's prompt and yes/no labels from the worker
        build_tiny_reranker(directory, seed=args.seed)
        serve += " --template qwen3-reranker"
    elif kind == "vl-reranker":
        from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker

        build_tiny_vl_reranker(directory, seed=args.seed)
        serve += " --template qwen3-vl-reranker"
    elif kind == "colbert":
        build_tiny_colbert(directory, seed=args.seed)
    elif kind.startswith("listwise"):
        build_listwise(directory, kind, args.seed)
    else:
        build_tiny_model(directory, choice.arch, cast("Kind", kind), num_labels=3, seed=args.seed)
    print(f"wrote {directory}: {choice.text}")
    print("serve it:  " + serve)
    print("a job:     " + json.dumps(sample_job(directory, kind)))
    return 0


def build_listwise(directory: Path, kind: str, seed: int) -> None:
    """jina-reranker-v3's layout; v3.5's adds windowed layers (a 64-token window, so a demo prompt of a
    few documents already reaches past it)."""
    from kafka_scorer.checkpoints.tiny_listwise import V35_LAYERS, build_tiny_listwise

    if kind == "listwise-v3.5":
        layers = len(V35_LAYERS)
        build_tiny_listwise(
            directory, seed=seed, num_layers=layers, layer_types=V35_LAYERS, sliding_window=64
        )
    else:
        build_tiny_listwise(directory, seed=seed)


_RED_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAFElEQVR4nGO8IyLCgA0wYRUdtBIA0OgBFI+iBHoAAAAASUVORK5CYII="
)


def sample_job(directory: Path, kind: str) -> dict[str, object]:
    """A job this model accepts; label ids are looked up in its own tokenizer, so they are in range."""
    job: dict[str, object] = {
        "id": "q1",
        "query": "Is this review positive?",
        "items": ["The food was great.", "Cold and late."],
    }
    if kind == "vl-reranker":  # a 2x2 red PNG as the second document, base64 as JSON carries it
        job["query"] = "Which one is red?"
        job["items"] = ["A blue sky.", {"content": [{"type": "image", "image": _RED_PNG}]}]
    if kind in ("reranker", "colbert", "vl-reranker") or kind.startswith("listwise"):
        job["top_n"] = 2  # labels and prompt come from the worker's template, or need none
    if kind == "causal":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
        job["label_token_ids"] = [tokenizer.encode(t, add_special_tokens=False)[0] for t in ("yes", "no")]
        job["apply_softmax"] = True
    return job
