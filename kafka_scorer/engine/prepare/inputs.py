"""Job -> token ids -> pairs or one packed MIS sequence, with every SPEC check on the way.

Everything here runs on the CPU before a job is scheduled, so a bad job becomes an error `Result`
without ever reaching the device, and the token count the scheduler budgets with is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import msgspec

from kafka_scorer.engine.prepare.chunking import ChunkPlan
from kafka_scorer.engine.prepare.documents import first_checks, is_rerank, item_list
from kafka_scorer.engine.prepare.item_windows import SEAM_MARGIN, ItemWindows
from kafka_scorer.engine.prepare.prefix_marks import PrefixMarker
from kafka_scorer.engine.prepare.prepared import InputError, InputLimits, PreparedJob
from kafka_scorer.engine.prepare.ranking import ranking
from kafka_scorer.engine.prepare.score_fields import AskedScores, ScoreFields, asked_scores
from kafka_scorer.engine.prepare.template_tokens import cut_item_text, tokenize_templated
from kafka_scorer.engine.prepare.templates import PromptTemplate
from kafka_scorer.engine.prepare.text_bounds import longest_token_chars, text_char_bound
from kafka_scorer.wire.protocol import Chunking, ErrorCode, Job, Result, TemplateRef

if TYPE_CHECKING:  # the record is read, never built here: the stage stays torch-free (tests/test_layout.py)
    from kafka_scorer.engine.models.loaded import LoadedModel

TEMPLATE_NOT_APPLIED_WARNING = "template not applied: token-id inputs are used as given"
TRUNCATE_HINT = (
    " (send `chunking: {}` to score the item in windows, or `truncate: true` to cut it; the worker's "
    "`chunking` and `truncate` settings do either for every job)"
)


@dataclass(frozen=True)
class Asked:
    """What a job asks, decoded once at the top of `prepare`: every step below is handed these values
    rather than the job, so none derives them again and the job's path reads top to bottom. Its score
    fields (SPEC §8), its items, its long-item policy (SPEC §8, §9), whether its text goes through the
    template and with which instruction; `precut` and `plan` are set once its items are tokenized."""

    scores: AskedScores
    items: list[str | list[int]]
    """The job's items (`item_list`); with `truncate`, any longer than a pair can hold already cut."""
    text: bool
    """Whether the query is text (`_check_inputs` holds every item to the query's kind)."""
    truncate: bool
    chunking: Chunking | None
    templated: bool
    instruction: str | None
    """What the template's `{instruction}` is filled with (None for an untemplated job)."""
    precut: set[int] = field(default_factory=set)
    """Items already cut as text before tokenizing (`_cut_overlong`)."""
    plan: ChunkPlan | None = None

    @property
    def texts(self) -> list[str] | None:
        """The items as texts, for a text job (None for token ids, used as given)."""
        return [str(item) for item in self.items] if self.text else None


class JobPreparer(ItemWindows):
    def __init__(
        self,
        model: LoadedModel,
        limits: InputLimits,
        template: PromptTemplate | None,
        fields: ScoreFields,
    ) -> None:
        """`fields`: what the kind's scores are (`score_fields.py`: labels or a head's classes)."""
        self.model = model
        self.limits = limits
        self.template = template
        self.fields = fields
        self.template_ref = TemplateRef(name=template.name, hash=template.digest) if template else None
        self.prefix_marker = PrefixMarker(model.tokenizer, template)
        tokenizer = model.tokenizer
        self.longest_token = longest_token_chars(tokenizer) if tokenizer is not None else 1
        if tokenizer is not None:
            # The first call clears any truncation/padding stored in tokenizer.json, which mutates the
            # Rust tokenizer; done here, once, so concurrent prepare threads only ever read it.
            tokenizer("warm-up", add_special_tokens=True)

    @property
    def max_text_chars(self) -> int:
        """The longest query or item text (in characters) that can fit the pair limit."""
        return text_char_bound(self.limits.max_pair_tokens, self.longest_token)

    def prepare(self, job: Job, job_id: str) -> PreparedJob | Result:
        """A job that needs no forward (no items) comes back as its Result; bad input raises
        `InputError`, which the engine answers as the job's error result (the same for every kind).

        What the job asks is decoded once, here, in the order that decides which error a bad job gets;
        the steps below are handed the decoded values."""
        job = first_checks(job, self.model.name, self.limits)
        templated = self._templated(job)
        scores = asked_scores(self.fields, job, templated)
        if not job.items:
            return self._no_items(job, job_id, scores)
        asked = self._asked(job, scores, templated)
        if asked.truncate:
            job, asked = self._cut_overlong(job, asked)
        if asked.templated:
            query, items, asked = self._tokenize_templated(str(job.query), asked)
        else:
            query, items = self._tokenize(job, asked)
        return self._pairs(job, job_id, query, items, asked)

    def _no_items(self, job: Job, job_id: str, scores: AskedScores) -> Result:
        """A job without items needs no forward: its result is whole already."""
        return Result(
            id=job_id,
            scores=[],
            prompt_tokens=0,
            model=self.model.name,
            warnings=scores.warnings,
            ranking=ranking(job, [], scores.rank_by),
            results=[] if is_rerank(job) else None,
        )

    def _asked(self, job: Job, scores: AskedScores, templated: bool) -> Asked:
        """The rest of what the job asks, after its score fields: its long-item policy, then whether
        its order suits the template (the checks in this order, as a bad job's error depends on it),
        its items and its instruction. A token-id job under a template is told, in its warnings, that
        the template was not applied."""
        truncate, chunking = self.limits.long_item_policy(job)
        if templated:
            self._check_item_first(job)
        text = isinstance(job.query, str)
        if self.template is not None and not templated and not text:
            scores.warnings.append(TEMPLATE_NOT_APPLIED_WARNING)
        instruction = self._instruction(job, templated)
        return Asked(scores, item_list(job), text, truncate, chunking, templated, instruction)

    def _pairs(
        self, job: Job, job_id: str, query: list[int], items: list[list[int]], asked: Asked
    ) -> PreparedJob:
        """A decoder's pairs: the query once with its items behind it (MIS) where packing is exact,
        else one `query + item` sequence per item (SPEC §5)."""
        chunking, templated, plan, scores = asked.chunking, asked.templated, asked.plan, asked.scores
        if chunking is not None and not templated:
            items, plan = self._split_decoder_items(query, items, chunking, asked.texts, job.item_first)
        items, truncated = self._fit_items(job, query, items, asked.truncate, asked.precut)
        packed = self._decide_packing(job, query, items, windows=chunking is not None)
        marks = () if job.item_first else self.prefix_marker.marks(query, asked.instruction)
        if packed:
            pair_lens = [len(query) + len(item) for item in items]
        else:
            items = [item + query for item in items] if job.item_first else [query + item for item in items]
            query = []
            pair_lens = [len(item) for item in items]
        for index, length in enumerate(pair_lens):
            if length == 0:
                raise InputError(
                    ErrorCode.INVALID_REQUEST, f"item {index}: the pair has no tokens", item=index
                )
            if length > self.limits.max_pair_tokens:
                raise InputError(
                    ErrorCode.TOO_LONG,
                    f"item {index}: the pair has {length} tokens; the limit is {self.limits.max_pair_tokens}"
                    + TRUNCATE_HINT * (not asked.truncate),
                    item=index,
                )
        num_tokens = len(query) + sum(len(item) for item in items)
        return PreparedJob(
            job_id=job_id,
            job=job,
            query=query,
            items=items,
            packed=packed,
            label_ids=scores.label_ids,
            num_tokens=num_tokens,
            warnings=scores.warnings,
            truncated_items=truncated,
            activation=scores.activation,
            rank_by=scores.rank_by,
            rank_normalised=scores.normalised,
            template=self.template_ref if templated else None,
            chunks=plan,
            prefix_marks=marks,
        )

    def _instruction(self, job: Job, templated: bool) -> str | None:
        """The instruction a templated job's head was filled with (None for an untemplated job)."""
        if not templated or self.template is None:
            return None
        return job.instruction if job.instruction is not None else self.template.instruction

    def template_for(self, job: Job) -> TemplateRef | None:
        """The template a job's text goes through: text jobs only (token ids are used as given). The
        provenance its results carry."""
        if not isinstance(job.query, str):
            return None
        return self.template_ref

    def _templated(self, job: Job) -> bool:
        """Whether the job's text goes through the served template (`template_for`)."""
        return self.template is not None and self.template_for(job) is not None

    def _check_item_first(self, job: Job) -> None:
        """A template fixes the order of query and item, so a templated job cannot ask for another."""
        if job.item_first and self.template is not None:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"item_first: true, but the served template {self.template.name!r} puts the item after the "
                "query; send item_first: false (the template decides the order)",
            )

    def _tokenize_templated(self, query: str, asked: Asked) -> tuple[list[int], list[list[int]], Asked]:
        """The template's shared part as the query and its per-item parts as the items (SPEC §8), and
        `asked` with what tokenizing decided (the items it cut, the windows' plan).

        With `truncate`, an item whose part does not fit loses text from its own end, never the
        template's: the part is cut as text and tokenized again (see `cut_item_text`).
        """
        template, instruction = self.template, asked.instruction
        assert template is not None and instruction is not None  # both set for a templated job
        # the instruction is text the tokenizer reads (twice, with the seam check): bounded like the rest
        self._check_inputs(query, asked, instruction if template.has_instruction else None)
        tokenizer = self._tokenizer()
        items = [str(item) for item in asked.items]
        tokens = tokenize_templated(tokenizer, template, query, items, instruction)
        room = self.limits.max_pair_tokens - len(tokens.shared)
        if asked.chunking is not None:
            shared, parts, plan = self._templated_windows(
                query, items, instruction, room, asked.chunking, tokens.items
            )
            return shared, parts, replace(asked, plan=plan)
        over = [i for i, ids in enumerate(tokens.items) if len(ids) > room]
        if not (asked.truncate and over):
            return tokens.shared, tokens.items, asked
        for index in over:
            items[index] = cut_item_text(tokenizer, template, items[index], instruction, room - SEAM_MARGIN)
        tokens = tokenize_templated(tokenizer, template, query, items, instruction)
        return tokens.shared, tokens.items, replace(asked, precut=asked.precut | set(over))

    def _cut_overlong(self, job: Job, asked: Asked) -> tuple[Job, Asked]:
        """With `truncate`, an item longer than any pair can hold (by its length alone) is cut to that
        bound before tokenizing instead of being rejected; the token-level cut then finishes the job.
        The job carries the cut items too: its result is of the items as scored."""
        bound = self.max_text_chars
        cut, items = set(), list(asked.items)
        for index, item in enumerate(items):
            limit = bound if isinstance(item, str) else self.limits.max_pair_tokens
            if len(item) > limit:
                items[index] = item[:limit]
                cut.add(index)
        if not cut:
            return job, asked
        return msgspec.structs.replace(job, items=items), replace(asked, items=items, precut=cut)

    def _fit_items(
        self, job: Job, query: list[int], items: list[list[int]], truncate: bool, precut: set[int]
    ) -> tuple[list[list[int]], list[int]]:
        """SPEC §8: an item whose pair is over the limit loses tokens from its end, never the query's.

        A leading text item (`item_first`) carries the tokenizer's special tokens; any it has at its end
        are kept, so only the item's own text is cut.
        """
        if not truncate:
            return items, []
        room = self.limits.max_pair_tokens - len(query)
        special = set(getattr(self.model.tokenizer, "all_special_ids", ()) or ())
        keep_tail = job.item_first and isinstance(job.query, str)
        fitted, cut = [], []
        for index, item in enumerate(items):
            if len(item) > room >= 0:
                tail = 0
                while keep_tail and tail < len(item) and item[len(item) - 1 - tail] in special:
                    tail += 1
                item = item[: max(0, room - tail)] + item[len(item) - tail :]
            if len(item) < len(items[index]) or index in precut:
                cut.append(index)
            fitted.append(item)
        return fitted, cut

    def _check_inputs(self, query: str | list[int], asked: Asked, instruction: str | None = None) -> bool:
        """One kind of input per job, and no part (nor the template's `instruction`) too long to fit;
        True for text jobs."""
        kinds = {isinstance(item, str) for item in asked.items}
        if kinds != {asked.text}:
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                "query and items must all be text or all be token-id lists, not a mix",
            )
        self._check_lengths(query, asked, instruction)
        return asked.text

    def _tokenizer(self):
        tokenizer = self.model.tokenizer
        if tokenizer is None:
            raise InputError(
                ErrorCode.UNSUPPORTED, "text inputs need a tokenizer; this model has none: send token ids"
            )
        return tokenizer

    def _tokenize(self, job: Job, asked: Asked) -> tuple[list[int], list[list[int]]]:
        """SPEC §4: the leading part gets the tokenizer's special tokens, the trailing part does not."""
        given = cast("str | list[int]", job.query)  # content parts never reach a text kind's preparer
        if not self._check_inputs(given, asked):
            # `_check_inputs` said every part is token ids
            query = list(cast("list[int]", given))
            items = [list(cast("list[int]", item)) for item in asked.items]
            self._check_token_ids(query, None)
            for index, item in enumerate(items):
                self._check_token_ids(item, index)
            return query, items
        tokenizer = self._tokenizer()
        query_leads, item_leads = self._special_tokens(job)
        query = tokenizer(given, add_special_tokens=query_leads)["input_ids"]
        items = tokenizer(list(asked.items), add_special_tokens=item_leads)["input_ids"]
        return list(query), [list(item) for item in items]

    def _special_tokens(self, job: Job) -> tuple[bool, bool]:
        """Whether the query's and the items' tokens carry the tokenizer's special tokens: the leading
        part's do (SPEC §4)."""
        return not job.item_first, job.item_first

    def _check_lengths(self, query: str | list[int], asked: Asked, instruction: str | None = None) -> None:
        """`too_long` from lengths alone, before any tokenizing or per-token work: a text longer than
        `max_text_chars`, or a token-id list longer than the pair limit, cannot fit in any pair. A
        chunked item may be up to `max_chunks_per_job` pairs long: more cannot fit in the windows a
        job may have, so the bound stays a bound on the tokenizer's work."""
        text, chunking = asked.text, asked.chunking
        limit = self.max_text_chars if text else self.limits.max_pair_tokens
        unit = "characters" if text else "token ids"
        why = (
            f"max_pair_tokens={self.limits.max_pair_tokens} × {self.longest_token} characters, "
            "the longest token of the vocabulary"
            if text
            else f"max_pair_tokens={self.limits.max_pair_tokens}"
        )
        chunks = self.limits.max_chunks_per_job if chunking is not None else 1
        item_why = f"{why} × max_chunks_per_job={chunks}" if chunking is not None else why
        named: list[tuple[str, str | list[int], int | None, int, str]] = [("query", query, None, limit, why)]
        named += [(f"item {i}", item, i, limit * chunks, item_why) for i, item in enumerate(asked.items)]
        if instruction is not None:
            named.append(("instruction", instruction, None, limit, why))
        for where, part, item, bound, because in named:
            if len(part) > bound:
                raise InputError(
                    ErrorCode.TOO_LONG,
                    f"{where}: {len(part)} {unit} cannot fit; the limit is {bound} ({because})",
                    item=item,
                )

    def _check_token_ids(self, ids: list[int], item: int | None) -> None:
        vocab = self.model.input_vocab_size
        bad = [token for token in ids if not 0 <= token < vocab]
        if bad:
            where = "query" if item is None else f"item {item}"
            raise InputError(
                ErrorCode.INVALID_REQUEST,
                f"{where}: token ids {bad[:5]} outside the model's vocabulary [0, {vocab})",
                item=item,
            )

    def _decide_packing(
        self, job: Job, query: list[int], items: list[list[int]], windows: bool = False
    ) -> bool:
        """SPEC §5: pack when it is exact; `multi_item: true` turns every "can't" into `unsupported`.

        A job with `chunking` has `items` (windows or whole items) that each fit a pair by
        construction; its packed sequence may pass the pair limit (the positions of every item restart
        after the query, and the scheduler cuts a long sequence into budget-sized pieces), so its items
        are packed (SPEC §9) whether or not one of them had to be split: one more long item must not
        turn a `too_long` into a pass.
        """
        packed_len = len(query) + sum(len(item) for item in items)
        blocker: tuple[ErrorCode, str] | None = None
        if job.item_first:
            blocker = (ErrorCode.UNSUPPORTED, "item_first jobs are never packed")
        elif self.model.mis_block_reason:
            blocker = (
                ErrorCode.UNSUPPORTED,
                f"this model cannot be packed exactly: {self.model.mis_block_reason}",
            )
        elif self.model.sliding_window is not None and packed_len > self.model.sliding_window:
            blocker = (
                ErrorCode.UNSUPPORTED,
                f"the packed sequence ({packed_len} tokens) exceeds the sliding window",
            )
        elif packed_len > self.limits.max_pair_tokens and not windows:
            blocker = (
                ErrorCode.TOO_LONG,
                f"the packed sequence ({packed_len} tokens) exceeds the limit {self.limits.max_pair_tokens}",
            )
        if job.multi_item is True:
            if blocker is not None:
                raise InputError(blocker[0], f"multi_item: true, but {blocker[1]}")
            return True
        if job.multi_item is False:
            return False
        return blocker is None and len(items) >= 2
