"""The Schema Registry client (kafka_scorer/wire/registry.py) against a fake registry that follows
Confluent's documented REST API, the framing round trip through `protocol.unframe`, and the worker's
start-up check (one line naming schema_registry_url, exit 2)."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_scorer.embedded.broker import free_port
from kafka_scorer.wire.contract import json_schema
from kafka_scorer.wire.protocol import ErrorCode, Result, decode_result, encode_result, error_result, unframe
from kafka_scorer.wire.registry import RegistryError, SchemaRegistry, frame, subject_for
from tests.cli.helpers import run_cli
from tests.registry.fake_registry import FakeRegistry


def test_registers_once_then_looks_up_and_caches() -> None:
    with FakeRegistry() as fake:
        first = SchemaRegistry(fake.url).schema_id("replies-value")
        assert fake.state.requests == [("lookup", "replies-value"), ("register", "replies-value")]
        again = SchemaRegistry(fake.url)  # a restarted worker: read-only look-up, no second version
        assert again.schema_id("replies-value") == first
        assert again.schema_id("replies-value") == first  # cached: no third request
        assert fake.state.requests[2:] == [("lookup", "replies-value")]
        assert fake.state.subjects == {"replies-value": [first]}
        assert again.schema_id("other-value") == first  # one schema, one id, in any subject


def test_the_registered_schema_is_the_published_result_schema() -> None:
    with FakeRegistry() as fake:
        SchemaRegistry(fake.url).schema_id("r-value")
        (registered,) = fake.state.schemas
    # The generator of docs/contract/result.schema.json (tests/test_contract.py keeps the file equal).
    assert json.loads(registered) == json_schema(Result, "result")
    assert json.loads(registered)["$id"].endswith("/result.schema.json")


def test_user_info_in_the_url_is_basic_auth_and_never_shown() -> None:
    with FakeRegistry() as fake:
        url = fake.url.replace("http://", "http://svc:s3cr%40t@")
        registry = SchemaRegistry(url)
        registry.schema_id("r-value")
        assert "s3cr" not in registry.shown_url() and "svc" not in registry.shown_url()
    import base64

    assert fake.state.authorization[0] == "Basic " + base64.b64encode(b"svc:s3cr@t").decode()


def test_a_refusal_is_not_retriable_and_carries_the_registry_message() -> None:
    with FakeRegistry() as fake:
        fake.state.incompatible.add("r-value")
        with pytest.raises(RegistryError) as caught:
            SchemaRegistry(fake.url).schema_id("r-value")
    assert not caught.value.retriable
    assert "409" in str(caught.value) and "incompatible" in str(caught.value)


def test_an_unreachable_registry_is_retriable() -> None:
    with pytest.raises(RegistryError) as caught:
        SchemaRegistry(f"http://127.0.0.1:{free_port()}", timeout_s=2).schema_id("r-value")
    assert caught.value.retriable and "cannot reach" in str(caught.value)


@pytest.mark.parametrize("url", ["localhost:8081", "ftp://registry", "http://"])
def test_a_url_that_is_not_http_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        SchemaRegistry(url)


@given(schema_id=st.integers(0, 2**32 - 1), payload=st.binary())
def test_frame_is_magic_byte_and_big_endian_id(schema_id: int, payload: bytes) -> None:
    framed = frame(schema_id, payload)
    assert framed[0] == 0
    assert struct.unpack(">I", framed[1:5])[0] == schema_id
    assert framed[5:] == payload


@given(
    schema_id=st.integers(0, 2**32 - 1),
    text=st.text(max_size=50),
    score=st.floats(allow_nan=False, allow_infinity=False),
)
def test_a_framed_result_round_trips_through_unframe(schema_id: int, text: str, score: float) -> None:
    results = [
        Result(id=text, model="m", scores=[[score]]),
        error_result(text, ErrorCode.INVALID_REQUEST, text, model="m"),
    ]
    for result in results:
        assert decode_result(unframe(frame(schema_id, encode_result(result)))) == result


def test_subject_follows_the_topic_name_strategy() -> None:
    assert subject_for("scoring-results") == "scoring-results-value"


def test_worker_with_an_unreachable_registry_exits_2_in_one_line(tmp_path) -> None:
    port = free_port()
    done = run_cli(
        "worker",
        "--model",
        str(tmp_path),  # a directory: passes the early model check, never loaded
        "--metrics-port",
        "0",
        "--bootstrap-servers",
        f"127.0.0.1:{free_port()}",
        "--schema-registry-url",
        f"http://127.0.0.1:{port}",
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "schema_registry_url" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert "KAFKA_SCORER_SCHEMA_REGISTRY_URL" in lines[0]
