"""`cached_tokens` counts what the prefix cache served, nothing else (issue 47 item 6).

docs/message-schema.md defines it as the prompt tokens "served from the worker's prefix cache instead of
run through the model". The engine computes every cacheable head alone before the forward that uses it,
so a head new to the worker is run in that batch whichever job's arrival stores it; a batch-mate that
shares it was not served it by the cache either (it is what a batch of the same jobs costs with the
cache off: every job reports its own query). Checked against the definition: a head nobody had before
the batch is never reported cached, by any job of the batch; what a job reports does not depend on its
batch-mates; and `prompt_tokens + cached_tokens` is the job's count with the cache off (a second
scorer, the cache off, scoring the same jobs).
"""

from __future__ import annotations

import random

import pytest

from kafka_scorer.wire.protocol import Job

LABELS = [3, 44, 120]


def _query(seed: int, length: int = 120) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 380) for _ in range(length)]


def _jobs(query, count: int, multi_item: bool, labels) -> list[Job]:
    return [
        Job(id=str(n), query=query, items=[[5, 6], [7]], label_token_ids=labels, multi_item=multi_item)
        for n in range(count)
    ]


@pytest.mark.parametrize("backend", ["dense", "cascade"])
@pytest.mark.parametrize("multi_item", [True, False], ids=["mis", "pairs"])
@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_a_head_new_to_the_worker_is_no_hit_for_any_job_of_its_batch(scorer_for, kind, multi_item, backend):
    cached = scorer_for("qwen3", kind, attention_backend=backend, prefix_cache_mb=4)
    plain = scorer_for("qwen3", kind, attention_backend=backend)
    labels = LABELS if kind == "causal" else None
    seed = 2 * (100 * multi_item + 10 * (backend == "dense"))  # heads no other case stored (shared scorers)
    jobs = _jobs(_query(seed), 3, multi_item, labels)
    alone = cached.score_jobs(jobs[:1])[0]  # a fresh head: computed for this job, never a hit
    first = cached.score_jobs(_jobs(_query(seed + 1), 3, multi_item, labels))  # a new head shared by 3
    again = cached.score_jobs(_jobs(_query(seed + 1), 3, multi_item, labels))  # now held by the cache
    want = plain.score_jobs(jobs)
    served_alone = alone.cached_tokens
    if multi_item:
        assert served_alone == 0  # one query, run once: nothing served
    for result in first:
        assert result.error is None
        assert (result.prompt_tokens, result.cached_tokens) == (alone.prompt_tokens, served_alone)
        assert result.prompt_tokens + result.cached_tokens == want[0].prompt_tokens
    for result in again:
        assert result.cached_tokens > served_alone
        assert result.prompt_tokens + result.cached_tokens == want[0].prompt_tokens


@pytest.mark.parametrize("kind", ["causal", "classification"])
def test_a_new_query_on_a_cached_template_is_served_the_template_only(scorer_for, tmp_path, kind):
    """The template's head is cached; a new query extends it in this batch: the extension is run for
    every job that asks for it, the template's head is served to each."""
    template = tmp_path / "judge.txt"
    template.write_text(
        "a rubric to judge by, rule after rule; " * 6 + "{instruction}\nQ: {query}\nA: {item}"
    )
    cached = scorer_for("qwen3", kind, template=str(template), prefix_cache_mb=4)
    plain = scorer_for("qwen3", kind, template=str(template))
    labels = LABELS if kind == "causal" else None

    def job(n: int, question: str) -> Job:
        return Job(id=str(n), query=question, items=["light", "no idea"], label_token_ids=labels)

    cached.score_jobs([job(0, "why is the sky blue?")])  # stores the template's head
    solo = cached.score_jobs([job(1, "how far away is the moon?")])[0]
    batch = [job(2, "is ice a kind of water?"), job(3, "is ice a kind of water?"), job(4, "what is fog?")]
    results = cached.score_jobs(batch)
    want = plain.score_jobs(batch)
    template_head = solo.cached_tokens
    assert template_head > 0
    for result, reference in zip(results, want):
        assert result.cached_tokens == template_head
        assert result.prompt_tokens + result.cached_tokens == reference.prompt_tokens
