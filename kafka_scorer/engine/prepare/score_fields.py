"""What a job asks its scores to be (SPEC §4, §8): which label tokens, which activation, which column
ranks the items, and which of its fields the served model cannot use (said in `warnings`, never
dropped silently). A mixin of `JobPreparer` (inputs.py), reading its model, limits, labels and
template.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka_scorer.engine.load.loaded_model import LoadedModel, ModelKind
from kafka_scorer.engine.prepare.documents import rank_fields_warnings
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


class ScoreFields:
    model: LoadedModel
    limits: InputLimits
    labels: LabelResolver
    template: PromptTemplate | None

    def _ignored_fields(self, job: Job) -> list[str]:
        """Fields that cannot apply to this model or worker: said in `warnings`, never dropped silently."""
        warnings = []
        if self.model.kind is ModelKind.CLASSIFICATION:
            if job.label_token_ids is not None:
                warnings.append(LABELS_IGNORED_WARNING)
            if job.label_tokens is not None:
                warnings.append(LABEL_TOKENS_IGNORED_WARNING)
        elif job.activation is not None:
            warnings.append(ACTIVATION_IGNORED_WARNING)
        warnings += rank_fields_warnings(job)
        if job.instruction is not None:
            if self.template is None:
                warnings.append(NO_TEMPLATE_WARNING)
            elif not self.template.has_instruction:
                warnings.append(INSTRUCTION_IGNORED_WARNING)
        return warnings

    def _activation(self, job: Job) -> str:
        """SPEC §8: `apply_softmax: true` means `softmax`; naming another activation beside it is a
        contradiction the caller must resolve, not one the worker guesses at."""
        if self.model.kind is ModelKind.CAUSAL_LM:
            return "softmax" if job.apply_softmax else "none"
        if job.activation is None:
            return "softmax" if job.apply_softmax else "none"
        if job.apply_softmax and job.activation != "softmax":
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"apply_softmax: true contradicts activation: {job.activation!r}; send one of them",
            )
        return job.activation

    def _rank_by(self, job: Job, label_ids: list[int]) -> int:
        """SPEC §8: label 0 for CausalLM (the preset's relevance label comes first), the last class for
        classification (a two-class reranker's "relevant" class; a one-logit model's only one)."""
        if self.model.kind is ModelKind.CAUSAL_LM:
            count, what, default = len(label_ids), "labels", 0
        else:
            count, what, default = self.model.num_classes, "classes", self.model.num_classes - 1
        rank_by = default if job.rank_by is None else job.rank_by
        if not 0 <= rank_by < count:
            raise InputError(
                ErrorCode.INVALID_REQUEST, f"rank_by: {rank_by} but the job's scores have {count} {what}"
            )
        return rank_by

    def _label_ids(self, job: Job) -> list[int]:
        if self.model.kind is not ModelKind.CAUSAL_LM:
            return []
        if job.label_token_ids is not None and job.label_tokens is not None:
            raise InputError(
                ErrorCode.INVALID_REQUEST, "label_token_ids and label_tokens: send one of them, not both"
            )
        texts = job.label_tokens
        if job.label_token_ids is None and texts is None and self.template is not None:
            texts = list(self.template.label_tokens) or None
        if texts is not None:
            if not texts:
                raise InputError(ErrorCode.INVALID_REQUEST, "label_tokens: required (non-empty) when sent")
            if len(texts) > self.limits.max_labels_per_job:
                raise InputError(
                    ErrorCode.TOO_LONG,
                    f"label_tokens: {len(texts)} labels; the limit is "
                    f"max_labels_per_job={self.limits.max_labels_per_job}",
                )
            try:
                return self.labels.resolve(texts)
            except LabelError as exc:
                raise InputError(ErrorCode.INVALID_REQUEST, str(exc)) from None
        labels = job.label_token_ids
        if not labels:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                "label_token_ids (or label_tokens): required (non-empty) for a CausalLM model",
            )
        if len(labels) > self.limits.max_labels_per_job:
            raise InputError(
                ErrorCode.TOO_LONG,
                f"label_token_ids: {len(labels)} labels; the limit is "
                f"max_labels_per_job={self.limits.max_labels_per_job}",
            )
        vocab = self.model.output_vocab_size
        bad = [label for label in labels if not 0 <= label < vocab]
        if bad:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"label_token_ids: {bad[:5]} outside the model's output vocabulary [0, {vocab})",
            )
        return list(labels)
