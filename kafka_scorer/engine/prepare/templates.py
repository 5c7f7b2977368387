"""Prompt templates for generative rerankers: one worker setting instead of hand-built prompts.

A yes/no reranker (Qwen3-Reranker and its kind) scores well only inside the prompt it was trained
with: a system message, an instruction, the query, the document, and an assistant turn that is about
to answer. Without it the label probabilities are close to random, and the model still answers, so
the mistake is silent. A template names that prompt once, for every job.

The template is cut at the end of `{query}`: everything before the cut is the job's shared part (it
holds the instruction and the query, the same for every item), everything after it is the per-item
part (the text between query and item, the item, the suffix). The shared part is the MIS query and
each per-item part an MIS item (docs/message-schema.md, "Templates"), so packing still computes the
prompt's long common head once per job.

Placeholders are replaced by splitting the template text, never with `str.format`: a system prompt
may hold literal braces (JSON examples), and a query that contains `{item}` must stay text.
This module imports no torch: the worker's settings check reads templates too.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

PLACEHOLDERS = ("instruction", "query", "item")
_PLACEHOLDER = re.compile(r"\{(instruction|query|item)\}")


class TemplateError(ValueError):
    """The `template` setting names no preset and no readable, valid template file."""


@dataclass(frozen=True)
class PromptTemplate:
    name: str
    text: str
    instruction: str = ""
    """What `{instruction}` becomes when a job sends none."""
    label_tokens: tuple[str, ...] = ()
    """The labels a CausalLM job gets when it names none (the relevance label first)."""
    source: str = ""
    """Where the prompt comes from (a model card), for the docs and the start-up line."""

    def __post_init__(self) -> None:
        names = _PLACEHOLDER.findall(self.text)
        for required in ("query", "item"):
            if names.count(required) != 1:
                raise TemplateError(
                    f"template {self.name!r}: needs exactly one {{{required}}}, found {names.count(required)}"
                )
        if names.index("item") < names.index("query"):
            raise TemplateError(
                f"template {self.name!r}: {{item}} comes before {{query}}; a template must put the query "
                "first so that its shared part (up to the query) is computed once per job"
            )

    @property
    def digest(self) -> str:
        """A short hash of the text, so a result names the exact prompt that produced it."""
        return hashlib.sha256(self.text.encode()).hexdigest()[:12]

    @property
    def has_instruction(self) -> bool:
        return "{instruction}" in self.text

    def shared_part(self, query: str, instruction: str) -> str:
        """The text up to and including the query."""
        head, _, _ = self.text.partition("{query}")
        return _fill(head, instruction=instruction) + query

    def item_part(self, item: str, instruction: str) -> str:
        """The text after the query: what lies between query and item, the item, and the suffix."""
        _, _, tail = self.text.partition("{query}")
        before, _, after = tail.partition("{item}")
        return _fill(before, instruction=instruction) + item + _fill(after, instruction=instruction)

    def render(self, query: str, item: str, instruction: str) -> str:
        """The whole prompt of one pair, as text (what a reference implementation would build)."""
        return self.shared_part(query, instruction) + self.item_part(item, instruction)


def _fill(text: str, *, instruction: str) -> str:
    """Only `{instruction}` can remain in a part once the query and item are cut out."""
    return text.replace("{instruction}", instruction)


QWEN3_RERANKER = PromptTemplate(
    name="qwen3-reranker",
    text=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
        'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {item}<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ),
    instruction="Given a web search query, retrieve relevant passages that answer the query",
    label_tokens=("yes", "no"),
    source="the Qwen/Qwen3-Reranker-0.6B, -4B and -8B model cards (Hugging Face), usage with transformers",
)

QWEN3_VL_RERANKER = PromptTemplate(
    name="qwen3-vl-reranker",
    text=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
        'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n<Instruct>: {instruction}<Query>:{query}\n<Document>:{item}<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    instruction="Given a search query, retrieve relevant candidates that answer the query.",
    label_tokens=("yes", "no"),
    source="the Qwen/Qwen3-VL-Reranker-2B and -8B model cards and their chat template: the user turn "
    "holds every content part in order, an image as <|vision_start|><|image_pad|><|vision_end|>; no think "
    "block; the card's score, sigmoid(logit_yes - logit_no), is the label-normalised P(yes)",
)

MXBAI_RERANK_V2 = PromptTemplate(
    name="mxbai-rerank-v2",
    text=(
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nquery: {query}\ndocument: {item}\nYou are a search relevance expert who "
        "evaluates how well documents match search queries. For each query-document pair, carefully "
        "analyze the semantic relationship between them, then provide your binary relevance judgment "
        "(0 for not relevant, 1 for relevant).\nRelevance:<|im_end|>\n<|im_start|>assistant\n"
    ),
    label_tokens=("1", "0"),
    source="mixedbread-ai/mxbai-rerank (mxbai_rerank/mxbai_rerank_v2.py): Qwen's default system turn, "
    "'query: ', newline, 'document: ', newline, the task prompt, the assistant turn; the score is "
    "logit('1') - logit('0'), served by vLLM as the two-token softmax P('1') (from_2_way_softmax over "
    "'0', '1'). The optional 'instruction: ...' line before the query is not part of this preset",
)

BGE_RERANKER_V2_GEMMA = PromptTemplate(
    name="bge-reranker-v2-gemma",
    text=(
        "A: {query}\nB: {item}\nGiven a query A and a passage B, determine whether the passage contains "
        "an answer to the query by providing a prediction of either 'Yes' or 'No'."
    ),
    label_tokens=("Yes",),
    source="FlagOpen/FlagEmbedding's LLM reranker (BAAI/bge-reranker-v2-gemma): the tokenizer's BOS, "
    "'A: ' query, newline, 'B: ' passage, newline, the task prompt; the card's score is the logit of "
    "'Yes' at the last position (vLLM: classifier token 'Yes', no post-processing)",
)

PRESETS: dict[str, PromptTemplate] = {
    t.name: t for t in (QWEN3_RERANKER, QWEN3_VL_RERANKER, MXBAI_RERANK_V2, BGE_RERANKER_V2_GEMMA)
}


def load_template(setting: str) -> PromptTemplate | None:
    """The template the `template` setting names: "" (none), a preset name, or a file.

    A `.json` file holds `{"text": ..., "instruction": ..., "label_tokens": [...], "name": ...}` (only
    `text` required); any other file is the template text itself, named after the file.
    """
    if not setting:
        return None
    if setting in PRESETS:
        return PRESETS[setting]
    path = Path(setting)
    if not path.is_file():
        raise TemplateError(
            f"template={setting!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a readable file"
        )
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"template={setting!r}: cannot read the file: {exc}") from None
    if path.suffix.lower() != ".json":
        return PromptTemplate(name=path.stem, text=raw)
    return _from_json(raw, path)


def _from_json(raw: str, path: Path) -> PromptTemplate:
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TemplateError(f"template={str(path)!r}: not valid JSON: {exc}") from None
    allowed = {"name", "text", "instruction", "label_tokens", "source"}
    if not isinstance(spec, dict) or not isinstance(spec.get("text"), str) or set(spec) - allowed:
        raise TemplateError(
            f"template={str(path)!r}: expected an object with a string `text` and optionally `name`, "
            f"`instruction`, `label_tokens`, `source` (got {type(spec).__name__} {_keys(spec)})"
        )
    labels = spec.get("label_tokens", [])
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise TemplateError(f"template={str(path)!r}: `label_tokens` must be a list of strings")
    return PromptTemplate(
        name=str(spec.get("name") or path.stem),
        text=spec["text"],
        instruction=str(spec.get("instruction", "")),
        label_tokens=tuple(labels),
        source=str(spec.get("source", "")),
    )


def _keys(spec: object) -> list[str]:
    return sorted(spec) if isinstance(spec, dict) else []
