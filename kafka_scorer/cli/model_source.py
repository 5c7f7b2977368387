"""Where `model` points, checked before anything slow: a directory, or a hub id that can be fetched.

transformers treats every `model` that is not an existing directory as a Hugging Face hub id: a
misspelt directory (`models/rerankr`) spent 25 s in huggingface_hub's retries, each warning printed
twice, before the one-line error, and `./no-such-model` came back as the hub's "Repo id must use
alphanumeric chars". What is certain without that detour is answered at once, in one line:
- a value that can only be a path (it starts with `.`, `/` or `~`, or has more than one `/`) and does
  not exist;
- a hub id that is not in the local Hugging Face cache while the hub is off (`HF_HUB_OFFLINE`) or
  cannot be reached at all (no route, no name resolution: one TCP connect with a short timeout).
Everything else goes to the loader as before, which has its own messages for a hub id that does not
resolve and for a directory that holds no checkpoint. This module imports no torch.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from kafka_scorer.errors import SettingError, setting_hint

_HUB_ID = re.compile(r"[\w.-]{1,96}(/[\w.-]{1,96})?")
_TRUE = ("1", "true", "yes", "on")
_HUB_CONNECT_TIMEOUT_S = 3.0


def check_model_source(model: str) -> None:
    """Raise `SettingError` when `model` can be neither an existing directory nor a fetchable hub id."""
    if Path(model).expanduser().exists():
        return
    fix = f"point {setting_hint('model')} at a local checkpoint directory (config.json, weights, tokenizer)"
    if model.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(model) or "--" in model or ".." in model:
        raise SettingError("model", f"model: no such directory {model!r}: {fix}")
    if _in_hub_cache(model):
        return
    offline = next((name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if _is_set(name)), None)
    if offline is not None:
        raise SettingError(
            "model",
            f"model: {model!r} is no local directory and, as a hub id, is not in the local cache while "
            f"{offline}=1 keeps the Hugging Face hub off: {fix}, or download it first",
        )
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    problem = _unreachable(endpoint)
    if problem is not None:
        raise SettingError(
            "model",
            f"model: {model!r} is no local directory, and the Hugging Face hub at {endpoint} cannot be "
            f"reached to fetch it as a hub id ({problem}): {fix}",
        )


def _is_set(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # an id the cache layout rejects is simply not cached
        return False


def _unreachable(endpoint: str) -> str | None:
    """Why the hub's host takes no TCP connection, or None when it does (or a proxy stands between)."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=_HUB_CONNECT_TIMEOUT_S):
            return None
    except OSError as exc:
        return str(exc) or type(exc).__name__
