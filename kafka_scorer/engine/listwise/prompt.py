"""One block's prompt, laid out as jina-reranker-v3's own code lays it out, as text.

Verified against the model's published `modeling.py` (`format_docs_prompts_func`, called with
`no_thinking=True`) and vLLM's copy of it (its `JinaRankingIOProcessorMixin`):
a Qwen chat prompt whose system turn says how to rank; a user turn that announces how many passages
follow and names the query, an optional `<instruct>` section, each passage numbered from 0 and closed
by the document marker, the query again closed by the query marker; then an empty assistant thinking
section. The two marker strings are removed from every text first (the reference does the same), so
only the layout places markers. The whole prompt is tokenized as one string, as the reference does:
the byte-level BPE's pieces at a seam (the space after "query:" and the query's first word) then match
it exactly, which tokenizing the parts apart would not.
"""

from __future__ import annotations

from kafka_scorer.engine.listwise.checkpoint import DOCUMENT_MARKER, QUERY_MARKER

SYSTEM = (
    "You are a search relevance expert who can determine a ranking of the passages based on how relevant "
    "they are to the query. If the query is a question, how relevant a passage is depends on how well it "
    "answers the question. If not, try to analyze the intent of the query and assess how well each passage "
    "satisfies the intent. If an instruction is provided, you should follow the instruction when "
    "determining the ranking."
)
ASSISTANT_OPENING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def without_markers(text: str) -> str:
    return text.replace(QUERY_MARKER, "").replace(DOCUMENT_MARKER, "")


def block_prompt(query: str, documents: list[str], instruction: str | None) -> str:
    """The prompt of one block: `query` and the block's `documents`, numbered from 0 within the block."""
    query = without_markers(query)
    head = f"I will provide you with {len(documents)} passages, each indicated by a numerical identifier. "
    head += f"Rank the passages based on their relevance to query: {query}\n"
    if instruction:
        head += f"<instruct>\n{without_markers(instruction)}\n</instruct>\n"
    passages = [
        f'<passage id="{number}">\n{without_markers(text)}{DOCUMENT_MARKER}\n</passage>'
        for number, text in enumerate(documents)
    ]
    user = head + "\n".join(passages) + f"\n<query>\n{query}{QUERY_MARKER}\n</query>"
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n{ASSISTANT_OPENING}"
