"""`model_revision`: which checkpoint produced a score, as a hash of the files that decide it.

A model name says little: a directory can be overwritten with a fine-tuned copy, and two workers can
serve different snapshots under one name. Consumers that store scores, compare runs or replay jobs
need to tell them apart, so every result carries this hash (docs/message-schema.md, provenance).
It covers the config, the weights and the tokenizer files, the things that change a score, and
nothing else (a README edit keeps the revision). Hashing reads every weight byte once at start-up
(about a second per GB on a laptop, logged); an operator who already knows the revision (a hub
commit) sets `model_revision` and skips it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

_SCORE_FILES = (
    "config.json",
    "*.safetensors",
    "*.bin",
    "*.pt",
    "*.pth",
    "tokenizer*",
    "vocab*",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "*.model",
    "*.tiktoken",
    "preprocessor_config.json",  # an image processor's pixel range and normalisation decide scores too
)


def checkpoint_revision(model_path: str) -> str:
    """`sha256:<16 hex>` over the score-deciding files of a local checkpoint directory, in name order;
    "" for a hub id (its commit is the revision: set `model_revision`)."""
    root = Path(model_path)
    if not root.is_dir():
        return ""
    started = time.monotonic()
    files = sorted({p for pattern in _SCORE_FILES for p in root.glob(pattern) if p.is_file()})
    outer = hashlib.sha256()
    size = 0
    for path in files:
        outer.update(f"{path.name}\0{_file_sha256(path)}\n".encode())
        size += path.stat().st_size
    revision = f"sha256:{outer.hexdigest()[:16]}"
    log.info(
        "model revision %s: %d files, %.1f MB hashed in %.1f s",
        revision,
        len(files),
        size / 1e6,
        time.monotonic() - started,
    )
    return revision


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()
