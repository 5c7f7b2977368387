"""How a job's documents are cut into blocks, each read as one prompt: the published reference's policy.

jinaai/jina-reranker-v3's `modeling.py` (`rerank`) cuts every document to `DOCUMENT_TOKENS` tokens and
the query to `QUERY_TOKENS` (text cut by decoding the kept tokens), then walks the documents in order:
a running capacity starts at the context limit less twice the query's tokens (the query appears twice)
and loses each document's tokens; a block closes after the document that brings it to `BLOCK_DOCUMENTS`
documents or leaves a capacity of `DOCUMENT_TOKENS` or less, and the capacity starts again. The limit
is the reference's tokenizer's `model_max_length`; here it is the engine's pair limit (the model's
positions, or the smaller `max_pair_tokens` an operator sets), the one number the engine has for the
longest sequence it runs. vLLM does not split (one prompt for all the documents); the reference's
policy is followed because the model was evaluated with it and a job larger than its context must still
be answered.
"""

from __future__ import annotations

from dataclasses import dataclass

DOCUMENT_TOKENS = 2048
QUERY_TOKENS = 512
BLOCK_DOCUMENTS = 125
"""The reference's block size (not the model card's "up to 64 documents")."""


@dataclass(frozen=True)
class BlockPolicy:
    context: int
    document_tokens: int = DOCUMENT_TOKENS
    query_tokens: int = QUERY_TOKENS
    block_documents: int = BLOCK_DOCUMENTS


def cut_into_blocks(policy: BlockPolicy, query_length: int, lengths: list[int]) -> list[int]:
    """The number of documents in each block, in order, for documents of `lengths` tokens (already cut)."""
    full = policy.context - 2 * query_length
    sizes: list[int] = []
    count, capacity = 0, full
    for length in lengths:
        count += 1
        capacity -= length
        if count >= policy.block_documents or capacity <= policy.document_tokens:
            sizes.append(count)
            count, capacity = 0, full
    if count:
        sizes.append(count)
    return sizes
