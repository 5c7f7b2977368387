"""A tiny random ColBERT checkpoint in PyLate's layout, for tests and the late-interaction bench.

The directory is what `pylate.models.ColBERT(...).save(path)` writes, built without PyLate (it is not
a dependency): a BERT encoder at the root (`config.json` with `BertModel`, weights, a WordPiece tokenizer
holding the `[Q] ` / `[D] ` marker tokens), its Dense projection in `1_Dense/`, `modules.json` naming
both, and `config_sentence_transformers.json` with the ColBERT settings (markers, lengths, query
expansion, skiplist). The engine loads it through the same code path as a real checkpoint.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

QUERY_MARKER = "[Q] "
DOCUMENT_MARKER = "[D] "


def build_tiny_colbert(
    directory: str | Path,
    *,
    embedding_size: int = 16,
    query_length: int = 12,
    document_length: int = 40,
    do_query_expansion: bool = True,
    attend_to_expansion_tokens: bool = False,
    projection_bias: bool = False,
    arch: str = "bert",
    seed: int = 0,
) -> Path:
    """Write a tiny random ColBERT (a 2-layer BERT or RoBERTa, hidden 64, Dense 64 -> `embedding_size`)
    to `directory`."""
    import torch
    from transformers import AutoModel

    from kafka_scorer.checkpoints.tiny_models import build_encoder_tokenizer, encoder_config

    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_encoder_tokenizer(path, arch)  # type: ignore[arg-type]  # arch is an EncoderArch literal from the caller, typed str here
    tokenizer.add_tokens([QUERY_MARKER, DOCUMENT_MARKER])
    tokenizer.save_pretrained(path)
    config = encoder_config(arch, tokenizer=tokenizer, num_labels=1)  # type: ignore[arg-type]  # as above
    config.architectures = [type(config).__name__.removesuffix("Config") + "Model"]
    torch.manual_seed(seed)
    options = {"add_pooling_layer": False} if arch in ("bert", "roberta", "xlm-roberta") else {}
    model = AutoModel.from_config(config, **options).eval()
    model.save_pretrained(path)
    save_colbert_modules(
        path,
        config.hidden_size,
        embedding_size=embedding_size,
        markers=(QUERY_MARKER, DOCUMENT_MARKER),
        lengths=(query_length, document_length),
        do_query_expansion=do_query_expansion,
        attend_to_expansion_tokens=attend_to_expansion_tokens,
        projection_bias=projection_bias,
        seed=seed,
    )
    return path


def save_colbert_modules(
    path: Path,
    hidden: int,
    *,
    embedding_size: int,
    markers: tuple[str, str],
    lengths: tuple[int, int],
    do_query_expansion: bool = True,
    attend_to_expansion_tokens: bool = False,
    projection_bias: bool = False,
    seed: int = 0,
) -> None:
    """Beside an encoder saved at `path`: a seeded Dense projection (`1_Dense/`), `modules.json` and the
    ColBERT settings, as PyLate writes them."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    dense = path / "1_Dense"
    dense.mkdir(exist_ok=True)
    weights = {"linear.weight": torch.randn(embedding_size, hidden, generator=generator) * hidden**-0.5}
    if projection_bias:
        weights["linear.bias"] = torch.randn(embedding_size, generator=generator) * 0.1
    save_file(weights, str(dense / "model.safetensors"))
    _write(
        dense / "config.json",
        {
            "in_features": hidden,
            "out_features": embedding_size,
            "bias": projection_bias,
            "activation_function": "torch.nn.modules.linear.Identity",
            "use_residual": False,
        },
    )
    _write(
        path / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
        ],
    )
    query_length, document_length = lengths
    _write(
        path / "sentence_bert_config.json", {"max_seq_length": document_length - 1, "do_lower_case": False}
    )
    _write(
        path / "config_sentence_transformers.json",
        {
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "MaxSim",
            "query_prefix": markers[0],
            "document_prefix": markers[1],
            "query_length": query_length,
            "document_length": document_length,
            "attend_to_expansion_tokens": attend_to_expansion_tokens,
            "skiplist_words": list(string.punctuation),
            "do_query_expansion": do_query_expansion,
        },
    )


def _write(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2))
