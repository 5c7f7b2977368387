"""The in-process client: score jobs from Python, without Kafka (`Scorer(path).score(query, items)`).

A thin client over the engine the worker drives (`engine/scoring_engine.py`, reached as `.engine`):
it builds jobs from plain arguments, batches them by the engine's token budget and runs them, on a
thread of its own for `score_async`. Everything else (the seam's steps, the warm-up, the bench's
variants, the parts tests read) is the engine's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from kafka_scorer.engine.config import EngineConfig
from kafka_scorer.engine.engine_view import EngineView
from kafka_scorer.engine.prepare.documents import items_argument
from kafka_scorer.engine.run.in_batches import score_in_batches
from kafka_scorer.engine.scoring_engine import ScoringEngine
from kafka_scorer.wire.protocol import Chunking, Job, Result


class Scorer:
    """The engine of one checkpoint, of any kind, for Python callers: `Scorer(path, **settings)` or
    `Scorer.from_config(config)`."""

    def __init__(self, model: str | EngineConfig, **settings: Any) -> None:
        """`settings` are `EngineConfig`'s fields (docs/configuration.md), when `model` is a path."""
        config = model if isinstance(model, EngineConfig) else EngineConfig(model=model, **settings)
        self.engine = ScoringEngine(config)
        """The seam the worker drives (prepare, pack, run_packed), the warm-up and the bench's variants."""
        self._executor: ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, config: EngineConfig) -> Scorer:
        """The engine as configured (the worker builds `config` from its settings)."""
        return cls(config)

    def describe(self) -> EngineView:
        """The engine's parts and counters now (`ScoringEngine.describe`)."""
        return self.engine.describe()

    def score_jobs(self, jobs: Sequence[Job]) -> list[Result]:
        """Prepare, batch by the token budget and run; results in the jobs' order."""
        engine = self.engine
        return score_in_batches(jobs, engine.prepare, engine.run_batch, engine.max_batch_tokens)

    def score(
        self,
        query: str | list[int],
        items: str | Sequence[str] | Sequence[list[int]],
        *,
        label_token_ids: list[int] | None = None,
        apply_softmax: bool = False,
        item_first: bool = False,
        return_pooled_hidden_states: bool = False,
        multi_item: bool | None = None,
        **fields: object,
    ) -> Result:
        """Score `items` against `query`. A single string as `items` is one item (SGLang accepts the
        same), not a sequence of one-character items. `fields` are the other Job fields (SPEC §8:
        `label_tokens`, `instruction`, `top_n`, `rank_by`, `activation`, `truncate`; SPEC §9: `chunking`)."""
        if isinstance(fields.get("chunking"), dict):  # the wire's object, as a caller writes it
            fields["chunking"] = msgspec.convert(fields["chunking"], Chunking)
        job = Job(
            query=query,
            items=items_argument(items),
            label_token_ids=label_token_ids,
            apply_softmax=apply_softmax,
            item_first=item_first,
            return_pooled_hidden_states=return_pooled_hidden_states,
            multi_item=multi_item,
            **fields,  # type: ignore[arg-type]  # the caller's keyword fields are Job's own, checked by msgspec at construction
        )
        return self.score_jobs([job])[0]

    def score_content(self, query: object, items: list, **fields: object) -> Result:
        """`score` for queries and items with content parts (SPEC §11), as a caller writes them: base64
        or data URIs for images (`wire/content.py`). Kinds that read no images answer `unsupported`."""
        from kafka_scorer.wire.content import dec_hook

        job = msgspec.convert({"query": query, "items": items, **fields}, Job, dec_hook=dec_hook)
        return self.score_jobs([job])[0]

    async def score_async(
        self, query: str | list[int], items: str | Sequence[str] | Sequence[list[int]], **kwargs
    ) -> Result:
        """Runs on the scorer's single device thread so the event loop keeps serving."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-scorer-device")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self.score(query, items, **kwargs))

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def open_scorer(model: str, **settings: Any) -> Scorer:
    """`Scorer(model, **settings)`, under the name callers used when each kind had a class of its own."""
    return Scorer(model, **settings)
