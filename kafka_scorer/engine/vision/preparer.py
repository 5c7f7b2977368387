"""Job -> one prompt per (query, item) pair with its images, for a vision-language CausalLM, scored
pair by pair or packed behind the shared prefix (MIS, `packing.py`, `layout.py`).

Every pair is first tokenized whole, with its images' tokens expanded; packing then decides (SPEC §5,
as for the text kinds: `multi_item: null` packs two items or more when the packed sequence fits
`max_pair_tokens`, `true` packs or fails, `false` never packs; `item_first` is never packed). The
label fields, activation and ranking are the
text kinds' (`score_fields.py`), and the rerank shape's documents become items by the same code
(`documents.py`). What this kind does not do yet is refused with a typed error, never ignored:
token-id inputs (`unsupported`: send text or content parts), and cutting or chunking a pair too long
for `max_pair_tokens` (`too_long`, or `unsupported` when the job asks for `truncate`/`chunking`).

All of it runs on the preparing thread: images are decoded, checked and preprocessed here, so a bad
image is its own job's error `Result` before any batch holds it.
"""

from __future__ import annotations

from typing import Any, cast

from kafka_scorer.engine.prepare.documents import first_checks, is_rerank, item_list
from kafka_scorer.engine.prepare.labels import LabelResolver
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits
from kafka_scorer.engine.prepare.ranking import ranking
from kafka_scorer.engine.prepare.score_fields import LabelFields, asked_scores
from kafka_scorer.engine.prepare.templates import PromptTemplate
from kafka_scorer.engine.vision.checkpoint import VisionModel
from kafka_scorer.engine.vision.images import ImageLimits
from kafka_scorer.engine.vision.layout import Pair, VisionJob, as_packed, as_pairs
from kafka_scorer.engine.vision.packing import shared_prefix
from kafka_scorer.engine.vision.prompt import ImageBook, ProcessedImage, Side, expand, render_side
from kafka_scorer.wire.content import Content
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, TemplateRef


class VisionPreparer:
    def __init__(
        self, model: VisionModel, limits: InputLimits, images: ImageLimits, template: PromptTemplate | None
    ) -> None:
        self.model: VisionModel = model
        self.limits = limits
        self.image_limits = images
        self.template = template
        self.template_ref = TemplateRef(name=template.name, hash=template.digest) if template else None
        self.fields = LabelFields(
            limits, LabelResolver(model.tokenizer, model.output_vocab_size), model.output_vocab_size, template
        )
        self._tokenize: Any = cast(Any, model.tokenizer)
        self._tokenize("warm-up")  # clears stored truncation once, before threads share the tokenizer

    def template_for(self, job: Job) -> TemplateRef | None:
        return self.template_ref

    def prepare(self, job: Job, job_id: str) -> VisionJob | Result:
        """A job that needs no forward (no items) comes back as its Result; bad input raises
        `InputError`, which the engine answers as the job's error result (the same for every kind)."""
        job = first_checks(job, self.model.name, self.limits)
        self._check_fields(job)
        items = item_list(job)
        asked = asked_scores(self.fields, job, templated=self.template is not None)
        if not items:
            return Result(
                id=job_id,
                scores=[],
                model=self.model.name,
                warnings=asked.warnings,
                ranking=ranking(job, [], asked.rank_by),
                results=[] if is_rerank(job) else None,
            )
        book = ImageBook(self.model, self.image_limits)
        query = render_side(_text_or_content(job.query, "query"), book, "query", None)
        sides = [
            render_side(_text_or_content(value, f"item {index}"), book, f"item {index}", index)
            for index, value in enumerate(items)
        ]
        pairs = [self._pair(job, query, side, book, index) for index, side in enumerate(sides)]
        query_images = [book.images[i] for i in query.images]
        if self._packs(job, pairs, query_images):
            layout = as_packed(self.model, pairs, query_images)
        else:
            layout = as_pairs(self.model, pairs)
        return VisionJob(
            job_id=job_id,
            job=job,
            label_ids=asked.label_ids,
            num_tokens=len(layout["query"]) + sum(len(ids) for ids in layout["items"]),
            warnings=asked.warnings,
            activation=asked.activation,
            rank_by=asked.rank_by,
            rank_normalised=asked.normalised,
            template=self.template_ref,
            **layout,
        )

    def _packs(self, job: Job, pairs: list[Pair], query_images: list[ProcessedImage]) -> bool:
        """SPEC §5 as the text kinds apply it: pack when it is exact and fits; `multi_item: true` turns
        every "can't" into an error, `false` never packs, `null` packs two items or more."""
        if job.multi_item is False:
            return False
        blocker: tuple[ErrorCode, str] | None = None
        query_tokens = sum(image.tokens for image in query_images)
        cut = shared_prefix([ids for ids, _ in pairs], self.model.image_token_id, query_tokens)
        packed = cut + sum(len(ids) - cut for ids, _ in pairs)
        if job.item_first:
            blocker = (ErrorCode.UNSUPPORTED, "item_first jobs are never packed")
        elif packed > self.limits.max_pair_tokens:
            limit = self.limits.max_pair_tokens
            blocker = (ErrorCode.TOO_LONG, f"the packed sequence ({packed} tokens) exceeds the limit {limit}")
        if job.multi_item is True:
            if blocker is not None:
                raise InputError(blocker[0], f"multi_item: true, but {blocker[1]}")
            return True
        return blocker is None and len(pairs) >= 2

    def _check_fields(self, job: Job) -> None:
        if job.item_first and self.template is not None:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"item_first: true, but the served template {self.template.name!r} puts the item after the "
                "query; send item_first: false (the template decides the order)",
            )

    def _pair(self, job: Job, query: Side, item: Side, book: ImageBook, index: int) -> Pair:
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
        return ids, images

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
