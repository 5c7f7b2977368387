"""Worker settings from flags over environment: bad values fail at start, naming the setting."""

from __future__ import annotations

import argparse
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kafka_scorer.cli import worker as command


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
        (("--max-batch-tokens", "-1"), "max_batch_tokens"),
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


# ---- TLS and SASL: what can be checked before anything connects ---------------------------------------


def test_missing_ssl_cafile_is_named_with_its_path_at_start(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    """Issue 12: a missing CA file was found only after the model loaded, as a bare FileNotFoundError
    naming neither path nor setting (exit 1). Now it is one line before anything loads, exit 2."""
    missing = tmp_path / "no-such-ca.pem"
    args = _parse("--model", "m", "--security-protocol", "SSL", "--ssl-cafile", str(missing))
    assert command.run(args) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "ssl_cafile (--ssl-cafile, KAFKA_SCORER_SSL_CAFILE)" in lines[0]
    assert f"no such file '{missing}'" in lines[0]


@pytest.mark.parametrize("field", ["ssl_cafile", "ssl_certfile", "ssl_keyfile"])
def test_tls_files_must_be_readable_files(field: str, tmp_path) -> None:
    pem = tmp_path / "cert.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    others = {"--ssl-certfile": str(pem)} if field == "ssl_keyfile" else {}
    flag = "--" + field.replace("_", "-")
    base = ["--security-protocol", "SSL", *[p for kv in others.items() for p in kv]]
    assert f"{field} (" in _error_text(*base, flag, str(tmp_path / "missing.pem"))
    assert "is not a file" in _error_text(*base, flag, str(tmp_path))  # a directory
    if os.geteuid() != 0:  # root reads anything
        pem.chmod(0)
        assert "not readable" in _error_text(*base, flag, str(pem))


def test_an_empty_tls_file_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_SCORER_SSL_CAFILE", "")
    assert command.load_settings(_parse("--security-protocol", "SSL")).ssl_cafile is None


@pytest.mark.parametrize(
    ("argv", "names", "fix"),
    [
        (("--ssl-cafile", "{pem}"), "ssl_cafile", "does not use TLS"),
        (("--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "PLAIN", "--sasl-username", "u",
          "--sasl-password", "p", "--ssl-certfile", "{pem}"), "ssl_certfile", "does not use TLS"),
        (("--security-protocol", "SSL", "--sasl-username", "u"), "sasl_username", "does not use SASL"),
        (("--security-protocol", "SSL", "--ssl-keyfile", "{pem}"), "ssl_keyfile", "without ssl_certfile"),
    ],
)  # fmt: skip
def test_tls_and_sasl_settings_that_cannot_work_together(
    argv: tuple[str, ...], names: str, fix: str, tmp_path
) -> None:
    pem = tmp_path / "x.pem"
    pem.write_text("pem")
    text = _error_text(*(a.format(pem=pem) for a in argv))
    assert names in text and fix in text


def test_sasl_password_never_shows_in_repr_errors_or_help(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from kafka_scorer import errors
    from kafka_scorer.config import Settings

    secret = "hunter2-do-not-print"
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password=secret,
    )
    assert secret not in repr(settings) and secret not in str(settings)
    assert secret not in settings.model_dump_json()
    assert settings.sasl_password is not None and settings.sasl_password.get_secret_value() == secret
    # a value that fails validation is not echoed either, by either error path
    with pytest.raises(ValidationError) as bad:
        Settings(_env_file=None, sasl_password=[secret])  # type: ignore[call-arg, arg-type]
    line = errors.explain(bad.value)
    assert line is not None and "sasl_password" in line and secret not in line
    assert secret not in command.describe_errors(bad.value)
    # --help shows no defaults taken from the environment
    monkeypatch.setenv("KAFKA_SCORER_SASL_PASSWORD", secret)
    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert secret not in parser.format_help()


def test_sasl_password_reaches_the_client_unmasked() -> None:
    from kafka_scorer.config import Settings
    from kafka_scorer.kafka.connection import client_options

    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password="s3cret",
    )
    options = client_options(settings)
    assert options["sasl_plain_password"] == "s3cret" and options["sasl_mechanism"] == "SCRAM-SHA-256"


@pytest.mark.parametrize(
    ("field", "given", "canonical"),
    [
        ("log_level", "info", "INFO"),
        ("delivery", "Exactly_Once", "exactly_once"),
        ("security_protocol", "plaintext", "PLAINTEXT"),
        ("dtype", "BFLOAT16", "bfloat16"),
    ],
)
def test_choices_are_matched_whatever_their_case(
    monkeypatch: pytest.MonkeyPatch, field: str, given: str, canonical: str
) -> None:
    monkeypatch.setenv(f"KAFKA_SCORER_{field.upper()}", given)
    assert getattr(command.load_settings(_parse()), field) == canonical
    flag = "--" + field.replace("_", "-")
    assert getattr(command.load_settings(_parse(flag, given)), field) == canonical


@pytest.mark.parametrize("servers", ["", " , ", ":9092", "kafka:port", "kafka:0", "a:9092,b:"])
def test_bootstrap_servers_must_be_host_ports(servers: str) -> None:
    assert "bootstrap_servers" in _error_text("--bootstrap-servers", servers)


def test_help_gives_every_setting_its_default_and_variable() -> None:
    from kafka_scorer.config import Settings

    parser = argparse.ArgumentParser()
    command.configure(parser)
    helps = {a.dest: a.help or "" for a in parser._actions}
    for name in Settings.model_fields:
        assert f"env: KAFKA_SCORER_{name.upper()})" in helps[name], name
        assert "(default: " in helps[name], name
    assert "{DEBUG,INFO,WARNING,ERROR}" in parser.format_help()


@given(st.text(alphabet="ab-=,0123456789 .", max_size=20))
def test_topic_priorities_parse_or_are_one_setting_error(text: str) -> None:
    """TOPIC=N,TOPIC=N: every priority within -128..127, or one validation error naming the setting."""
    from kafka_scorer.config import Settings

    try:
        priorities = Settings(_env_file=None, model="m", topic_priorities=text).topic_priorities  # type: ignore[call-arg]
    except ValidationError as exc:
        assert exc.errors()[0]["loc"] == ("topic_priorities",)
        return
    assert all(topic.strip() == topic != "" and -128 <= p <= 127 for topic, p in priorities.items())
