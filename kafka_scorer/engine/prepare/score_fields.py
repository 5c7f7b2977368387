"""What a job asks its scores to be (SPEC §4, §8): which label tokens, which activation, which column
ranks the items, and which of its fields the served model cannot use (said in `warnings`, never
dropped silently).

The answer depends on the model kind, so it is an object the kind hands its preparer: a label scorer
(a CausalLM, `LabelFields`) scores the job's label tokens, a head (a classifier, a reward model, a
cross-encoder: `ClassFields`) scores its own classes. Neither branches on the kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kafka_scorer.engine.prepare.documents import is_rerank, rank_fields_warnings
from kafka_scorer.engine.prepare.labels import LabelError, LabelResolver
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits
from kafka_scorer.wire.protocol import ErrorCode, Job

if TYPE_CHECKING:
    from kafka_scorer.engine.prepare.templates import PromptTemplate

LABELS_IGNORED_WARNING = "label_token_ids ignored: the served model is a classification model"
LABEL_TOKENS_IGNORED_WARNING = "label_tokens ignored: the served model is a classification model"
ACTIVATION_IGNORED_WARNING = (
    "activation ignored: CausalLM scores are label probabilities (apply_softmax chooses which)"
)
INSTRUCTION_IGNORED_WARNING = "instruction ignored: the served template has no {instruction}"
NO_TEMPLATE_WARNING = "instruction ignored: this worker serves no template"


class ScoreFields(Protocol):
    def ignored(self, job: Job) -> list[str]:
        """Fields that cannot apply to this model or worker: said in `warnings`, never dropped."""
        ...

    def label_ids(self, job: Job) -> list[int]: ...

    def activation(self, job: Job) -> str: ...

    def rank_by(self, job: Job, label_ids: list[int]) -> int: ...

    def normalised(self, job: Job, activation: str, labels: int, templated: bool) -> bool:
        """Whether the job's relevance is a label's share of its row (`prepare/ranking.py`)."""
        ...


@dataclass(frozen=True)
class AskedScores:
    """What a job asks its scores to be, read once (`asked_scores`) where a preparer decodes the job, so
    the steps after it are handed these values instead of the job to read them again."""

    warnings: list[str]
    label_ids: list[int]
    activation: str
    rank_by: int
    normalised: bool
    """Whether the job ranks by a label's share of its row (`ScoreFields.normalised`)."""


def asked_scores(fields: ScoreFields, job: Job, templated: bool) -> AskedScores:
    """The job's score fields, in the order that decides which error a bad job gets: its warnings, its
    labels, its activation, its `rank_by` (the last three may raise `InputError`); then whether its
    relevance is normalised, which depends on whether its text goes through the template."""
    warnings = fields.ignored(job)
    label_ids = fields.label_ids(job)
    activation = fields.activation(job)
    rank_by = fields.rank_by(job, label_ids)
    normalised = fields.normalised(job, activation, len(label_ids), templated)
    return AskedScores(warnings, label_ids, activation, rank_by, normalised)


def _common_warnings(job: Job, template: PromptTemplate | None) -> list[str]:
    warnings = rank_fields_warnings(job)
    if job.instruction is not None:
        if template is None:
            warnings.append(NO_TEMPLATE_WARNING)
        elif not template.has_instruction:
            warnings.append(INSTRUCTION_IGNORED_WARNING)
    return warnings


def _checked_rank_by(job: Job, count: int, what: str, default: int) -> int:
    rank_by = default if job.rank_by is None else job.rank_by
    if not 0 <= rank_by < count:
        raise InputError(
            ErrorCode.INVALID_REQUEST, f"rank_by: {rank_by} but the job's scores have {count} {what}"
        )
    return rank_by


@dataclass
class ClassFields:
    """A head's classes: every column is a score; label fields do not apply; the activation is the
    job's (`activation`, or `apply_softmax`); the last class ranks (a two-class reranker's "relevant"
    class, a one-logit model's only one)."""

    num_classes: int
    template: PromptTemplate | None = None

    def ignored(self, job: Job) -> list[str]:
        warnings = []
        if job.label_token_ids is not None:
            warnings.append(LABELS_IGNORED_WARNING)
        if job.label_tokens is not None:
            warnings.append(LABEL_TOKENS_IGNORED_WARNING)
        return warnings + _common_warnings(job, self.template)

    def label_ids(self, job: Job) -> list[int]:
        return []

    def activation(self, job: Job) -> str:
        """SPEC §8: `apply_softmax: true` means `softmax`; naming another activation beside it is a
        contradiction the caller must resolve, not one the worker guesses at."""
        if job.activation is None:
            return "softmax" if job.apply_softmax else "none"
        if job.apply_softmax and job.activation != "softmax":
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"apply_softmax: true contradicts activation: {job.activation!r}; send one of them",
            )
        return job.activation

    def rank_by(self, job: Job, label_ids: list[int]) -> int:
        return _checked_rank_by(job, self.num_classes, "classes", self.num_classes - 1)

    def normalised(self, job: Job, activation: str, labels: int, templated: bool) -> bool:
        return False


@dataclass
class LabelFields:
    """A label scorer's: the job's label tokens (`label_token_ids`, `label_tokens` or the template's),
    probabilities or log-probabilities as `apply_softmax` chooses, label 0 ranking (the preset's
    relevance label comes first)."""

    limits: InputLimits
    resolver: LabelResolver
    output_vocab_size: int
    template: PromptTemplate | None = None

    def ignored(self, job: Job) -> list[str]:
        warnings = [ACTIVATION_IGNORED_WARNING] if job.activation is not None else []
        return warnings + _common_warnings(job, self.template)

    def activation(self, job: Job) -> str:
        return "softmax" if job.apply_softmax else "none"

    def rank_by(self, job: Job, label_ids: list[int]) -> int:
        return _checked_rank_by(job, len(label_ids), "labels", 0)

    def normalised(self, job: Job, activation: str, labels: int, templated: bool) -> bool:
        """A templated or rerank-shaped job whose rows are full-vocabulary probabilities of several
        labels (one label's share of itself is always 1, so a lone label's probability is its
        relevance)."""
        return (templated or is_rerank(job)) and activation == "none" and labels > 1

    def label_ids(self, job: Job) -> list[int]:
        if job.label_token_ids is not None and job.label_tokens is not None:
            raise InputError(
                ErrorCode.INVALID_REQUEST, "label_token_ids and label_tokens: send one of them, not both"
            )
        texts = job.label_tokens
        if job.label_token_ids is None and texts is None and self.template is not None:
            texts = list(self.template.label_tokens) or None
        if texts is not None:
            return self._resolved(texts)
        labels = job.label_token_ids
        if not labels:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                "label_token_ids (or label_tokens): required (non-empty) for a CausalLM model",
            )
        self._check_count("label_token_ids", len(labels))
        vocab = self.output_vocab_size
        bad = [label for label in labels if not 0 <= label < vocab]
        if bad:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"label_token_ids: {bad[:5]} outside the model's output vocabulary [0, {vocab})",
            )
        return list(labels)

    def _resolved(self, texts: list[str]) -> list[int]:
        if not texts:
            raise InputError(ErrorCode.INVALID_REQUEST, "label_tokens: required (non-empty) when sent")
        self._check_count("label_tokens", len(texts))
        try:
            return self.resolver.resolve(texts)
        except LabelError as exc:
            raise InputError(ErrorCode.INVALID_REQUEST, str(exc)) from None

    def _check_count(self, name: str, count: int) -> None:
        limit = self.limits.max_labels_per_job
        if count > limit:
            raise InputError(
                ErrorCode.TOO_LONG, f"{name}: {count} labels; the limit is max_labels_per_job={limit}"
            )
