"""TLS, mutual TLS and SCRAM-SHA-512 configured on Apache Kafka 4.1 itself, not on a proxy.

test_tls.py proves the same paths through a Python TLS/SASL terminator in front of the embedded tansu;
here the broker does the handshakes and checks the password, so what is proven is what a production
cluster does: a worker answers a job and `ScoringClient` gets it back through each listener (scores
against the independent reference), and Kafka's own refusals — an untrusted CA, no client certificate,
a wrong password — each become one line naming the setting, from the worker's start-up check, the
`kafka-scorer worker` command and the client alike. One broker (one JVM, ~10 s) serves the module.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.kafka_security import ScramUser
from kafka_scorer.client import InvalidSetting, ScoringClient
from kafka_scorer.config import Settings
from kafka_scorer.errors import SettingError
from kafka_scorer.kafka.admin import create_topics
from kafka_scorer.kafka.preflight import check_connection
from kafka_scorer.wire.protocol import Job
from tests.integration.cli_runs import (
    assert_worker_refused_at_start,
    cli_flags,
    run_cli,
)
from tests.integration.jobs import Reference, max_abs_diff
from tests.integration.kafka_helpers import BrokerInfo, InProcessWorker, Topics, unique
from tests.integration.secured_kafka import SecuredKafka, secured_kafka

pytestmark = [pytest.mark.integration, pytest.mark.apache_kafka]

USER = ScramUser("scorer", "pw-7Qk2-never-printed")
WRONG = "wrong-pw-5521"
JOBS = [
    Job(id="ids", query=[5, 17, 42, 99], items=[[7, 8], [120, 121, 122]], label_token_ids=[3, 300]),
    Job(id="text", query="Is this review positive?", items=["great food", "dog"], label_token_ids=[40, 41],
        apply_softmax=True),
]  # fmt: skip
# Each refusal Apache Kafka makes: the listener, the settings changed, the setting the line must name.
REFUSALS = [
    ("tls", {"ssl_cafile": "other_ca"}, "ssl_cafile", "is not trusted"),
    ("mtls", {"ssl_certfile": None, "ssl_keyfile": None}, "ssl_certfile", "requires a client certificate"),
    ("scram", {"sasl_password": WRONG}, "sasl_password", "refused SASL SCRAM-SHA-512"),
]
REFUSAL_IDS = ["untrusted-ca", "no-client-certificate", "wrong-password"]
NOT_SASL = {"security_protocol": "SSL", "sasl_mechanism": None, "sasl_username": None, "sasl_password": None}


@pytest.fixture(scope="module")
def secured(apache_kafka_distribution, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """`apache_kafka_distribution` (tests/conftest.py) skips, or fails where CI requires the broker."""
    with secured_kafka(tmp_path_factory.mktemp("kafka-security"), USER, apache_kafka_distribution) as started:
        yield started


def _security(secured: SecuredKafka, mode: str, overrides: dict[str, str | None]) -> dict[str, str]:
    """`secured.security(mode)` with `overrides` applied: None removes a setting, a name of a file in
    the test material (other_ca, stranger.cert, stranger.key) stands for its path."""
    files = {
        "other_ca": secured.material.other_ca,
        "stranger.cert": secured.material.stranger.cert,
        "stranger.key": secured.material.stranger.key,
    }
    security = secured.security(mode)
    for name, value in overrides.items():
        if value is None:
            security.pop(name, None)
        else:
            security[name] = str(files.get(value, value))
    return security


def _settings(secured: SecuredKafka, mode: str, security: dict[str, str]) -> Settings:
    return Settings(_env_file=None, bootstrap_servers=secured.bootstrap(mode), **security)  # type: ignore[arg-type]


async def _topics(secured: SecuredKafka) -> Topics:
    """Fresh topics, made over the plain listener: what is under test is the worker and the client."""
    broker = BrokerInfo(secured.broker.bootstrap_servers, "Apache Kafka", True, 1000)
    topics = Topics(broker, unique("req"), unique("res"), unique("group"), 2)
    await create_topics(broker.bootstrap, [topics.requests, topics.replies], topics.partitions)
    return topics


def _check_answer(result, job: Job, reference: Reference) -> None:
    assert result.error is None and result.scores is not None, result
    assert max_abs_diff(result.scores, reference.scores(job)) <= 1e-4


# ---- a job answered through each listener ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["tls", "mtls", "scram"])
async def test_worker_answers_and_client_gets_the_result_through_the_listener(
    secured: SecuredKafka, mode: str, causal_model: Path, causal_scorer, causal_reference: Reference
) -> None:
    security = secured.security(mode)
    topics = await _topics(secured)
    settings = topics.settings(causal_model, bootstrap_servers=secured.bootstrap(mode), **security)
    client = ScoringClient(
        secured.bootstrap(mode), topics.requests, topics.replies, fetch_max_wait_ms=20, timeout=60, **security
    )
    async with InProcessWorker(settings, causal_scorer.engine), client:
        results = await asyncio.gather(*(client.request(job) for job in JOBS))
    for job, result in zip(JOBS, results, strict=True):
        _check_answer(result, job, causal_reference)


# ---- Kafka's own refusals, each one line naming the setting ------------------------------------------


@pytest.mark.parametrize("mode", ["tls", "mtls", "scram"])
async def test_start_up_check_accepts_the_right_settings(secured: SecuredKafka, mode: str) -> None:
    assert await check_connection(_settings(secured, mode, secured.security(mode)), timeout_s=5) is True


@pytest.mark.parametrize(
    ("mode", "overrides", "setting", "words"),
    [
        *(pytest.param(*refusal, id=name) for refusal, name in zip(REFUSALS, REFUSAL_IDS, strict=True)),
        pytest.param("mtls", {"ssl_certfile": "stranger.cert", "ssl_keyfile": "stranger.key"}, "ssl_certfile",
                     "rejected the client certificate", id="client-certificate-from-another-ca"),
        pytest.param("scram", {"sasl_username": "nobody"}, "sasl_password", "'nobody'", id="unknown-user"),
        pytest.param("scram", NOT_SASL, "security_protocol", "requires SASL", id="sasl-listener"),
        pytest.param("tls", {"security_protocol": "PLAINTEXT", "ssl_cafile": None}, "security_protocol",
                     "probably uses TLS", id="tls-listener"),
    ],
)  # fmt: skip
async def test_start_up_check_names_the_setting_kafka_refused(
    secured: SecuredKafka, mode: str, overrides: dict, setting: str, words: str
) -> None:
    settings = _settings(secured, mode, _security(secured, mode, overrides))
    with pytest.raises(SettingError) as refused:
        await check_connection(settings, timeout_s=5)
    line = str(refused.value)
    assert refused.value.setting == setting, line
    assert words in line and "\n" not in line, line
    assert USER.password not in line and WRONG not in line


async def test_worker_command_refused_by_kafka_says_which_setting_in_one_line(
    secured: SecuredKafka, causal_model: Path
) -> None:
    """`kafka-scorer worker` as a person runs it: exit 2 and one line, before the model loads."""
    cases = [(mode, _security(secured, mode, overrides), setting) for mode, overrides, setting, _ in REFUSALS]
    runs = [
        run_cli("worker", "--model", str(causal_model), "--metrics-port", "0",
                "--bootstrap-servers", secured.bootstrap(mode), *cli_flags(security), timeout_s=60)
        for mode, security, _ in cases
    ]  # fmt: skip
    for (_, _, setting), run in zip(cases, await asyncio.gather(*runs), strict=True):
        assert_worker_refused_at_start(run, setting, secrets=(USER.password, WRONG))


@pytest.mark.parametrize(("mode", "overrides", "setting", "words"), REFUSALS, ids=REFUSAL_IDS)
async def test_client_refused_by_kafka_raises_invalid_setting(
    secured: SecuredKafka, mode: str, overrides: dict, setting: str, words: str
) -> None:
    topics = await _topics(secured)
    security = _security(secured, mode, overrides)
    client = ScoringClient(secured.bootstrap(mode), topics.requests, topics.replies, **security)
    with pytest.raises(InvalidSetting) as refused:
        async with client:
            pass
    line = str(refused.value)
    assert refused.value.setting == setting and words in line and "\n" not in line, line
    assert USER.password not in line and WRONG not in line
