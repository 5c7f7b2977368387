"""Tiny random-initialised checkpoints for tests, the demo and CPU benchmarks.

No model hub is reachable where this project is tested, so models are built from configs and written
with `save_pretrained`; everything downstream loads them through the same code path as a real
checkpoint. The tokenizer is a byte-level BPE trained on the spot on a small built-in corpus, so any
text tokenizes and the result is a genuine `PreparedTokenizerFast` on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from kafka_scorer.checkpoints.tiny_hybrid import HYBRID_ARCHS, hybrid_fields

Arch = Literal["qwen3", "qwen2", "llama", "gemma2", "qwen3_5", "qwen3_5_moe", "qwen3_next"]
Kind = Literal["causal", "classification"]

# transformers' config and model class names of each arch (the classifier's where it differs).
_CLASS_NAMES = {
    "qwen3": ("Qwen3", "Qwen3", "Qwen3"),
    "qwen2": ("Qwen2", "Qwen2", "Qwen2"),
    "llama": ("Llama", "Llama", "Llama"),
    "gemma2": ("Gemma2", "Gemma2", "Gemma2"),
    "qwen3_5": ("Qwen3_5Text", "Qwen3_5", "Qwen3_5Text"),
    "qwen3_5_moe": ("Qwen3_5MoeText", "Qwen3_5Moe", "Qwen3_5MoeText"),
    "qwen3_next": ("Qwen3Next", "Qwen3Next", "Qwen3Next"),
}


_CORPUS = [
    "What is the capital of California? Sacramento is the capital of California.",
    "Los Angeles and San Francisco are large cities; San Diego is in the south.",
    "Is this review positive or negative? The food was great and the service was friendly.",
    "Rank the passages by relevance to the question about rivers, mountains and oceans.",
    "yes no true false relevant irrelevant positive negative neutral maybe",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "Kafka topics, partitions, offsets, consumers, producers, brokers and transactions.",
]

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|unk|>"]


def byte_level_bpe(unk: str | None, specials: list[str], vocab_size: int, split: str | None = None):
    """An untrained byte-level BPE (any text tokenizes) and its trainer: the decoder models' tokenizer
    and RoBERTa's are both this, with their own specials. `split` is a pre-tokenizer pattern used
    instead of GPT-2's (the chat tokenizer's is Qwen's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    return tok, trainer


def build_tokenizer(directory: Path, vocab_size: int = 384):
    """Train a byte-level BPE, add a BOS post-processor, save it as a fast tokenizer in `directory`."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    tok, trainer = byte_level_bpe("<|unk|>", SPECIAL_TOKENS, vocab_size)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    bos_id = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A $B", special_tokens=[("<|bos|>", bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        unk_token="<|unk|>",
    )
    fast.save_pretrained(directory)
    return fast


CHAT_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Qwen2/Qwen3's pre-tokenizer pattern (their tokenizer.json): punctuation followed by newlines is one
# piece, so `?` and the template's next `\n` become one token, the case the template seam must handle.
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+"
)
_CHAT_CORPUS = [
    *_CORPUS,
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n",
    "<Query>: what is the capital of China?\n<Document>: The capital of China is Beijing.\n",
    "Judge whether the Document meets the requirements. Is it relevant?\nAnswer yes or no!\n",
    "Which river is longest?\n\nWhy?\nHow far?\n",
    *["yes\nno\n"] * 8,
]


def build_chat_tokenizer(directory: Path, vocab_size: int = 512, extra_specials: tuple[str, ...] = ()):
    """A Qwen-style chat tokenizer: byte-level BPE behind Qwen's pre-tokenizer pattern, the chat special
    tokens (`<|im_start|>`, `<|im_end|>`, `<think>`, `</think>`, then `extra_specials`, e.g. Qwen-VL's
    vision tokens) and no BOS, saved as a fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    specials = [*CHAT_SPECIAL_TOKENS, *extra_specials]
    tok, trainer = byte_level_bpe(None, specials, vocab_size, split=_QWEN_SPLIT)
    tok.train_from_iterator(_CHAT_CORPUS * 8, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
    )
    fast.save_pretrained(directory)
    return fast


def build_tiny_reranker(
    directory: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_positions: int = 4096,
) -> Path:
    """A random Qwen3-shaped CausalLM with a Qwen-style chat tokenizer: what `template=qwen3-reranker`
    serves in tests and in the demo (the real Qwen3-Reranker weights are not reachable here).
    `max_positions`: the context, which bounds a MIS-packed job (the published model has 40960)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_chat_tokenizer(path)
    config = tiny_config(
        "qwen3",
        "causal",
        vocab_size=len(tokenizer) + 16,
        num_labels=2,
        hidden_size=hidden_size,
        num_layers=num_layers,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        overrides={"max_position_embeddings": max_positions},
    )
    return save_random_model(config, "causal", path, seed=seed)


def decoder_config(
    arch: Arch,
    kind: Kind,
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None,
    tie_word_embeddings: bool,
    max_position_embeddings: int,
    num_labels: int,
    pad_token_id: int | None,
    bos_token_id: int | None,
    **fields: Any,
):
    """A transformers config of `arch` with the head `kind` asks for, from one set of shape names.

    The one place that maps a shape onto transformers' arguments: the tests' tiny models and the
    benchmark's real shapes (`kafka_scorer_bench/models.py`) both come from here. `head_dim=None`
    leaves it to the architecture (Qwen2 derives it); `fields` are further constructor arguments
    (rope_theta, ...).
    """
    import transformers

    config_name, causal_name, classifier_name = _CLASS_NAMES[arch]
    config_cls = getattr(transformers, config_name + "Config")
    if kind == "causal":
        architecture = causal_name + "ForCausalLM"
    else:
        architecture = classifier_name + "ForSequenceClassification"
    extra = {} if head_dim is None else {"head_dim": head_dim}
    return config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        num_labels=num_labels,
        architectures=[architecture],
        **extra,
        **fields,
    )


def tiny_config(
    arch: Arch,
    kind: Kind,
    *,
    vocab_size: int,
    num_labels: int = 2,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    pad_token_id: int | None = None,
    bos_token_id: int | None = None,
    initializer_range: float = 0.2,
    overrides: dict[str, Any] | None = None,
):
    """`overrides` sets config fields after the defaults here (soft-caps, windows, layer types...)."""
    config = decoder_config(
        arch,
        kind,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=hidden_size // num_heads if arch != "qwen2" else None,
        tie_word_embeddings=(arch == "qwen3"),
        max_position_embeddings=4096,
        num_labels=num_labels,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        # A wide init makes scores differ clearly between pairs, so a wrong mask or position shows up
        # as a large error instead of hiding under a tolerance.
        initializer_range=initializer_range,
        **hybrid_fields(arch, num_layers),
    )
    for name, value in (overrides or {}).items():
        setattr(config, name, value)
    return config


def build_tiny_model(
    directory: str | Path,
    arch: Arch = "qwen3",
    kind: Kind = "causal",
    *,
    num_labels: int = 2,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int | None = None,
    extra_vocab: int = 16,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random model and its tokenizer to `directory` and return the path.

    `num_layers` defaults to 2, and to 3 for the hybrids (GDN, full attention, GDN: a GDN layer after
    attention, whose input already depends on the packing).

    The model's vocabulary is `extra_vocab` ids larger than the tokenizer's, as in real checkpoints
    whose embedding matrix is padded: label ids up to the model's output vocabulary must be accepted.
    `overrides` is passed to `tiny_config`.
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(path)
    config = tiny_config(
        arch,
        kind,
        vocab_size=len(tokenizer) + extra_vocab,
        num_labels=num_labels,
        hidden_size=hidden_size,
        num_layers=num_layers or (3 if arch in HYBRID_ARCHS else 2),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        overrides=overrides,
    )
    return save_random_model(config, kind, path, seed=seed)


def save_random_model(
    config: Any, kind: Kind, path: Path, *, seed: int = 0, dtype: str = "float32", init_device: str = "cpu"
) -> Path:
    """Seeded random weights for `config`, written with `save_pretrained` like a downloaded checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if kind == "causal" else AutoModelForSequenceClassification
    with torch.device(init_device):
        model = auto.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(path)
    del model
    return path


EncoderArch = Literal["bert", "roberta", "xlm-roberta", "distilbert", "electra", "modernbert"]

# Special tokens in the order of real checkpoints: RoBERTa/XLM-R put <s> <pad> </s> <unk> first (pad = 1,
# so positions start at 2), BERT-style vocabularies put [PAD] first.
_ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_ENCODER_CORPUS = [
    *_CORPUS,
    "Crème brûlée, naïve café owners and the Zürich résumé: accents, CAPITALS and punctuation!",
    "Passage: the Rhine flows from the Alps to the North Sea (1,230 km); it crosses six countries.",
]


def build_encoder_tokenizer(directory: Path, arch: EncoderArch, vocab_size: int = 400):
    """A small tokenizer of the family's kind with its real pair template, trained on the spot.

    RoBERTa: byte-level BPE, `<s> A </s></s> B </s>`, no token type ids. XLM-R: Unigram (SentencePiece's
    model) with the same template. BERT, ELECTRA, DistilBERT, ModernBERT: WordPiece with `[CLS] A [SEP]
    B [SEP]`; BERT and ELECTRA return token type ids 0/1, the other two return none, like their real
    tokenizers.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if arch in ("roberta", "xlm-roberta"):
        specials = _ROBERTA_SPECIALS
        if arch == "roberta":
            tok, trainer = byte_level_bpe("<unk>", specials, vocab_size)
        else:
            tok = Tokenizer(models.Unigram())
            tok.pre_tokenizer = pre_tokenizers.Metaspace()
            tok.decoder = decoders.Metaspace()
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False
            )
        tok.train_from_iterator(_ENCODER_CORPUS * 4, trainer=trainer)
        cls_id, sep_id = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", cls_id), ("</s>", sep_id)],
        )
        names = dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>")
        names |= dict(unk_token="<unk>", mask_token="<mask>")
    else:
        specials = _BERT_SPECIALS
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=arch != "modernbert")
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=specials, show_progress=False
        )
        tok.train_from_iterator(_ENCODER_CORPUS * 4, trainer=trainer)
        cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
        names = dict(cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]")
        names |= dict(mask_token="[MASK]")
    with_types = arch in ("bert", "electra")
    input_names = (
        ["input_ids", "token_type_ids", "attention_mask"] if with_types else ["input_ids", "attention_mask"]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_input_names=input_names, **names)
    fast.save_pretrained(directory)
    return fast


def encoder_config(arch: EncoderArch, *, tokenizer, num_labels: int, overrides: dict[str, Any] | None = None):
    """A tiny `*ForSequenceClassification` config of `arch` (2-3 layers, hidden 64, wide init)."""
    import transformers

    class_names = {
        "bert": "Bert",
        "roberta": "Roberta",
        "xlm-roberta": "XLMRoberta",
        "distilbert": "DistilBert",
        "electra": "Electra",
        "modernbert": "ModernBert",
    }
    name = class_names[arch]
    config_cls = getattr(transformers, name + "Config")
    pad = tokenizer.pad_token_id
    common: dict[str, Any] = dict(vocab_size=len(tokenizer), num_labels=num_labels, pad_token_id=pad)
    if arch == "distilbert":
        fields = dict(dim=64, hidden_dim=128, n_layers=2, n_heads=4, max_position_embeddings=256)
    elif arch == "modernbert":
        fields = dict(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            max_position_embeddings=256,
            global_attn_every_n_layers=2,
            local_attention=16,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
    else:
        # RoBERTa's positions start at pad + 1, so its table is pad + 1 longer than the longest pair.
        positions = 256 + (pad + 1 if arch in ("roberta", "xlm-roberta") else 0)
        fields = dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=positions,
            type_vocab_size=2 if arch in ("bert", "electra") else 1,
        )
        if arch == "electra":
            fields["embedding_size"] = 32
    config = config_cls(
        **common, **fields, initializer_range=0.2, architectures=[name + "ForSequenceClassification"]
    )
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    return config


def build_tiny_encoder(
    directory: str | Path,
    arch: EncoderArch = "bert",
    *,
    num_labels: int = 2,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Write a tiny random encoder cross-encoder and its tokenizer to `directory`."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_encoder_tokenizer(path, arch)
    config = encoder_config(arch, tokenizer=tokenizer, num_labels=num_labels, overrides=overrides)
    return save_random_model(config, "classification", path, seed=seed)
