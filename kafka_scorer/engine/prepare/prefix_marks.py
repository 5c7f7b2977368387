"""Where a job's leading tokens may be cut for the prefix cache: the prompt heads worth keeping.

Two boundaries are offered per job (the prefix cache keeps whichever comes back,
`engine/pack/prefix_cache.py`):
- the template's head, the text before `{query}` with the job's instruction filled in: the same for
  every job of a worker that sends the same instruction (a judge's rubric, a reranker's system prompt);
- the whole query (the template's shared part): the part every item of the job sees, the same for
  every job that asks about the same query again (more items, a next page).

A mark is a token count of the job's own leading tokens, so a cut is always exact: the head is
tokenized alone once per instruction and the mark is where it agrees with the job's tokens (a
byte-level tokenizer may merge the head's last characters with the query's first). A mark always
leaves the query's last token to run, since a sequence is scored at a token of its own.
"""

from __future__ import annotations

from kafka_scorer.engine.prepare.template_tokens import common_prefix
from kafka_scorer.engine.prepare.templates import PromptTemplate


class PrefixMarker:
    def __init__(self, tokenizer: object | None, template: PromptTemplate | None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self._heads: dict[str, list[int]] = {}
        """Token ids of the template's head per instruction; a worker sees few instructions."""

    def marks(self, query: list[int], templated_instruction: str | None) -> tuple[int, ...]:
        """Cacheable lengths of the job's leading tokens (`query`, which every pair or the packed
        sequence starts with), longest first; `templated_instruction` is None for untemplated jobs."""
        if not query:
            return ()
        # The same cut for every job with this query, packed or not, whatever its items: a job's last
        # query token stays uncached, since an empty item (or a pair of one) is scored there.
        room = len(query) - 1
        marks = {len(query)}
        if templated_instruction is not None:
            # The head's last token may merge with the query's first characters (`Q: ` + `is` reads
            # `Q:` + ` is`), so the cut stops before it: the same cut for every query.
            head = self._head(templated_instruction)
            marks.add(min(common_prefix(query, head), len(head) - 1))
        return tuple(sorted({min(m, room) for m in marks} - {0}, reverse=True))

    def _head(self, instruction: str) -> list[int]:
        head = self._heads.get(instruction)
        if head is None:
            assert self.template is not None and self.tokenizer is not None
            text = self.template.shared_part("", instruction)
            head = list(self.tokenizer(text, add_special_tokens=True)["input_ids"])  # type: ignore[operator]  # transformers types a loaded tokenizer loosely; it is callable
            if len(self._heads) < 64:  # bounded: instructions come from jobs
                self._heads[instruction] = head
        return head
