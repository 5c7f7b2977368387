"""The client's error paths that need no broker (docs/client.md, "Errors"): each raised by the real
code path, each a `ScoringError` and the built-in a caller would otherwise catch.

A bad argument is `InvalidJob` before anything is sent: these clients are never started, so a call
that got past the argument checks would end in `NotStarted` instead, which is how "nothing was
sent" is observed."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scorer.client import (
    BrokerUnreachable,
    InvalidJob,
    InvalidSetting,
    NotStarted,
    ScoringClient,
    ScoringError,
)
from kafka_scorer.embedded.broker import free_port
from kafka_scorer.errors import SettingError, UserFacingError
from kafka_scorer.wire.protocol import Job

FIELDS = set(Job.__struct_fields__)


def _client(**kwargs) -> ScoringClient:
    return ScoringClient("127.0.0.1:9", "requests", "replies", **{"security_protocol": "PLAINTEXT", **kwargs})


@pytest.mark.parametrize(
    "fields",
    [
        {"prioirty": 5},  # misspelt
        {"priority": 500},  # out of range (SPEC §9: -128..127)
        {"priority": "high"},
        {"top_n": -1},
        {"label_token_ids": "yes"},
        {"timeout_ms": 0},
        {"chunking": {"window": 0}},
    ],
)
async def test_a_bad_field_is_invalid_job_before_anything_is_sent(fields) -> None:
    with pytest.raises(InvalidJob) as bad:
        await _client().score([1, 2], [[3]], **fields)
    assert isinstance(bad.value, ValueError) and isinstance(bad.value, ScoringError)
    assert bad.value.__cause__ is not None


@pytest.mark.parametrize(
    "job",
    [
        Job(query=[1], items=[[2]], priority=500),  # a Job built by hand skips msgspec's checks
        Job(query=5, items=[[2]]),  # type: ignore[arg-type]
        Job(query=[1], items=[[2]], id=object()),  # type: ignore[arg-type]  # no format carries it
        {"query": [1], "items": [[2]]},  # not a Job at all
    ],
)
async def test_a_ready_job_the_worker_would_refuse_is_invalid_job(job) -> None:
    client = _client()
    with pytest.raises(InvalidJob):
        await client.score_job(job)
    with pytest.raises(InvalidJob):
        await client.request(job)


@pytest.mark.parametrize("timeout", [-1, 0, float("nan"), float("inf"), "5", True])
async def test_a_bad_call_timeout_is_invalid_job(timeout) -> None:
    with pytest.raises(InvalidJob):
        await _client().score([1], [[2]], timeout=timeout)


async def test_a_bad_correlation_id_is_invalid_job() -> None:
    with pytest.raises(InvalidJob):
        await _client().request(Job(query=[1], items=[[2]]), correlation_id=b"bytes")  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(name=st.text(min_size=1, max_size=30).filter(lambda name: name not in FIELDS | {"timeout"}))
def test_any_unknown_keyword_is_invalid_job(name: str) -> None:
    with pytest.raises(InvalidJob):
        asyncio.run(_client().score([1], [[2]], **{name: 1}))


@settings(max_examples=50, deadline=None)
@given(priority=st.one_of(st.integers(-300, 300), st.integers(-(2**70), 2**70)))
def test_a_priority_out_of_range_is_invalid_job_and_one_within_gets_through(priority: int) -> None:
    """Within -128..127 the call gets past every check (to `NotStarted`: nothing was sent either way)."""
    expected = NotStarted if -128 <= priority <= 127 else InvalidJob
    with pytest.raises(expected):
        asyncio.run(_client().score([1], [[2]], label_token_ids=[3], priority=priority))


async def test_a_call_before_start_or_after_close_is_not_started() -> None:
    client = _client()
    with pytest.raises(NotStarted) as early:
        await client.score([1], [[2]], label_token_ids=[3])
    assert isinstance(early.value, RuntimeError) and isinstance(early.value, ScoringError)
    await client.close()
    with pytest.raises(NotStarted):
        await client.request(Job(query=[1], items=[[2]]))


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"sasl_usrname": "u"}, "sasl_usrname"),  # misspelt: silently ignored before
        ({"fetch_max_wait_ms": "soon"}, "fetch_max_wait_ms"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"timeout": -2}, "timeout"),
        ({"connect_timeout": "long"}, "connect_timeout"),
        ({"connect_timeout": -1}, "connect_timeout"),
        ({"format": "avro"}, "format"),
    ],
)
def test_a_bad_setting_is_invalid_setting_naming_it(kwargs, setting: str) -> None:
    with pytest.raises(InvalidSetting) as bad:
        _client(**kwargs)
    assert bad.value.setting == setting
    assert isinstance(bad.value, SettingError) and isinstance(bad.value, ValueError)
    assert "\n" not in str(bad.value)


def test_a_misspelt_setting_suggests_the_right_one() -> None:
    with pytest.raises(InvalidSetting, match="did you mean sasl_username"):
        _client(sasl_usrname="u")


async def test_an_unreachable_broker_is_broker_unreachable_after_the_connect_timeout(caplog) -> None:
    port = free_port()  # nobody listens there
    client = ScoringClient(f"127.0.0.1:{port}", "requests", "replies", connect_timeout=0)
    with pytest.raises(BrokerUnreachable) as once:
        await client.start()
    retrying = ScoringClient(f"127.0.0.1:{port}", "requests", "replies", connect_timeout=1.0)
    with pytest.raises(BrokerUnreachable) as retried:
        async with retrying:
            pass
    for error in (once.value, retried.value):
        assert isinstance(error, ScoringError) and isinstance(error, UserFacingError)
        assert f"cannot reach the Kafka broker at 127.0.0.1:{port}" in str(error)
        assert error.reasons and f"127.0.0.1:{port}" in error.reasons[0]
    said = [r.getMessage() for r in caplog.records if "the client retries for up to 1s" in r.getMessage()]
    assert len(said) == 1  # one line, however many attempts


async def test_a_listener_that_hangs_up_is_invalid_setting_at_start() -> None:
    """Not a broker outage, a protocol mismatch (a TLS or SASL listener): never fixed by retrying, so
    `start` names the setting at once, whatever the connect_timeout."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4)  # the request arrived; closed unanswered
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        client = ScoringClient(f"127.0.0.1:{port}", "requests", "replies", connect_timeout=30)
        with pytest.raises(InvalidSetting) as refused:
            await client.start()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
    assert refused.value.setting == "security_protocol" and isinstance(refused.value, ScoringError)
    assert isinstance(refused.value.__cause__, SettingError)
