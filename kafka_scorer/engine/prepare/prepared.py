"""What preparing a job produces, and the limits it is checked against.

`PreparedJob` is the engine's unit of work from tokenization to the forward pass: the scheduler budgets
its exact token count and the batch builder packs it. Kept apart from the preparer (inputs.py) so the
scheduler, the batch builder and the worker's seam read it without the tokenizing code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kafka_scorer.engine.prepare.chunking import ChunkPlan
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, TemplateRef


@dataclass
class PreparedJob:
    """A validated, tokenized job: the unit the scheduler budgets and the batch builder packs.

    MIS jobs keep the query and the items apart (`packed` is True); single-item jobs hold complete
    pairs in `items` with an empty `query`, so both shapes read "prefix + items" downstream.
    """

    job_id: str
    job: Job
    query: list[int]
    items: list[list[int]]
    packed: bool
    label_ids: list[int]
    num_tokens: int
    warnings: list[str] = field(default_factory=list)
    token_types: list[list[int]] | None = None
    """Token type ids of each pair, for encoders whose tokenizer gives them (BERT); None otherwise."""
    truncated_items: list[int] = field(default_factory=list)
    """Items cut to fit the pair limit (SPEC §8 `truncate`)."""
    activation: str = "none"
    """What the head's scores go through: `none`, `softmax` or `sigmoid` (SPEC §4, §8)."""
    rank_by: int = 0
    """The score column that ranks the items when the job asks for `top_n` (SPEC §8)."""
    rank_normalised: bool = False
    """Rank by the label-normalised score, `P(rank_by) / Σ P(labels)`, not the row's full-vocabulary
    probability: what a template's model card defines as the relevance (a templated CausalLM job
    without `apply_softmax`, whose rows are already normalised when it sets it)."""
    template: TemplateRef | None = None
    """The prompt template applied to the job's text (provenance)."""
    prefix_marks: tuple[int, ...] = ()
    """Lengths of the leading tokens the prefix cache may keep, longest first
    (`engine/prepare/prefix_marks.py`)."""
    chunks: ChunkPlan | None = None
    """SPEC §9: set when some item is scored as several windows; `items` then holds one entry per
    window and the plan maps their rows back to the job's items."""

    @property
    def num_items(self) -> int:
        return len(self.items)

    def piece(self, start: int, end: int, num_tokens: int) -> PreparedJob:
        """Items [start, end) as a job of their own (a forward's share of a job larger than the budget),
        with every per-item field cut alike."""
        types = None if self.token_types is None else self.token_types[start:end]
        return replace(self, items=self.items[start:end], token_types=types, num_tokens=num_tokens)

    @property
    def query_key(self) -> tuple[int, ...]:
        """Packed jobs with equal keys can share one sequence (same query, same prefix states)."""
        return tuple(self.query)


class InputError(Exception):
    def __init__(self, code: ErrorCode, message: str, item: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.item = item


@dataclass(frozen=True)
class InputLimits:
    max_items_per_job: int
    max_pair_tokens: int
    """Longest pair or packed sequence (already resolved against the model's context length)."""
    truncate: bool = False
    """What a job's `truncate: null` means (the worker's `truncate` setting)."""
    max_labels_per_job: int = 256
    chunking: Chunking | None = None
    """What a job's `chunking: null` means (the worker's `chunking` setting); None: no chunking."""
    max_chunks_per_job: int = 256
    """Most windows the chunked items of one job may produce (SPEC §9)."""

    def long_item_policy(self, job: Job) -> tuple[bool, Chunking | None]:
        """(truncate, chunking) for `job`: SPEC §8 and §9 give two answers to an item too long for a
        pair, so a job picks at most one. A job's own field wins over the worker's defaults, and a job
        that sends `truncate` (true or false) is not chunked by the worker's `chunking` default."""
        if job.chunking is not None:
            if job.truncate:
                raise InputError(
                    ErrorCode.INVALID_REQUEST,
                    "truncate: true and chunking: send one of them (truncate cuts a long item, chunking "
                    "scores all of it)",
                )
            return False, job.chunking
        if job.truncate is not None:
            return job.truncate, None
        if self.chunking is not None:
            return False, self.chunking
        return self.truncate, None
