"""Job -> an encoder cross-encoder's pairs: one sequence per item in the tokenizer's own pair encoding
(`[CLS] query [SEP] item [SEP]` for BERT, `<s> query </s></s> item </s>` for RoBERTa), with its token
type ids where the family has them (SPEC §8).

Everything before the pairs (validation, label and ranking fields, tokenizing, chunk windows) is
`JobPreparer`'s; an encoder differs in that its parts are tokenized without special tokens (the pair
template adds them when the pair is joined), a pair is never packed (bidirectional attention would
let the query and every item see each other) and no prompt template applies.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kafka_scorer.engine.prepare.inputs import TRUNCATE_HINT, Asked, JobPreparer
from kafka_scorer.engine.prepare.prepared import InputError, PreparedJob
from kafka_scorer.wire.protocol import ErrorCode, Job, TemplateRef

if TYPE_CHECKING:  # read from the loaded record, never built here: the stage stays torch-free
    from kafka_scorer.engine.models.encoder_family import PairTemplate


class EncoderPreparer(JobPreparer):
    def template_for(self, job: Job) -> TemplateRef | None:
        return None  # the pair encoding is the checkpoint's own

    def _special_tokens(self, job: Job) -> tuple[bool, bool]:
        return False, False  # the pair template adds them when the pair is joined

    def _pairs(
        self, job: Job, job_id: str, query: list[int], items: list[list[int]], asked: Asked
    ) -> PreparedJob:
        plan = asked.plan
        if asked.chunking is not None:
            room = self.limits.max_pair_tokens - len(query) - self._pair_template().num_special
            items, plan = self._split_long_items(items, room, asked.chunking, asked.texts)
        prepared = self._encoder_pairs(job, job_id, query, items, asked)
        scores = asked.scores
        return replace(prepared, activation=scores.activation, rank_by=scores.rank_by, chunks=plan)

    def _encoder_pairs(
        self, job: Job, job_id: str, query: list[int], items: list[list[int]], asked: Asked
    ) -> PreparedJob:
        """One pair per item; an item too long for its pair is cut from its end with `truncate`."""
        if job.multi_item is True:
            raise InputError(
                ErrorCode.UNSUPPORTED,
                f"multi_item: true, but this model is an encoder: {self.model.mis_block_reason}",
            )
        template = self._pair_template()
        limit = self.limits.max_pair_tokens
        hint = TRUNCATE_HINT if not asked.truncate else " (the query alone leaves no room for the item)"
        room = limit - len(query) - template.num_special
        pairs, cut = [], []
        types: list[list[int]] = []  # one per pair when the template has token types, else none
        for index, item in enumerate(items):
            if asked.truncate and len(item) > room >= 0:
                item = item[:room]
                cut.append(index)
            elif index in asked.precut:
                cut.append(index)
            ids, pair_types = template.join(item, query) if job.item_first else template.join(query, item)
            if len(ids) > limit:
                raise InputError(
                    ErrorCode.TOO_LONG,
                    f"item {index}: the pair has {len(ids)} tokens; the limit is {limit}" + hint,
                    item=index,
                )
            pairs.append(ids)
            if pair_types is not None:
                types.append(pair_types)
        return PreparedJob(
            job_id=job_id,
            job=job,
            query=[],
            items=pairs,
            packed=False,
            label_ids=[],
            num_tokens=sum(len(pair) for pair in pairs),
            warnings=asked.scores.warnings,
            token_types=types if template.types is not None else None,
            truncated_items=cut,
        )

    def _pair_template(self) -> PairTemplate:
        template = self.model.encoder.template if self.model.encoder is not None else None
        if template is None:
            raise InputError(
                ErrorCode.UNSUPPORTED,
                "this cross-encoder was loaded without a tokenizer, so its pair encoding (special tokens) "
                "is unknown; serve a checkpoint directory that includes the tokenizer files",
            )
        return template
