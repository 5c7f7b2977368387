"""Job -> the token ids of each block's prompt, with where its markers sit.

A job's documents are cut and split into blocks as the reference does (`blocks.py`), each block laid
out and tokenized as one prompt (`prompt.py`). A block is one "item" of the prepared job, so the
scheduler, which cuts a job larger than the token budget between items, never cuts inside a block;
blocks of one job may run in different forwards, as the reference runs them one by one.

`multi_item` (SPEC §2) for this kind: null reads the documents together, as the model defines; false
gives every document a prompt of its own (one passage, the query's vector from that prompt: vLLM's
form for paired queries and documents); true asks that no document see another, which this model
cannot give, so it is `unsupported`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kafka_scorer.engine.listwise.blocks import BlockPolicy, cut_into_blocks
from kafka_scorer.engine.listwise.checkpoint import ListwiseModel
from kafka_scorer.engine.listwise.prompt import block_prompt
from kafka_scorer.engine.prepare.documents import first_checks, is_rerank, item_list, rank_fields_warnings
from kafka_scorer.engine.prepare.one_column import refuse_for_one_column
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking
from kafka_scorer.wire.protocol import ErrorCode, Job, Result, TemplateRef

QUERY_CUT_WARNING = "query cut to the model's {} tokens"


@dataclass
class ListwiseJob(PreparedJob):
    """`items` holds one prompt per block; `markers` each block's document-marker positions, then its
    query marker's."""

    markers: list[list[int]] = field(default_factory=list)
    fused: bool = True
    """Whether the blocks' query vectors are fused (`fusion.py`); False: each document is scored against
    its own prompt's query (`multi_item: false`)."""

    def piece(self, start: int, end: int, num_tokens: int) -> ListwiseJob:
        return replace(
            self, items=self.items[start:end], markers=self.markers[start:end], num_tokens=num_tokens
        )

    @property
    def block_documents(self) -> list[int]:
        return [len(marks) - 1 for marks in self.markers]


class ListwisePreparer:
    """What the engine asks of a preparer (`prepare`, `template_for`, `limits`) for this kind."""

    def __init__(self, model: ListwiseModel, limits: InputLimits) -> None:
        self.model = model
        self.limits = limits
        self.policy = BlockPolicy(context=limits.max_pair_tokens)

    def template_for(self, job: Job) -> TemplateRef | None:
        return None

    def prepare(self, job: Job, job_id: str) -> ListwiseJob | Result:
        job = first_checks(job, self.model.name, self.limits)
        _check_fields(job)
        warnings = rank_fields_warnings(job)
        items = item_list(job)
        if not isinstance(job.query, str) or not all(isinstance(item, str) for item in items):
            raise InputError(
                ErrorCode.UNSUPPORTED,
                "token-id query or items: a listwise model's prompt is text, tokenized whole as the "
                "model's own code tokenizes it; send text",
            )
        if not items:
            return Result(
                id=job_id,
                scores=[],
                prompt_tokens=0,
                model=self.model.name,
                warnings=warnings,
                ranking=ranking(job, [], 0),
                results=[] if is_rerank(job) else None,
            )
        query, query_length = self._cut(job.query, self.policy.query_tokens)
        if query_length >= self.policy.query_tokens and query != job.query:
            warnings.append(QUERY_CUT_WARNING.format(self.policy.query_tokens))
        docs, lengths, truncated = [], [], []
        for index, text in enumerate(items):
            cut, length = self._cut(str(text), self.policy.document_tokens)
            docs.append(cut)
            lengths.append(length)
            if cut != text:
                truncated.append(index)
        fused = job.multi_item is None
        sizes = cut_into_blocks(self.policy, query_length, lengths) if fused else [1] * len(docs)
        prompts, markers, start = [], [], 0
        for size in sizes:
            ids = self._tokenize(
                block_prompt(query, docs[start : start + size], job.instruction), size, start
            )
            prompts.append(ids)
            markers.append(self._markers(ids, size, start))
            start += size
        return ListwiseJob(
            job_id=job_id,
            job=job,
            query=[],
            items=prompts,
            packed=False,
            label_ids=[],
            num_tokens=sum(map(len, prompts)),
            warnings=warnings,
            truncated_items=truncated,
            markers=markers,
            fused=fused,
        )

    def _cut(self, text: str, limit: int) -> tuple[str, int]:
        """The reference's cut: at `limit` tokens or more, the text becomes the decoding of its first
        `limit` tokens; returns the text and its token count (at most `limit`)."""
        tokenizer: Any = self.model.tokenizer
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= limit:
            return tokenizer.decode(ids[:limit]), limit
        return text, len(ids)

    def _tokenize(self, prompt: str, size: int, first: int) -> list[int]:
        tokenizer: Any = self.model.tokenizer
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if len(ids) > self.limits.max_pair_tokens:
            raise InputError(
                ErrorCode.TOO_LONG,
                f"documents {first}..{first + size - 1} make a prompt of {len(ids)} tokens; the limit is "
                f"{self.limits.max_pair_tokens}",
                item=first if size == 1 else None,
            )
        return ids

    def _markers(self, ids: list[int], size: int, first: int) -> list[int]:
        """Each document marker's position, then the query marker's; the layout puts exactly `size` and
        one there (the texts' own markers were removed), which is checked, not assumed."""
        model = self.model
        documents = [i for i, token in enumerate(ids) if token == model.document_marker_id]
        queries = [i for i, token in enumerate(ids) if token == model.query_marker_id]
        if len(documents) != size or len(queries) != 1 or (documents and documents[-1] > queries[0]):
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"documents {first}..{first + size - 1}: the prompt does not tokenize into one marker per "
                "document and one for the query",
            )
        return [*documents, queries[0]]


def _check_fields(job: Job) -> None:
    """Fields that mean nothing for one similarity per document are refused, not ignored."""
    refuse_for_one_column(
        job,
        "a listwise model, whose result is one similarity per document read beside the job's other documents",
        [("chunking", job.chunking is not None)],
    )
