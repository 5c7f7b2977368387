"""The rerank workload as a reranker's user sends it: text jobs under a prompt template (`--template`).

With `template=qwen3-reranker` a job is a query and documents as text; the worker wraps them in the
model card's prompt. That prompt's head (system message, instruction, query) is the same for every
document of a job, and is far longer than the query alone, so this is where multi-item scoring pays
most: MIS runs the head once per job, no-MIS once per document. The benchmark shows it in tokens.

The workload keeps two views of the same jobs:
- `sent`: the text jobs, what (a), (b) and (d) receive, so the worker's own template path is measured;
- `jobs`: the same jobs as token ids, the shared part as the query and each item's part as an item,
  exactly as the engine splits them. Counts (pair and packed tokens, the window), the baseline (c),
  which runs each `query + item` as one padded row, and the summaries read this view. At build time
  every pair is checked to be the whole prompt tokenized as one string (the reference rule, SPEC §4 as
  written for templates), so (c) is the independent reference it is for the token workloads.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.workloads import Workload, WorkloadSpec

# Words the tiny chat tokenizer was trained on: the texts read as words and tokenize to whole words.
WORDS = (
    "capital", "city", "river", "mountain", "ocean", "passage", "question", "answer", "document",
    "query", "relevant", "review", "food", "service", "friendly", "quick", "brown", "fox", "lazy",
    "dog", "kafka", "topic", "partition", "offset", "consumer", "producer", "broker", "record",
    "position", "south", "coast", "large", "great",
)  # fmt: skip


@dataclass(frozen=True)
class TemplateTokens:
    """Token counts of a templated workload, per job on average: what MIS and no-MIS each compute."""

    name: str
    hash: str
    shared_tokens: float
    """The template's shared part (system prompt, instruction, query): run once per job with MIS."""
    item_tokens: float
    """All of a job's per-item parts (document and the prompt's suffix) together."""
    items: float

    @property
    def mis_tokens(self) -> float:
        return self.shared_tokens + self.item_tokens

    @property
    def no_mis_tokens(self) -> float:
        return self.items * self.shared_tokens + self.item_tokens


def templated_workload(spec: WorkloadSpec, scorer, *, seed: int = 0) -> Workload:
    """`spec`'s shape in text (query and items of about `query_len` / `item_len` tokens each) for a
    `scorer` that serves a template; labels come from the template (none are sent)."""
    from kafka_scorer.engine.api import tokenize_templated

    view = scorer.describe()
    template = view.kind.served.template
    tokenizer = view.loaded.tokenizer
    if template is None or tokenizer is None:
        raise ValueError("the templated workload needs a scorer with a template and a tokenizer")
    labels = _label_ids(tokenizer, template.label_tokens)
    rng = random.Random(f"{spec.name}:template:{seed}")
    sent: list[Job] = []
    jobs: list[Job] = []
    s = spec.shape
    for index in range(spec.num_jobs):
        text = Job(
            id=f"{spec.name}-{index}",
            query=_text(tokenizer, rng, s.query_len),
            items=[_text(tokenizer, rng, s.item_len) for _ in range(s.num_items)],
            apply_softmax=spec.apply_softmax,
        )
        split = tokenize_templated(tokenizer, template, text.query, text.items, template.instruction)  # type: ignore[arg-type]  # the templated workload's tokenizer is a loaded one; typed loosely
        for item, part in zip(text.items, split.items):
            whole = tokenizer(template.render(text.query, item, template.instruction))["input_ids"]  # type: ignore[arg-type]  # as above
            if split.shared + part != list(whole):
                raise RuntimeError(f"{text.id}: the template's pieces do not tokenize as the whole prompt")
        sent.append(text)
        jobs.append(
            Job(
                id=text.id,
                query=split.shared,
                items=list(split.items),
                label_token_ids=labels,
                apply_softmax=spec.apply_softmax,
            )
        )
    return Workload(spec=spec, jobs=jobs, sent=sent)


def template_tokens(workload: Workload, name: str, digest: str) -> TemplateTokens:
    """Per-job averages of the token view: the shared part, the item parts, the item count."""
    jobs = max(1, len(workload.jobs))
    return TemplateTokens(
        name=name,
        hash=digest,
        shared_tokens=sum(len(job.query) for job in workload.jobs) / jobs,
        item_tokens=sum(len(item) for job in workload.jobs for item in job.items) / jobs,
        items=sum(len(job.items) for job in workload.jobs) / jobs,
    )


def _label_ids(tokenizer, labels: tuple[str, ...]) -> list[int]:
    """The template's labels as the worker resolves them: each text one token of the served tokenizer.
    The text jobs send no labels, so the template must name them (the presets do)."""
    if not labels:
        raise ValueError("the template names no label_tokens; the templated workload sends none either")
    ids = [tokenizer(label, add_special_tokens=False)["input_ids"] for label in labels]
    if any(len(one) != 1 for one in ids):
        raise ValueError(f"the template's labels {labels} are not one token each for this tokenizer")
    return [one[0] for one in ids]


def _text(tokenizer, rng: random.Random, tokens: int) -> str:
    """Words drawn from `WORDS`, cut to about `tokens` tokens of `tokenizer` (decoded back to text)."""
    words = " ".join(rng.choice(WORDS) for _ in range(tokens))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids).strip() or rng.choice(WORDS)
