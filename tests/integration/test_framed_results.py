"""Results in Confluent Schema Registry framing (issue 11, item 5) through the embedded broker.

The registry is tests/registry/fake_registry.py, which follows Confluent's documented REST API (no
registry server can be installed from the package index here). The worker must frame JSON results
with the id the registry gave for `<topic>-value` of the topic each result goes to, and leave
MessagePack results and dead-letter copies as they are.
"""

from __future__ import annotations

import struct
from pathlib import Path

from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.wire.protocol import CONTENT_TYPE_MSGPACK, Job, decode_result, encode_job, unframe
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import InProcessWorker, Out, fresh_topics, produce, read_topic, unique
from tests.registry.fake_registry import FakeRegistry

_JSON = [("content-type", b"application/json")]


async def test_json_results_are_framed_per_reply_topic_msgpack_and_dead_letters_are_not(
    kafka, causal_model: Path, causal_scorer, causal_reference: Reference
) -> None:
    topics = await fresh_topics(kafka, partitions=1, dead_letters=True)
    own_reply = unique("own-replies")
    await create_topics(kafka.bootstrap, [own_reply], 1)  # tansu 0.6 is slow to auto-create on produce
    json_job = Job(id="json", query=[5, 6], items=[[7], [8, 9]], label_token_ids=[3, 4])
    packed_job = Job(id="packed", query=[5], items=[[7]], label_token_ids=[3])
    routed_job = Job(id="routed", query=[6], items=[[9]], label_token_ids=[4])
    routed_to = own_reply.encode()
    garbage = b"{not json"
    with FakeRegistry() as registry:
        settings = topics.settings(causal_model, schema_registry_url=registry.url)
        async with InProcessWorker(settings, causal_scorer.engine):
            await produce(
                kafka.bootstrap,
                [
                    Out(topics.requests, encode_job(json_job), headers=_JSON),
                    Out(
                        topics.requests,
                        encode_job(packed_job, "msgpack"),
                        headers=[("content-type", CONTENT_TYPE_MSGPACK.encode())],
                    ),
                    Out(topics.requests, garbage, headers=_JSON),
                    Out(
                        topics.requests,
                        encode_job(routed_job),
                        headers=[*_JSON, ("reply_topic", routed_to)],
                    ),
                ],
            )
            replies = await topics.read_replies(3, timeout_s=60)
            routed = await read_topic(kafka.bootstrap, own_reply, lambda rs: len(rs) >= 1, timeout_s=30)
            dead = await read_topic(
                kafka.bootstrap, topics.dead_letters, lambda rs: len(rs) >= 1, timeout_s=30
            )
        ids = {subject: versions[0] for subject, versions in registry.state.subjects.items()}

    assert set(ids) == {f"{topics.replies}-value", f"{own_reply}-value"}
    by_type: dict[str, list[bytes]] = {}
    for record in replies:
        by_type.setdefault(dict(record.headers)["content-type"].decode(), []).append(record.value)

    json_values = by_type["application/json"]  # the scored job and the undecodable record's answer
    assert len(json_values) == 2
    for value in json_values:
        assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] == ids[f"{topics.replies}-value"]
    results = {r.id: r for r in (decode_result(unframe(v)) for v in json_values)}
    assert results["json"].scores is not None
    assert max_abs_diff(results["json"].scores, causal_reference.scores(json_job)) <= 1e-4

    (packed_value,) = by_type[CONTENT_TYPE_MSGPACK]
    assert packed_value[0] != 0  # unframed: a MessagePack map
    assert decode_result(packed_value, CONTENT_TYPE_MSGPACK).id == "packed"

    (routed_record,) = routed
    assert struct.unpack(">I", routed_record.value[1:5])[0] == ids[f"{own_reply}-value"]
    assert decode_result(unframe(routed_record.value)).id == "routed"

    assert [record.value for record in dead] == [garbage]  # the request's bytes, untouched
