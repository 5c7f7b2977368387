"""The start-up warm-up: full batches at the served shapes before the worker says it is ready.

One packed MIS sequence as long as the pair limit allows (where the model packs) and pairs filling the
token budget, so that compiles (the fused decoder's regions on CUDA, FlexAttention) and autotunes happen
here instead of on live traffic, and a FlexAttention (or deterministic mode's span kernel) the model's
real shapes break is found here; the Triton label kernels are then tuned at every row bucket and
compiled at every label tile a forward can bring. A failure there is met by the exact fallbacks of
`warm_up_fallbacks.py` (the compiled layers run eagerly, an automatic backend becomes the portable
one), each with one line; a backend the operator chose is kept, with a warning. Then the
body's CUDA graphs are captured (`engine/graphs/`) and checked: a forward replayed from a graph must
score as the same forward run from Python, or the graphs are dropped, with one line.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec
import torch

from kafka_scorer.engine.kernels.label_scores import head_weights
from kafka_scorer.engine.load.warm_up_fallbacks import Chosen, recover, torch_label_scores
from kafka_scorer.engine.pack.batch import build_forward_batch
from kafka_scorer.engine.prepare.prepared import PreparedJob
from kafka_scorer.errors import first_line
from kafka_scorer.wire.protocol import Input, Job

if TYPE_CHECKING:
    from kafka_scorer.engine.load.start_up import StartUp

log = logging.getLogger(__name__)


def warm_up(parts: StartUp, backend: str) -> str:
    """Warms up the engine that starts on the attention `backend`; returns the backend it serves with
    (the portable one where an automatic one failed here), for the engine to keep."""
    chosen = Chosen(backend)
    failed = _failure(parts, chosen.backend)
    if failed:
        failed = recover(parts, chosen, failed, lambda: _failure(parts, chosen.backend))
    if failed:
        log.warning("warm-up batch failed (%s); serving anyway", failed)
    _one_token_forwards(parts, chosen.backend)  # on the backend and layers the warm-up settled on
    parts.forget()  # the warm-up's prefixes and documents are no traffic's
    _ready_label_kernels(parts)
    _capture_graphs(parts, chosen.backend)
    return chosen.backend


def _ready_label_kernels(parts: StartUp) -> None:
    """The Triton label kernels tuned and compiled at every row bucket and label tile a forward can
    bring (the warm-up's two batches cover two of them); if that fails, torch's chunked log-sum-exp
    scores the labels, as when the warm-up's batches fail there."""
    fallback = torch_label_scores(parts)
    if fallback is None:  # not the Triton label kernels
        return
    from kafka_scorer.engine.kernels.label_scores_triton import warm_label_kernels

    model = parts.runner.model
    started = time.perf_counter()
    try:
        weight, bias = head_weights(model.head)
        buckets, tiles = warm_label_kernels(
            weight,
            bias,
            model.final_logit_softcap,
            max_rows=parts.max_batch_tokens,
            max_labels=parts.limits.max_labels_per_job,
        )
    except Exception as exc:  # a kernel that fails here would fail a live batch: score with torch
        fallback.apply()
        log.warning(fallback.line, f"{type(exc).__name__}: {first_line(str(exc), 'no message')}")
        return
    log.info(
        "label kernels tuned for 1..%d scoring rows and 1..%d labels in %.1f s",
        buckets[-1],
        tiles[-1],
        time.perf_counter() - started,
    )


GRAPH_CHECK_TOLERANCE = {torch.float32: 1e-6}
"""Largest `1 - cosine` between a scoring row's final hidden state replayed and run from Python; 1e-2
for 16-bit dtypes (another token count may pick other matmul tiles, so the rows drift by bf16 units
over the layers: cosines stay above 0.999). A stale buffer or a wrong mask gives another vector. Hidden
states, not scores: a random checkpoint's label probabilities are ~1/vocab, where an absolute
tolerance would pass garbage."""


def _capture_graphs(parts: StartUp, backend: str) -> None:
    graphs = parts.graphs
    if graphs is None or backend != "flex":
        return
    started = time.perf_counter()
    graphs.prepare()
    if not graphs.ready:
        return
    limit = GRAPH_CHECK_TOLERANCE.get(parts.loaded.dtype, 1e-2)
    worst = max(_graph_difference(parts, job, backend) for job in _graph_check_jobs(parts))
    if worst > limit:
        log.warning(
            "CUDA graphs off: a replayed forward's hidden states differ from the same forward run from "
            "Python (1 - cosine %.3g)",
            worst,
        )
        graphs.drop()
        return
    sizes = graphs.buckets.sizes
    log.info(
        "CUDA graphs captured for %d token buckets (%d..%d) in %.1f s"
        if graphs.capture  # off CUDA the same static buffers serve, uncaptured (the CPU tests' path)
        else "graph buffers (uncaptured off CUDA) ready for %d token buckets (%d..%d) in %.1f s",
        len(sizes),
        sizes[0],
        sizes[-1],
        time.perf_counter() - started,
    )


def _graph_check_jobs(parts: StartUp) -> list[PreparedJob]:
    """A lone short job and one that fills about half the largest bucket, neither of a bucket's size."""
    largest = parts.graphs.buckets.sizes[-1] if parts.graphs else 0
    jobs = [_short_job(parts), _sized_job(parts, max(16, largest // 2 - 37))]
    jobs = [msgspec.structs.replace(job, return_pooled_hidden_states=True) for job in jobs]
    prepared = [parts.prepare(job, job.id or "") for job in jobs]
    return [p for p in prepared if isinstance(p, PreparedJob)]


def _graph_difference(parts: StartUp, job: PreparedJob, backend: str) -> float:
    """The largest `1 - cosine` between the job's scoring rows' hidden states replayed and run from
    Python (the prefix cache is not involved)."""
    hidden = []
    for pad_to in (None, parts.graphs.bucket_for if parts.graphs else None):
        batch = build_forward_batch(
            [job],
            device=parts.loaded.device,
            attention_backend=backend,
            sliding_window=parts.loaded.sliding_window,
            pad_to=pad_to,
        )
        hidden.append(parts.runner.forward(batch).hidden.float())
    if not hidden[0].numel():
        return 0.0
    cosine = torch.nn.functional.cosine_similarity(hidden[0].double(), hidden[1].double(), dim=-1)
    return float(1 - cosine.min())


def _failure(parts: StartUp, backend: str) -> str | None:
    # the full-budget batch, then a lone short job: a compiler that specialises on small token counts
    # does it here, not on the first quiet minute's traffic
    results = parts.score_jobs(warm_up_jobs(parts), backend) + parts.score_jobs([_short_job(parts)], backend)
    failures = [r.error.message for r in results if r.error is not None]
    if not failures:
        return None
    return first_line(failures[0], "no message")


def _one_token_forwards(parts: StartUp, backend: str) -> None:
    """Forwards of a single token, each alone: a compiler specialises a dimension of size 1, so the
    first one in service would compile (seconds, on the live batch). Traffic makes them: a two-token
    query's head computed alone before its hit (the prefix cache), a one-token query with an empty
    item. Their answers are not judged: a kind that refuses such jobs (token ids on a vision model)
    simply runs no forward here."""
    vocab = parts.loaded.input_vocab_size
    labels = _labels(parts)
    ids = [(5 + 19 * i) % vocab for i in range(3)]
    head = Job(id="warm-up-head", query=ids[:2], items=[ids[2:]], label_token_ids=labels)
    parts.score_jobs([head], backend)
    parts.score_jobs([Job(id="warm-up-token", query=ids[:1], items=[[]], label_token_ids=labels)], backend)


def _short_job(parts: StartUp) -> Job:
    vocab = parts.loaded.input_vocab_size
    labels = _labels(parts)
    ids = [(11 + 17 * i) % vocab for i in range(9)]
    return Job(id="warm-up-short", query=ids[:5], items=[ids[5:7], ids[7:]], label_token_ids=labels)


def _sized_job(parts: StartUp, tokens: int) -> Job:
    """A MIS job of about `tokens` tokens (within the pair limit), other ids than the warm-up's."""
    vocab = parts.loaded.input_vocab_size
    labels = _labels(parts)
    item = max(1, min(120, parts.limits.max_pair_tokens - 40))
    count = max(1, min((tokens - 24) // item, parts.limits.max_items_per_job))
    ids = [(3 + 29 * i) % vocab for i in range(24 + item * count)]
    items: list[Input] = [ids[24 + item * k : 24 + item * (k + 1)] for k in range(count)]
    return Job(id="warm-up-graphs", query=ids[:24], items=items, label_token_ids=labels)


def warm_up_jobs(parts: StartUp) -> list[Job]:
    """Token ids only (no tokenizer needed), valid for any model kind."""
    limits = parts.limits
    vocab = parts.loaded.input_vocab_size
    labels = _labels(parts)
    query_len = max(1, min(64, limits.max_pair_tokens // 4))
    packed_budget = min(parts.max_batch_tokens, limits.max_pair_tokens - 8)
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
        job("warm-up-pairs", parts.max_batch_tokens // (query_len + item_len), False),
    ]


def _labels(parts: StartUp) -> list[int] | None:
    """A warm-up job's labels: token 0 for a label scorer; none for a head, which scores its classes."""
    return [0] if parts.runner.labels else None
