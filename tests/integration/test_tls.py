"""TLS, mutual TLS and SASL (PLAIN, SCRAM) end to end, and every refusal named in one line.

No broker runnable here serves TLS or checks SASL credentials, so each listener is a terminating
proxy (tests/integration/tls_proxy.py) in front of its own embedded tansu broker, which advertises the
proxy's port: the TLS handshakes and the credential checks are real, the broker behind is plaintext.
A worker and `kafka-scorer submit` score jobs through each listener (scores checked against the
independent reference); a wrong CA, a missing client certificate and a wrong password each stop the
worker before its model loads with one line naming the setting, exit code 2; and the password is
never printed, not even at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from kafka_scorer.config import Settings
from kafka_scorer.embedded.broker import EmbeddedBroker, free_port
from kafka_scorer.errors import SettingError
from kafka_scorer.kafka.connection import client_options
from kafka_scorer.kafka.preflight import check_connection, wait_until_accepted
from kafka_scorer.wire.protocol import Job, Result
from tests.integration.cli_runs import (
    assert_worker_refused_at_start,
    cli_flags,
    one_line,
    run_cli,
)
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import (
    BrokerInfo,
    InProcessWorker,
    Topics,
    WorkerProcess,
    unique,
)
from tests.integration.tls_material import TlsMaterial, make_tls_material
from tests.integration.tls_proxy import ProxyConfig, TlsProxy

pytestmark = pytest.mark.integration

USER, PASSWORD, WRONG = "scorer", "pw-7Qk2-never-printed", "wrong-pw-5521"
JOBS = [
    {"id": "ids", "query": [5, 17, 42, 99], "items": [[7, 8], [120, 121, 122]], "label_token_ids": [3, 300]},
    {"id": "text", "query": "Is this review positive?", "items": ["great food", "dog"],
     "label_token_ids": [40, 41], "apply_softmax": True},
]  # fmt: skip


@dataclass(frozen=True)
class Listener:
    """A proxy (TLS, maybe mTLS and SASL) in front of its own tansu; `security` is what a client needs."""

    proxy: TlsProxy
    material: TlsMaterial

    @property
    def bootstrap(self) -> str:
        return self.proxy.bootstrap_servers


@contextlib.contextmanager
def _listener(material: TlsMaterial, config: ProxyConfig, port: int | None = None) -> Iterator[Listener]:
    port = port or free_port()
    with EmbeddedBroker(advertised_port=port) as broker, TlsProxy(config, port, broker.port) as proxy:
        yield Listener(proxy, material)


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_listener(material: TlsMaterial) -> Iterator[Listener]:
    with _listener(material, ProxyConfig(material.server)) as listener:
        yield listener


@pytest.fixture(scope="module")
def mtls_listener(material: TlsMaterial) -> Iterator[Listener]:
    with _listener(material, ProxyConfig(material.server, client_ca=material.ca)) as listener:
        yield listener


@pytest.fixture(scope="module")
def sasl_listener(material: TlsMaterial) -> Iterator[Listener]:
    with _listener(material, ProxyConfig(material.server, users={USER: PASSWORD})) as listener:
        yield listener


def _security(mode: str, material: TlsMaterial, **overrides: str) -> dict[str, str]:
    """The security settings a client needs for `mode` (tls, mtls, or a SASL mechanism)."""
    settings = {"security_protocol": "SSL", "ssl_cafile": str(material.ca)}
    if mode == "mtls":
        settings |= {"ssl_certfile": str(material.client.cert), "ssl_keyfile": str(material.client.key)}
    elif mode != "tls":
        settings |= {"security_protocol": "SASL_SSL", "sasl_mechanism": mode, "sasl_username": USER}
        settings["sasl_password"] = PASSWORD
    return settings | overrides


async def _topics(listener: Listener, security: dict[str, str]) -> Topics:
    """Request and reply topics made through the listener itself (tansu sends every client there)."""
    broker = BrokerInfo(listener.bootstrap, "tansu behind a TLS proxy", False, 0)
    topics = Topics(broker, unique("req"), unique("res"), unique("group"), 2)
    settings = Settings(_env_file=None, bootstrap_servers=listener.bootstrap, **security)  # type: ignore[arg-type]
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 2, 1) for name in (topics.requests, topics.replies)])
    finally:
        await admin.close()
    return topics


def _check_scores(stdout: str, reference: Reference) -> None:
    results = {r.id: r for r in (msgspec.json.decode(line, type=Result) for line in stdout.splitlines())}
    assert set(results) == {job["id"] for job in JOBS}
    for spec in JOBS:
        result = results[spec["id"]]
        assert result.error is None and result.scores is not None, result
        assert max_abs_diff(result.scores, reference.scores(msgspec.convert(spec, Job))) <= 1e-4


async def _submit(listener: Listener, topics: Topics, security: dict[str, str]) -> tuple[int, str, str]:
    return await run_cli(
        "submit", "--bootstrap-servers", listener.bootstrap, *cli_flags(security), "--request-topic",
        topics.requests, "--reply-topic", topics.replies, "--timeout", "60", "--no-progress",
        stdin=b"\n".join(msgspec.json.encode(job) for job in JOBS),
    )  # fmt: skip


# ---- jobs answered through each listener -------------------------------------------------------------


@pytest.mark.parametrize(
    ("listener_name", "mode"),
    [("tls_listener", "tls"), ("mtls_listener", "mtls"), ("sasl_listener", "SCRAM-SHA-512")],
)
async def test_worker_and_submit_score_through_the_listener(
    request, listener_name: str, mode: str, causal_model: Path, causal_scorer, causal_reference
) -> None:
    listener: Listener = request.getfixturevalue(listener_name)
    security = _security(mode, listener.material)
    topics = await _topics(listener, security)
    settings = topics.settings(causal_model, **security)
    async with InProcessWorker(settings, causal_scorer.engine):
        rc, stdout, stderr = await _submit(listener, topics, security)
    assert rc == 0, stderr
    assert f"{len(JOBS)} jobs: {len(JOBS)} ok" in stderr
    _check_scores(stdout, causal_reference)
    assert PASSWORD not in stdout + stderr


async def test_sasl_plain_worker_process_at_debug_never_prints_the_password(
    sasl_listener: Listener, causal_model: Path, causal_reference
) -> None:
    """The worker as a user runs it, at its most verbose log level: every job answered, no password
    in its log, in the settings it echoes or in the submit client's output."""
    security = _security("PLAIN", sasl_listener.material)
    topics = await _topics(sasl_listener, security)
    settings = topics.settings(causal_model, log_level="DEBUG", **security)
    logins_before = sasl_listener.proxy.refused_logins
    async with WorkerProcess(settings, name="sasl-worker") as worker:
        rc, stdout, stderr = await _submit(sasl_listener, topics, security)
        log = worker.output()
    assert rc == 0, stderr
    _check_scores(stdout, causal_reference)
    assert "worker ready" in log
    assert PASSWORD not in log, "the worker logged its SASL password"
    assert PASSWORD not in stdout + stderr
    assert sasl_listener.proxy.refused_logins == logins_before


# ---- refusals: one line naming the setting, exit 2, before the model loads -----------------------------


async def test_worker_refused_by_the_broker_says_which_setting_in_one_line(
    tls_listener: Listener, mtls_listener: Listener, sasl_listener: Listener, material: TlsMaterial,
    causal_model: Path,
) -> None:  # fmt: skip
    cases = [
        (tls_listener, _security("tls", material, ssl_cafile=str(material.other_ca)), "ssl_cafile"),
        (mtls_listener, _security("tls", material), "ssl_certfile"),
        (sasl_listener, _security("PLAIN", material, sasl_password=WRONG), "sasl_password"),
    ]
    runs = [
        run_cli("worker", "--model", str(causal_model), "--metrics-port", "0",
                "--bootstrap-servers", listener.bootstrap, *cli_flags(security), timeout_s=60)
        for listener, security, _ in cases
    ]  # fmt: skip
    logins_before = sasl_listener.proxy.refused_logins
    for (_, _, setting), run in zip(cases, await asyncio.gather(*runs), strict=True):
        assert_worker_refused_at_start(run, setting, secrets=(PASSWORD, WRONG))
    assert sasl_listener.proxy.refused_logins == logins_before + 1  # the proxy refused it, once


async def test_submit_with_a_wrong_password_says_so_in_one_line(sasl_listener: Listener) -> None:
    security = _security("PLAIN", sasl_listener.material, sasl_password=WRONG)
    rc, _stdout, stderr = await run_cli(
        "submit", "--bootstrap-servers", sasl_listener.bootstrap, *cli_flags(security), "--no-progress",
        stdin=msgspec.json.encode(JOBS[0]),
    )  # fmt: skip
    assert rc == 2
    line = one_line(stderr)
    assert "refused SASL PLAIN authentication as sasl_username='scorer'" in line
    assert "--sasl-password" in line and WRONG not in line


# ---- the start-up check against each kind of refusal -----------------------------------------------


@pytest.mark.parametrize(
    ("listener_name", "mode", "overrides", "setting", "words"),
    [
        ("tls_listener", "tls", {}, None, ""),
        ("tls_listener", "tls", {"ssl_cafile": "other_ca"}, "ssl_cafile", "is not trusted"),
        ("tls_listener", "tls", {"ssl_cafile": None}, "ssl_cafile", "ssl_cafile unset: system CAs"),
        ("tls_listener", "plaintext", {}, "security_protocol", "probably uses TLS"),
        ("mtls_listener", "mtls", {}, None, ""),
        ("mtls_listener", "tls", {}, "ssl_certfile", "requires a client certificate"),
        ("mtls_listener", "mtls", {"ssl_certfile": "stranger.cert", "ssl_keyfile": "stranger.key"},
         "ssl_certfile", "rejected the client certificate"),
        ("mtls_listener", "mtls", {"ssl_keyfile": "stranger.key"}, "ssl_certfile", "KEY_VALUES_MISMATCH"),
        ("sasl_listener", "PLAIN", {}, None, ""),
        ("sasl_listener", "SCRAM-SHA-256", {}, None, ""),
        ("sasl_listener", "SCRAM-SHA-256", {"sasl_password": WRONG}, "sasl_password", "refused SASL"),
        ("sasl_listener", "SCRAM-SHA-512", {"sasl_username": "nobody"}, "sasl_password", "'nobody'"),
        ("sasl_listener", "tls", {}, "security_protocol", "probably requires SASL"),
    ],
)  # fmt: skip
async def test_start_up_check_names_the_setting(
    request, listener_name: str, mode: str, overrides: dict, setting: str | None, words: str
) -> None:
    listener: Listener = request.getfixturevalue(listener_name)
    files = {
        "other_ca": str(listener.material.other_ca),
        "stranger.cert": str(listener.material.stranger.cert),
        "stranger.key": str(listener.material.stranger.key),
    }
    security = {} if mode == "plaintext" else _security(mode, listener.material)
    for name, value in overrides.items():
        if value is None:
            security.pop(name)
        else:
            security[name] = files.get(value, value)
    settings = Settings(_env_file=None, bootstrap_servers=listener.bootstrap, **security)  # type: ignore[arg-type]
    if setting is None:
        assert await check_connection(settings, timeout_s=5) is True
        return
    with pytest.raises(SettingError) as refused:
        await check_connection(settings, timeout_s=5)
    assert refused.value.setting == setting
    line = str(refused.value)
    assert words in line and "\n" not in line
    assert PASSWORD not in line and WRONG not in line


async def test_a_cluster_down_at_start_is_waited_for_and_then_its_refusal_named(
    material: TlsMaterial,
) -> None:
    """A broker unreachable at start is an outage (retried), but once it answers, a wrong CA stops
    the wait with the setting's name instead of an endless reconnect loop."""
    port = free_port()
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        bootstrap_servers=f"127.0.0.1:{port}",
        **_security("tls", material, ssl_cafile=str(material.other_ca)),
    )
    stop = asyncio.Event()
    waiting = asyncio.create_task(wait_until_accepted(settings, stop))
    await asyncio.sleep(1.0)
    assert not waiting.done()  # nothing listens yet: still retrying
    with _listener(material, ProxyConfig(material.server), port=port), pytest.raises(SettingError) as refused:
        await asyncio.wait_for(waiting, 15)
    assert refused.value.setting == "ssl_cafile"
    # and a stop request ends a wait for a cluster that never comes
    waiting = asyncio.create_task(wait_until_accepted(settings, stop))
    await asyncio.sleep(0.3)
    stop.set()
    assert await asyncio.wait_for(waiting, 5) is False
