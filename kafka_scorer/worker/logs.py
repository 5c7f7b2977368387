"""Log set-up for the worker process: one line per event, as text or as JSON objects.

JSON lines carry the record's `extra` fields (a batch line has jobs, items, tokens, compute_ms), so a
log pipeline can chart them without parsing the message text.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def one_line(text: str, limit: int = 300) -> str:
    """`text` fit for one log line: whitespace runs (newlines included) become one space, and at most
    `limit` characters are kept, so a hostile job's error message cannot flood or forge log lines."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiokafka logs every reconnect attempt at ERROR; ours already says what is being retried.
    logging.getLogger("aiokafka").setLevel(max(logging.getLevelName(level), logging.WARNING))
