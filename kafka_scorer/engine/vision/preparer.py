"""Job -> one prompt per (query, item) pair with its images, for a vision-language CausalLM.

Every pair is a complete prompt (`packed` is False): multi-item scoring with images is not
implemented, so `multi_item: true` is `unsupported` (the answer the text kinds give when they cannot
pack exactly) and `multi_item: null` scores pairs. The label fields, activation and ranking are the
text kinds' (`score_fields.py`), and the rerank shape's documents become items by the same code
(`documents.py`). What this kind does not do yet is refused with a typed error, never ignored:
token-id inputs (`unsupported`: send text or content parts), and cutting or chunking a pair too long
for `max_pair_tokens` (`too_long`, or `unsupported` when the job asks for `truncate`/`chunking`).

All of it runs on the preparing thread: images are decoded, checked and preprocessed here, so a bad
image is its own job's error `Result` before any batch holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch

from kafka_scorer.engine.prepare.documents import as_items, is_rerank, item_list
from kafka_scorer.engine.prepare.labels import LabelResolver
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import normalised, ranking
from kafka_scorer.engine.prepare.score_fields import ScoreFields
from kafka_scorer.engine.prepare.templates import PromptTemplate
from kafka_scorer.engine.vision.checkpoint import VisionModel
from kafka_scorer.engine.vision.images import ImageLimits
from kafka_scorer.engine.vision.prompt import ImageBook, Side, expand, render_side
from kafka_scorer.wire.content import Content
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, TemplateRef, error_result


@dataclass
class VisionJob(PreparedJob):
    """A prepared vision job: `items` holds each pair's token ids, `pixels`/`grids` its images' patches
    and grids (None for a pair without images), in the order its image tokens appear."""

    pixels: list[torch.Tensor | None] = field(default_factory=list)
    grids: list[torch.Tensor | None] = field(default_factory=list)

    def piece(self, start: int, end: int, num_tokens: int) -> VisionJob:
        cut = cast(VisionJob, super().piece(start, end, num_tokens))
        return replace(cut, pixels=self.pixels[start:end], grids=self.grids[start:end])


class VisionPreparer(ScoreFields):
    def __init__(
        self, model: VisionModel, limits: InputLimits, images: ImageLimits, template: PromptTemplate | None
    ) -> None:
        self.model: VisionModel = model
        self.limits = limits
        self.image_limits = images
        self.template = template
        self.template_ref = TemplateRef(name=template.name, hash=template.digest) if template else None
        self.labels = LabelResolver(model.tokenizer, model.output_vocab_size)
        self._tokenize: Any = cast(Any, model.tokenizer)
        self._tokenize("warm-up")  # clears stored truncation once, before threads share the tokenizer

    def template_for(self, job: Job) -> TemplateRef | None:
        return self.template_ref

    def prepare(self, job: Job, job_id: str) -> VisionJob | Result:
        """Never raises for bad input: a job that fails validation comes back as an error Result."""
        try:
            return self._prepare(job, job_id)
        except InputError as exc:
            return error_result(job_id, exc.code, str(exc), model=self.model.name, item=exc.item)

    def _prepare(self, job: Job, job_id: str) -> VisionJob | Result:
        if job.model is not None and job.model != self.model.name:
            raise InputError(
                ErrorCode.MODEL_MISMATCH,
                f"job asks for model {job.model!r}; this worker serves {self.model.name!r}",
            )
        job = as_items(job)
        self._check_fields(job)
        items = item_list(job)
        warnings = self._ignored_fields(job)
        label_ids, activation = self._label_ids(job), self._activation(job)
        rank_by = self._rank_by(job, label_ids)
        if not items:
            return Result(
                id=job_id,
                scores=[],
                model=self.model.name,
                warnings=warnings,
                ranking=ranking(job, [], rank_by),
                results=[] if is_rerank(job) else None,
            )
        book = ImageBook(self.model, self.image_limits)
        query = render_side(_text_or_content(job.query, "query"), book, "query", None)
        sides = [
            render_side(_text_or_content(value, f"item {index}"), book, f"item {index}", index)
            for index, value in enumerate(items)
        ]
        pairs = [self._pair(job, query, side, book, index) for index, side in enumerate(sides)]
        return VisionJob(
            job_id=job_id,
            job=job,
            query=[],
            items=[ids for ids, _, _ in pairs],
            packed=False,
            label_ids=label_ids,
            num_tokens=sum(len(ids) for ids, _, _ in pairs),
            warnings=warnings,
            activation=activation,
            rank_by=rank_by,
            rank_normalised=normalised(
                job, self.model.kind, activation, len(label_ids), self.template is not None
            ),
            template=self.template_ref,
            pixels=[pixels for _, pixels, _ in pairs],
            grids=[grid for _, _, grid in pairs],
        )

    def _check_fields(self, job: Job) -> None:
        if job.multi_item is True:
            raise InputError(ErrorCode.UNSUPPORTED, f"multi_item: true, but {self.model.mis_block_reason}")
        if job.item_first and self.template is not None:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"item_first: true, but the served template {self.template.name!r} puts the item after the "
                "query; send item_first: false (the template decides the order)",
            )

    def _pair(
        self, job: Job, query: Side, item: Side, book: ImageBook, index: int
    ) -> tuple[list[int], torch.Tensor | None, torch.Tensor | None]:
        first, second = (item, query) if job.item_first else (query, item)
        if self.template is not None:
            instruction = job.instruction if job.instruction is not None else self.template.instruction
            text = self.template.render(query.text, item.text, instruction)
        else:
            text = first.text + second.text
        images = [book.images[i] for i in (*first.images, *second.images)]
        ids = self._tokenize(expand(text, images, self.model.image_token))["input_ids"]
        if not ids:
            raise InputError(ErrorCode.INVALID_REQUEST, f"item {index}: the pair has no tokens", item=index)
        if len(ids) > self.limits.max_pair_tokens:
            self._too_long(job, index, len(ids))
        if not images:
            return ids, None, None
        return ids, torch.cat([i.pixels for i in images]), torch.cat([i.grid for i in images])

    def _too_long(self, job: Job, index: int, length: int) -> None:
        truncate, chunking = self.limits.long_item_policy(job)
        limit = f"the pair has {length} tokens (images included); the limit is {self.limits.max_pair_tokens}"
        if truncate or chunking is not None:
            raise InputError(
                ErrorCode.UNSUPPORTED,
                f"item {index}: {limit}, and cutting or chunking pairs with images is not implemented",
                item=index,
            )
        raise InputError(ErrorCode.TOO_LONG, f"item {index}: {limit}", item=index)


def _text_or_content(value: object, name: str) -> str | Content:
    if isinstance(value, str | Content):
        return value
    raise InputError(
        ErrorCode.UNSUPPORTED,
        f"{name}: token ids are not accepted by a vision-language model; send text or content parts",
    )
