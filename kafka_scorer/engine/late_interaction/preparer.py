"""Job -> the token ids of one query and of each document, encoded as the ColBERT checkpoint defines.

Query: `lead + marker + text + tail`, the text cut so the whole is at most `query_length`, then (with
query expansion) padded to exactly `query_length` with the expansion (mask) token; every position is a
query vector. Document: `lead + marker + text + tail`, cut to `document_length`; the positions of
skiplist tokens are dropped before MaxSim. Token-id inputs are the text's tokens: they get the same
special tokens and marker. Documents longer than `document_length` are cut as the checkpoint's own
encoder cuts them, and listed in `truncated_items`. A job in the rerank shape (`documents`) is mapped to
items by the same code as every other kind's (`engine/prepare/documents.py`), so its texts, errors and
warnings are theirs.

Everything is checked here, on the CPU: a bad job becomes an error `Result` without reaching the device.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field, replace
from typing import cast

from kafka_scorer.engine.late_interaction.spec import LateModel, LateSpec
from kafka_scorer.engine.late_interaction.windows import split_documents
from kafka_scorer.engine.prepare.documents import first_checks, is_rerank, item_list, rank_fields_warnings
from kafka_scorer.engine.prepare.one_column import refuse_for_one_column
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result, TemplateRef

QUERY_CUT_WARNING = "query cut to the checkpoint's query_length={} tokens"
INSTRUCTION_IGNORED_WARNING = "instruction ignored: a late-interaction model has no template"


@dataclass
class LateJob(PreparedJob):
    """A prepared late-interaction job: `query` is the encoded query, `items` the encoded documents."""

    doc_keys: list[bytes] = field(default_factory=list)
    """Each document's content hash (its token ids): the embedding cache's key."""
    doc_keep: list[list[int]] = field(default_factory=list)
    """Positions of each document's tokens that are scored (all but the skiplist's)."""
    query_visible: int = 0
    """Leading query tokens the others attend to (all, unless expansion tokens are hidden)."""

    def piece(self, start: int, end: int, num_tokens: int) -> LateJob:
        return replace(
            self,
            items=self.items[start:end],
            doc_keys=self.doc_keys[start:end],
            doc_keep=self.doc_keep[start:end],
            num_tokens=num_tokens,
        )


def content_key(ids: list[int]) -> bytes:
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


class LatePreparer:
    """What the engine asks of a preparer (`prepare`, `template_for`, `limits`) for this kind."""

    def __init__(self, model: LateModel, limits: InputLimits) -> None:
        self.model = model
        self.spec: LateSpec = model.late
        self.limits = limits

    def template_for(self, job: Job) -> TemplateRef | None:
        return None

    def prepare(self, job: Job, job_id: str) -> LateJob | Result:
        """A job that needs no forward (no items) comes back as its Result; bad input raises
        `InputError`, which the engine answers as the job's error result (the same for every kind)."""
        job = first_checks(job, self.model.name, self.limits)
        self._check_fields(job)
        warnings = rank_fields_warnings(job)
        if job.instruction is not None:
            warnings.append(INSTRUCTION_IGNORED_WARNING)
        if not job.items:
            return Result(
                id=job_id,
                scores=[],
                prompt_tokens=0,
                model=self.model.name,
                warnings=warnings,
                ranking=ranking(job, [], 0),
                results=[] if is_rerank(job) else None,
            )
        query_ids, doc_ids = self._tokenize(job)
        spec, settings = self.spec, self.spec.settings
        query, cut = self._wrap(query_ids, spec.query_marker, settings.query_length)
        if cut:
            warnings.append(QUERY_CUT_WARNING.format(settings.query_length))
        visible = len(query)
        if settings.query_expansion:
            query = query + [spec.expansion_id] * (settings.query_length - len(query))
            visible = len(query) if settings.attend_to_expansion else visible
        plan = None
        chunking = self._chunking(job)
        if chunking is not None:
            room = settings.document_length - len(spec.lead) - len(spec.document_marker) - len(spec.tail)
            offsets = self._offsets(job) if isinstance(job.query, str) else None
            doc_ids, plan = split_documents(doc_ids, offsets, chunking, room, self.limits.max_chunks_per_job)
        docs, truncated = [], []
        for index, ids in enumerate(doc_ids):
            doc, cut = self._wrap(ids, spec.document_marker, settings.document_length)
            docs.append(doc)
            if cut:
                truncated.append(index)
        skip = spec.skiplist_ids
        return LateJob(
            job_id=job_id,
            job=job,
            query=query,
            items=docs,
            packed=True,
            label_ids=[],
            num_tokens=len(query) + sum(map(len, docs)),
            warnings=warnings,
            truncated_items=truncated,
            chunks=plan,
            doc_keys=[content_key(doc) for doc in docs],
            # a skiplist that names every token of a document (its special tokens too) keeps them all
            doc_keep=[
                [i for i, t in enumerate(doc) if t not in skip] or list(range(len(doc))) for doc in docs
            ],
            query_visible=visible,
        )

    def _wrap(self, ids: list[int], marker: tuple[int, ...], length: int) -> tuple[list[int], bool]:
        spec = self.spec
        room = length - len(spec.lead) - len(marker) - len(spec.tail)
        cut = len(ids) > room
        return [*spec.lead, *marker, *ids[: max(room, 0)], *spec.tail], cut

    def _check_fields(self, job: Job) -> None:
        """Fields that mean nothing for one MaxSim score per document are refused, not ignored."""
        refuse_for_one_column(
            job, "a late-interaction (ColBERT) model, whose result is one MaxSim score per item"
        )

    def _chunking(self, job: Job) -> Chunking | None:
        """SPEC §9 as for every kind (`InputLimits.long_item_policy`); without chunking a long document
        is cut as the checkpoint defines (`truncate` changes nothing there)."""
        return self.limits.long_item_policy(job)[1]

    def _offsets(self, job: Job) -> list[list[tuple[int, int]] | None]:
        """Each text item's token offsets in the item as sent (before stripping), for `chunks` spans."""
        tokenizer = self.model.tokenizer
        assert tokenizer is not None  # the late-interaction loader refuses a checkpoint without one
        texts = [str(item) for item in item_list(job)]
        try:
            encoded = tokenizer(
                [t.strip() for t in texts], add_special_tokens=False, return_offsets_mapping=True
            )
        except (NotImplementedError, ValueError):  # a slow tokenizer gives no offsets: no spans
            return [None] * len(texts)
        out: list[list[tuple[int, int]] | None] = []
        for text, pairs in zip(texts, encoded["offset_mapping"]):
            lead = len(text) - len(text.lstrip())
            out.append([(start + lead, end + lead) for start, end in pairs])
        return out

    def _tokenize(self, job: Job) -> tuple[list[int], list[list[int]]]:
        text = isinstance(job.query, str)
        if {isinstance(item, str) for item in item_list(job)} != {text}:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                "query and items must all be text or all be token-id lists, not a mix",
            )
        if not text:
            # the kinds check above: every part is token ids
            parts: list[tuple[str, list[int], int | None]] = [
                ("query", list(cast("list[int]", job.query)), None)
            ]
            parts += [
                (f"item {i}", list(cast("list[int]", item)), i) for i, item in enumerate(item_list(job))
            ]
            vocab = self.model.input_vocab_size
            for where, ids, item in parts:
                bad = [t for t in ids if not 0 <= t < vocab]
                if bad:
                    raise InputError(
                        ErrorCode.INVALID_REQUEST,
                        f"{where}: token ids {bad[:5]} outside the model's vocabulary [0, {vocab})",
                        item=item,
                    )
            return parts[0][1], [ids for _, ids, _ in parts[1:]]
        tokenizer = self.model.tokenizer
        assert tokenizer is not None  # the late-interaction loader refuses a checkpoint without one
        # Leading and trailing whitespace is not the text's (sentence-transformers strips it too).
        query = tokenizer(str(job.query).strip(), add_special_tokens=False)["input_ids"]
        docs = tokenizer([str(item).strip() for item in item_list(job)], add_special_tokens=False)[
            "input_ids"
        ]
        return list(query), [list(doc) for doc in docs]
