"""Which produced values get the Schema Registry frame, and with which id (see kafka_scorer/wire/registry.py).

Only JSON results are framed, under the subject of the topic they are actually sent to — a job's own
`reply_topic`, or the configured one when a fallback answers there. Dead-letter copies keep the
request's bytes untouched, and MessagePack results stay as they are. The id of a topic seen for the
first time is fetched on a thread (the registry client blocks); later records use the cached id.
"""

from __future__ import annotations

import asyncio

from kafka_scorer.config import Settings
from kafka_scorer.kafka.records import OutRecord
from kafka_scorer.wire.protocol import CONTENT_TYPE_JSON
from kafka_scorer.wire.registry import SchemaRegistry, frame, subject_for


class ResultFraming:
    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry

    @classmethod
    def from_settings(cls, settings: Settings) -> ResultFraming | None:
        return cls(SchemaRegistry(settings.schema_registry_url)) if settings.schema_registry_url else None

    async def value(self, record: OutRecord) -> bytes | None:
        """The bytes to produce for `record`; raises `RegistryError` when no id can be had."""
        if not record.result or record.value is None or not _is_json(record):
            return record.value
        subject = subject_for(record.topic)
        schema_id = self.registry.cached_id(subject)
        if schema_id is None:
            schema_id = await asyncio.to_thread(self.registry.schema_id, subject)
        return frame(schema_id, record.value)


def _is_json(record: OutRecord) -> bool:
    return any(
        name == "content-type" and value == CONTENT_TYPE_JSON.encode() for name, value in record.headers
    )
