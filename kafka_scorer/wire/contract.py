"""The wire contract as machine-readable documents: JSON Schemas of Job and Result, and an AsyncAPI 3
description of the topics and headers.

The schemas are generated from the msgspec structs in protocol.py — the same types the worker decodes
with — so they cannot describe a different message than the one the worker accepts. The files in
docs/contract/ are these documents written out; a test regenerates them and fails on any difference,
so a field added to a struct without regenerating (`python -m kafka_scorer.wire.contract docs/contract`)
is caught in CI. docs/message-schema.md is the prose for people; this is the same contract for tools
(code generators, schema registries, AsyncAPI viewers).
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from kafka_scorer.wire.content import schema_hook
from kafka_scorer.wire.protocol import CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK, Job, Result

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_ID_BASE = "https://kafka-scorer.dev/schemas"

_REQUEST_HEADERS = {
    "type": "object",
    "properties": {
        "content-type": {
            "type": "string",
            "enum": [CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK],
            "description": "Format of the value; without it the worker sniffs the first byte.",
        },
        "correlation_id": {"type": "string", "description": "Echoed on the result; the job id default."},
        "kafka_correlationId": {"type": "string", "description": "Spring's name; echoed under this name."},
        "reply_topic": {"type": "string", "description": "Topic for this job's result."},
        "kafka_replyTopic": {"type": "string", "description": "Spring's name for reply_topic."},
        "traceparent": {"type": "string", "description": "W3C Trace Context; a malformed one is ignored."},
        "tracestate": {"type": "string", "description": "W3C Trace Context vendor state, with traceparent."},
    },
}

_RESULT_HEADERS = {
    "type": "object",
    "properties": {
        "content-type": {"type": "string", "enum": [CONTENT_TYPE_JSON, CONTENT_TYPE_MSGPACK]},
        "correlation_id": {"type": "string", "description": "The request's, under the name it arrived with."},
        "traceparent": {
            "type": "string",
            "description": "The job's trace (its produce span's when the worker records spans).",
        },
        "tracestate": {"type": "string", "description": "The job's tracestate, carried on."},
    },
    "required": ["content-type"],
}

_DEAD_LETTER_HEADERS = {
    "type": "object",
    "description": "The original record's headers, plus these (Spring Kafka's names and encodings).",
    "properties": {
        "kafka_dlt-exception-message": {"type": "string"},
        "kafka_dlt-exception-code": {
            "type": "string",
            "description": "The error code, e.g. invalid_message.",
        },
        "kafka_dlt-original-topic": {"type": "string"},
        "kafka_dlt-original-partition": {"description": "4-byte big-endian integer"},
        "kafka_dlt-original-offset": {"description": "8-byte big-endian integer"},
        "kafka_dlt-original-timestamp": {"description": "8-byte big-endian integer"},
        "kafka_dlt-original-consumer-group": {"type": "string"},
    },
}


def json_schema(struct: type[msgspec.Struct], name: str) -> dict[str, Any]:
    """A standalone JSON Schema (2020-12) of one wire struct, as msgspec derives it, plus the rules a
    struct cannot state in its fields (its `json_schema_extra`, e.g. a Job's items-or-documents)."""
    schema = _clean_docs(_nulls_last(msgspec.json.schema(struct, schema_hook=schema_hook)))
    extra = getattr(struct, "json_schema_extra", None)
    if extra:
        schema["$defs"][struct.__name__].update(extra)
    return {"$schema": SCHEMA_DIALECT, "$id": f"{_ID_BASE}/{name}.schema.json", **schema}


def _nulls_last(node: Any) -> Any:
    """The same schema with each `anyOf`'s `null` alternative listed last. msgspec has listed an
    optional field's alternatives in either order (0.19: null first; 0.22: last): the order means
    nothing to a validator, but the published files must read the same whichever msgspec (from our
    floor up) wrote them, or regenerating them would churn and their test would fail at the floor."""
    if isinstance(node, list):
        return [_nulls_last(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _nulls_last(value) for key, value in node.items()}
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = sorted(out["anyOf"], key=lambda alt: alt == {"type": "null"})
    return out


def _clean_docs(node: Any) -> Any:
    """The same schema with each `title` and `description` cleaned as `inspect.cleandoc` cleans a
    docstring. msgspec copies a struct's docstring into its schema and has rendered it two ways (up to
    0.22: the body's lines keep the source's indentation; 0.23: dedented), so the published files would
    change with the installed msgspec while the contract did not; cleaned here they read the same from
    every msgspec (tests/test_contract.py compares them word by word besides)."""
    if isinstance(node, list):
        return [_clean_docs(item) for item in node]
    if not isinstance(node, dict):
        return node
    return {
        key: inspect.cleandoc(value)
        if key in ("title", "description") and isinstance(value, str)
        else _clean_docs(value)
        for key, value in node.items()
    }


def asyncapi() -> dict[str, Any]:
    """AsyncAPI 3.0: the worker receives jobs, sends results and dead letters."""
    defs = {"Job": json_schema(Job, "job"), "Result": json_schema(Result, "result")}
    messages = {
        "job": {
            "name": "Job",
            "title": "A scoring job",
            "contentType": CONTENT_TYPE_JSON,
            "headers": _REQUEST_HEADERS,
            "payload": defs["Job"],
        },
        "result": {
            "name": "Result",
            "title": "One result per job, keyed like the request",
            "contentType": CONTENT_TYPE_JSON,
            "headers": _RESULT_HEADERS,
            "payload": defs["Result"],
        },
        "deadLetter": {
            "name": "DeadLetter",
            "title": "An undecodable record, copied untouched",
            "headers": _DEAD_LETTER_HEADERS,
            "payload": {"description": "the original record's value, bytes as they arrived"},
        },
    }
    channels = {
        "requests": {
            "address": "{requestTopic}",
            "parameters": {"requestTopic": {"description": "request_topics / request_topic_pattern"}},
            "messages": {"job": {"$ref": "#/components/messages/job"}},
        },
        "results": {
            "address": "{replyTopic}",
            "parameters": {"replyTopic": {"description": "reply_topic, or the job's reply_topic header"}},
            "messages": {"result": {"$ref": "#/components/messages/result"}},
        },
        "deadLetters": {
            "address": "{deadLetterTopic}",
            "parameters": {
                "deadLetterTopic": {"description": "dead_letter_topic, default <request topic>.DLT"}
            },
            "messages": {"deadLetter": {"$ref": "#/components/messages/deadLetter"}},
        },
    }
    operations = {
        "consumeJobs": _operation(
            "receive", "requests", "job", "The worker consumes jobs (a consumer group)."
        ),
        "produceResults": _operation("send", "results", "result", "One result per job, error or scores."),
        "produceDeadLetters": _operation(
            "send", "deadLetters", "deadLetter", "Undecodable records, with why and where from."
        ),
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "kafka-scorer",
            "version": _version(),
            "description": "LLM scoring jobs in, one result per job out. Prose: docs/message-schema.md.",
        },
        "defaultContentType": CONTENT_TYPE_JSON,
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def _operation(action: str, channel: str, message: str, summary: str) -> dict[str, Any]:
    return {
        "action": action,
        "summary": summary,
        "channel": {"$ref": f"#/channels/{channel}"},
        "messages": [{"$ref": f"#/channels/{channel}/messages/{message}"}],
    }


def _version() -> str:
    """The contract's own version: it changes with the wire structs, not with every release."""
    return "1"


def documents() -> dict[str, str]:
    """File name -> text, exactly as written to docs/contract/."""

    def dump(doc: dict[str, Any]) -> str:
        return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False) + "\n"

    return {
        "job.schema.json": dump(json_schema(Job, "job")),
        "result.schema.json": dump(json_schema(Result, "result")),
        "asyncapi.json": dump(asyncapi()),
    }


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in documents().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/contract")):
        print(path)
