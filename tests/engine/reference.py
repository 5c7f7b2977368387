"""Independent reference: plain transformers forward of one pair at a time, eager attention.

Nothing here imports kafka_scorer's engine: the pair is built from SPEC §4's rule directly, and the
scores come from the stock HF model's full logits.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch


@lru_cache(maxsize=16)
def load_reference(path: Path):
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    config = AutoConfig.from_pretrained(path)
    causal = config.architectures[0].endswith("ForCausalLM")
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    model = auto.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(path), causal


def pair_ids(tokenizer, query, item, item_first: bool = False) -> list[int]:
    if isinstance(query, list):
        return item + query if item_first else query + item
    if item_first:
        return tokenizer(item)["input_ids"] + tokenizer(query, add_special_tokens=False)["input_ids"]
    return tokenizer(query)["input_ids"] + tokenizer(item, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def reference_scores(
    path: Path, query, items, label_token_ids=None, apply_softmax=False, item_first=False
) -> list[list[float]]:
    model, tokenizer, causal = load_reference(path)
    rows = []
    for item in items:
        ids = torch.tensor([pair_ids(tokenizer, query, item, item_first)])
        out = model(input_ids=ids).logits[0]
        logits = (out[-1] if causal else out).double()
        if causal:
            if apply_softmax:
                rows.append(torch.softmax(logits[label_token_ids], -1).tolist())
            else:
                rows.append(torch.log_softmax(logits, -1)[label_token_ids].exp().tolist())
        else:
            rows.append((torch.softmax(logits, -1) if apply_softmax else logits).tolist())
    return rows


@torch.no_grad()
def reference_hidden(path: Path, query, items, item_first=False) -> torch.Tensor:
    model, tokenizer, _ = load_reference(path)
    rows = []
    for item in items:
        ids = torch.tensor([pair_ids(tokenizer, query, item, item_first)])
        rows.append(model.base_model(input_ids=ids).last_hidden_state[0, -1])
    return torch.stack(rows)
