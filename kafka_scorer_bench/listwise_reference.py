"""The independent reference for the listwise kind (jina-reranker-v3's `JinaForRanking`).

Written from the model's published code, not from the engine's: the prompt string, transformers' plain
`Qwen3Model` run on one prompt at a time (no padding, no batch-mates; it honours the config's
`layer_types`, so v3.5's sliding-window layers run as transformers defines them), the projector on the
marker states, the cosine, and the block policy and fusion of its `rerank` (blocks of at most 125
documents or until the context less twice the query has room for no more than one 2048-token
document; one query vector averaged over blocks, weighted by each block's best (1 + cosine) / 2, in
float64). Used by tests/engine/test_listwise*.py, the worker test and the `listwise` bench workload
(`listwise.py`, where it is the transformers contender): it lives in the bench, beside the engine rather
than in it, so both can read it and neither the engine nor its tests' reference depends on the other.
"""

from __future__ import annotations

import numpy as np
import torch

TOLERANCE = 1e-5
DOC, QUERY = "<|embed_token|>", "<|rerank_token|>"


def reference_prompt(query: str, docs: list[str], instruction: str | None = None) -> str:
    def clean(text: str) -> str:
        return text.replace(DOC, "").replace(QUERY, "")

    system = (
        "You are a search relevance expert who can determine a ranking of the passages based on how relevant"
        " they are to the query. If the query is a question, how relevant a passage is depends on how well"
        " it answers the question. If not, try to analyze the intent of the query and assess how well each"
        " passage satisfies the intent. If an instruction is provided, you should follow the instruction"
        " when determining the ranking."
    )
    query = clean(query)
    text = "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n"
    text += f"I will provide you with {len(docs)} passages, each indicated by a numerical identifier. "
    text += f"Rank the passages based on their relevance to query: {query}\n"
    if instruction:
        text += "<instruct>\n" + clean(instruction) + "\n</instruct>\n"
    passages = [
        '<passage id="' + str(i) + '">\n' + clean(d) + DOC + "\n</passage>" for i, d in enumerate(docs)
    ]
    text += "\n".join(passages)
    text += "\n<query>\n" + query + QUERY + "\n</query>"
    return text + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


class Reference:
    """One prompt at a time through transformers' Qwen3Model, then the projector and the cosine."""

    def __init__(self, path) -> None:
        from safetensors import safe_open
        from transformers import AutoTokenizer, Qwen3Model

        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = Qwen3Model.from_pretrained(path, dtype=torch.float32).eval()
        with safe_open(str(path / "model.safetensors"), framework="pt") as handle:
            self.w1 = handle.get_tensor("projector.0.weight")
            self.w2 = handle.get_tensor("projector.2.weight")
        self.tokens_read = 0
        """Prompt tokens run so far (the bench's tokens/s)."""
        self.doc_id = self.tokenizer.convert_tokens_to_ids(DOC)
        self.query_id = self.tokenizer.convert_tokens_to_ids(QUERY)

    @torch.no_grad()
    def block(self, query: str, docs: list[str], instruction: str | None = None):
        ids = self.tokenizer(reference_prompt(query, docs, instruction), return_tensors="pt")["input_ids"]
        self.tokens_read += ids.shape[1]
        hidden = self.model(input_ids=ids).last_hidden_state[0]
        projected = torch.relu(hidden @ self.w1.T) @ self.w2.T
        d = projected[ids[0] == self.doc_id].numpy().astype(np.float64)
        q = projected[ids[0] == self.query_id].numpy().astype(np.float64)
        assert len(d) == len(docs) and len(q) == 1
        return d, q[0]

    def scores(self, query: str, docs: list[str], context: int = 131072, instruction=None) -> list[float]:
        """The published `rerank`: cut texts, blocks, fused query vector, cosine."""
        query, q_len = self.cut(query, 512)
        cut = [self.cut(doc, 2048) for doc in docs]
        blocks, current, room = [], [], context - 2 * q_len
        for text, length in cut:
            current.append(text)
            room -= length
            if len(current) >= 125 or room <= 2048:
                blocks.append(current)
                current, room = [], context - 2 * q_len
        if current:
            blocks.append(current)
        doc_vectors, query_vectors, weights = [], [], []
        for block in blocks:
            d, q = self.block(query, block, instruction)
            doc_vectors.extend(d)
            query_vectors.append(q)
            weights.append(((1 + cosine(np.array(d), q)) / 2).max())
        q = np.average(np.array(query_vectors), axis=0, weights=weights)
        return cosine(np.array(doc_vectors), q).tolist()

    def cut(self, text: str, limit: int) -> tuple[str, int]:
        ids = self.tokenizer(text)["input_ids"]
        if len(ids) >= limit:
            return str(self.tokenizer.decode(ids[:limit])), limit
        return text, len(ids)


def cosine(d: np.ndarray, q: np.ndarray) -> np.ndarray:
    return d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
