"""The start-up warm-up: full batches at the served shapes before the worker says it is ready.

One packed MIS sequence as long as the pair limit allows (where the model packs) and pairs filling the
token budget, so that compiles (the fused decoder's regions on CUDA, FlexAttention) and autotunes happen
here instead of on live traffic, and a FlexAttention the model's real shapes break is found here. When
the backend was chosen automatically, that falls back to cascade with one line; a backend the operator
chose is kept, with a warning.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kafka_scorer.engine.model import ModelKind
from kafka_scorer.wire.protocol import Job

if TYPE_CHECKING:
    from kafka_scorer.engine.scorer import Scorer

log = logging.getLogger(__name__)


def warm_up(scorer: Scorer) -> None:
    failed = _failure(scorer)
    if failed and scorer.auto_backend and scorer.attention_backend == "flex":
        log.warning("FlexAttention failed at the model's shapes (%s); using the cascade backend", failed)
        scorer.attention_backend = "cascade"
        failed = _failure(scorer)
    if failed:
        log.warning("warm-up batch failed (%s); serving anyway", failed)
    scorer.forget_prefixes()  # the warm-up's prefixes are no traffic's


def _failure(scorer: Scorer) -> str | None:
    # the full-budget batch, then a lone short job: a compiler that specialises on small token counts
    # does it here, not on the first quiet minute's traffic
    results = scorer.score_jobs(warm_up_jobs(scorer)) + scorer.score_jobs([_short_job(scorer)])
    return next((r.error.message for r in results if r.error is not None), None)


def _short_job(scorer: Scorer) -> Job:
    vocab = scorer.loaded.input_vocab_size
    labels = [0] if scorer.kind is ModelKind.CAUSAL_LM else None
    ids = [(11 + 17 * i) % vocab for i in range(9)]
    return Job(id="warm-up-short", query=ids[:5], items=[ids[5:7], ids[7:]], label_token_ids=labels)


def warm_up_jobs(scorer: Scorer) -> list[Job]:
    """Token ids only (no tokenizer needed), valid for any model kind."""
    limits = scorer.limits
    vocab = scorer.loaded.input_vocab_size
    labels = [0] if scorer.kind is ModelKind.CAUSAL_LM else None
    query_len = max(1, min(64, limits.max_pair_tokens // 4))
    packed_budget = min(scorer.max_batch_tokens, limits.max_pair_tokens - 8)
    item_len = max(1, min(256, (packed_budget - query_len) // 4, limits.max_pair_tokens - query_len - 8))
    ids = [(7 + 13 * i) % vocab for i in range(query_len + item_len)]

    def job(job_id: str, count: int, multi_item: bool | None) -> Job:
        count = max(1, min(count, limits.max_items_per_job))
        query, item = ids[:query_len], ids[query_len:]
        return Job(
            id=job_id, query=query, items=[item] * count, label_token_ids=labels, multi_item=multi_item
        )

    return [
        job("warm-up-packed", (packed_budget - query_len) // item_len, None),
        job("warm-up-pairs", scorer.max_batch_tokens // (query_len + item_len), False),
    ]
