"""Worker settings from flags over environment: bad values fail at start, naming the setting."""

from __future__ import annotations

import argparse
import os

import pytest
from pydantic import ValidationError

from kafka_scorer.worker import command


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for key in [k for k in os.environ if k.upper().startswith("KAFKA_SCORER_")]:
        monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.configure(parser)
    return parser.parse_args(list(argv))


def _error_text(*argv: str) -> str:
    with pytest.raises(ValidationError) as info:
        command.load_settings(_parse(*argv))
    return command.describe_errors(info.value)


def test_flags_override_environment_and_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    (tmp_path / ".env").write_text("KAFKA_SCORER_REPLY_TOPIC=from-file\nKAFKA_SCORER_GROUP_ID=file-group\n")
    monkeypatch.setenv("KAFKA_SCORER_GROUP_ID", "env-group")
    monkeypatch.setenv("KAFKA_SCORER_MAX_BATCH_TOKENS", "111")
    settings = command.load_settings(_parse("--max-batch-tokens", "222", "--request-topics", "a, b"))
    assert settings.reply_topic == "from-file"
    assert settings.group_id == "env-group"
    assert settings.max_batch_tokens == 222
    assert settings.request_topics == ["a", "b"]


def test_boolean_flags() -> None:
    assert command.load_settings(_parse("--trust-remote-code")).trust_remote_code is True
    assert command.load_settings(_parse("--no-trust-remote-code")).trust_remote_code is False


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (("--max-batch-tokens", "0"), "max_batch_tokens"),
        (("--delivery", "at_most_once"), "delivery"),
        (("--security-protocol", "SASL_SSL"), "sasl_mechanism"),
        (("--heartbeat-interval-ms", "20000"), "heartbeat_interval_ms"),
        (("--metrics-port", "70000"), "metrics_port"),
        (("--max-batch-wait-ms", "soon"), "max_batch_wait_ms"),
    ],
)
def test_invalid_setting_is_named(argv: tuple[str, ...], name: str) -> None:
    assert name in _error_text(*argv)


def test_run_refuses_bad_settings_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.run(_parse("--max-inflight-tokens", "-5", "--model", "m")) == 2
    err = capsys.readouterr().err
    assert "max_inflight_tokens (--max-inflight-tokens, KAFKA_SCORER_MAX_INFLIGHT_TOKENS)" in err


def test_run_requires_a_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.run(_parse()) == 2
    assert "model (--model" in capsys.readouterr().err
