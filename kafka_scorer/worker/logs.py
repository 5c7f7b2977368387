"""Log set-up for the worker process: one line per event, as text or as JSON objects.

JSON lines carry the record's `extra` fields (a batch line has jobs, items, tokens, compute_ms), so a
log pipeline can chart them without parsing the message text.
"""

from __future__ import annotations

import json
import logging
import os
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


def quiet_progress_bars(fmt: str = "text", stream: object = None) -> None:
    """No progress bars (transformers' `Loading weights`, the hub's downloads, `Writing model shards`)
    in JSON mode or when stderr is no terminal: there they are garbage between log lines. Set before
    transformers is imported, which reads it once; an explicit `HF_HUB_DISABLE_PROGRESS_BARS` wins."""
    stream = sys.stderr if stream is None else stream
    if fmt == "json" or not getattr(stream, "isatty", lambda: False)():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def exit_without_teardown(code: int) -> None:
    """End the process now, logs flushed, skipping the interpreter's teardown: native extensions report
    leaked objects there on stderr (triton's nanobind does, dozens of lines), which would break a JSON
    log stream. Only for a command whose work is done."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
