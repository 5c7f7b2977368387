"""Errors a person reads (issue 4, item 5): one line that says what is wrong and what to do.

Each case runs the real command as a child process at the default log level and checks that stderr
holds exactly one line, that it names the culprit and the fix, and that no traceback leaks out. The
wording itself comes from kafka_scorer.errors, whose mapping is checked directly at the end.
"""

from __future__ import annotations

import pytest

from kafka_scorer import errors
from kafka_scorer.embedded.broker import free_port
from tests.cli.helpers import cli_env, run_cli, start_cli


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def test_submit_bad_setting_from_the_environment(tmp_path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    done = run_cli("submit", str(jobs), env=cli_env(KAFKA_SCORER_FETCH_MAX_WAIT_MS="soon"))
    assert done.returncode == 2
    line = _one_line(done.stderr)
    # Worded as the worker words it; submit has no --fetch-max-wait-ms, so only the variable is named.
    assert line.startswith("kafka-scorer submit: invalid setting fetch_max_wait_ms (KAFKA_SCORER_FETCH_MAX")
    assert "--fetch-max-wait-ms" not in line and "soon" not in line


def test_submit_bad_setting_from_a_flag(tmp_path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    done = run_cli("submit", str(jobs), "--security-protocol", "TLS")
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "invalid setting security_protocol (--security-protocol, KAFKA_SCORER_SECURITY_PROTOCOL)" in line
    assert "SASL_SSL" in line and "TLS'" not in line


@pytest.mark.parametrize("progress", [[], ["--no-progress"]], ids=["progress", "no-progress"])
def test_submit_unreachable_broker(tmp_path, progress: list[str]) -> None:
    """One line, also with the progress bar on: it appears only once the first job goes out."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    port = free_port()  # nothing listens there
    done = run_cli("submit", str(jobs), "--bootstrap-servers", f"127.0.0.1:{port}", *progress)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert f"cannot reach the Kafka broker at 127.0.0.1:{port}" in line
    assert "--bootstrap-servers" in line


def test_submit_missing_jobs_file(tmp_path) -> None:
    done = run_cli("submit", str(tmp_path / "nope.jsonl"))
    assert done.returncode == 2
    assert "nope.jsonl: no such file" in _one_line(done.stderr)


# The demo's missing --model directory: tests/integration/test_demo_narrow.py, on a run it shares.


# ---- the mapping itself ------------------------------------------------------------------------


def test_explain_model_load_error() -> None:
    from kafka_scorer.engine.models.loaded import ModelLoadError

    line = errors.explain(ModelLoadError("model: cannot load config of '/m'"))
    assert line is not None and line.startswith("model: cannot load config of '/m'")
    assert "--model or KAFKA_SCORER_MODEL" in line


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("KafkaConnectionError", "cannot reach the Kafka broker at b:9092"),
        ("UnknownTopicOrPartitionError", "does not exist on the Kafka broker at b:9092"),
        ("SaslAuthenticationFailed", "authentication with the Kafka broker at b:9092 failed"),
        ("KafkaTimeoutError", "did not answer in time"),
    ],
)
def test_explain_kafka_errors(name: str, expected: str) -> None:
    from aiokafka import errors as kafka_errors

    line = errors.explain(getattr(kafka_errors, name)(), bootstrap_servers="b:9092")
    assert line is not None and expected in line
    assert "\n" not in line


def test_explain_settings_error_names_every_bad_field() -> None:
    from pydantic import ValidationError

    from kafka_scorer.config import Settings

    with pytest.raises(ValidationError) as caught:
        Settings(_env_file=None, max_batch_tokens=-1, heartbeat_interval_ms=20000)  # type: ignore[call-arg]
    line = errors.explain(caught.value)
    assert line is not None and "\n" not in line
    assert "setting max_batch_tokens=-1" in line and "--max-batch-tokens" in line


def test_unknown_errors_keep_their_traceback(capsys) -> None:
    assert errors.explain(ZeroDivisionError("bug")) is None
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError as exc:
        assert errors.report(exc, verbose=False) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error: ZeroDivisionError" in err


def test_worker_with_a_missing_model_says_so_in_one_line(tmp_path) -> None:
    done = run_cli(
        "worker", "--model", str(tmp_path / "no-such-model"), "--metrics-port", "0", "--log-level", "WARNING"
    )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("kafka-scorer worker: error: model: no such directory")
    assert "--model or KAFKA_SCORER_MODEL" in line


def test_worker_with_a_missing_ca_file_says_so_before_the_model(tmp_path) -> None:
    """Issue 12: this was a bare FileNotFoundError after the model loaded, naming neither the path nor
    the setting, exit 1. The model path does not exist either: the CA file must be the line we get."""
    missing_ca = tmp_path / "ca.pem"
    done = run_cli(
        "worker", "--model", str(tmp_path / "no-such-model"), "--metrics-port", "0",
        "--security-protocol", "SSL", "--ssl-cafile", str(missing_ca),
    )  # fmt: skip
    assert done.returncode == errors.EXIT_USER_ERROR
    line = _one_line(done.stderr)
    assert "ssl_cafile (--ssl-cafile, KAFKA_SCORER_SSL_CAFILE)" in line
    assert f"no such file '{missing_ca}'" in line
    assert "model" not in line.replace("kafka-scorer", "")


def test_submit_with_a_missing_ca_file_names_it(tmp_path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    done = run_cli(
        "submit", str(jobs), "--security-protocol", "SSL", "--ssl-cafile", str(tmp_path / "ca.pem")
    )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "invalid setting ssl_cafile (--ssl-cafile, KAFKA_SCORER_SSL_CAFILE): no such file" in line


def test_a_secret_in_a_bad_setting_is_not_echoed(tmp_path) -> None:
    """The submit client's settings errors never repeat a secret (nor any other value given)."""
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"query": [1], "items": [[2]], "label_token_ids": [3]}\n')
    done = run_cli("submit", str(jobs), "--sasl-password", "hunter2-secret")  # SASL needs SASL_*
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "sasl_password" in line and "hunter2-secret" not in line


def test_submit_names_a_misspelt_variable_before_anything_else(tmp_path) -> None:
    done = run_cli(
        "submit",
        str(tmp_path / "nope.jsonl"),
        env=cli_env(KAFKA_SCORER_REPLY_TOPICS="mine", KAFKA_SCORER_FETCH_MAX_WAIT_MS="soon"),
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "kafka-scorer submit: warning: environment variable KAFKA_SCORER_REPLY_TOPICS is not a setting and "
        "is ignored: did you mean KAFKA_SCORER_REPLY_TOPIC?"
    ), done.stderr
    assert "invalid setting fetch_max_wait_ms" in lines[1]


def test_a_misspelt_variable_is_named_with_the_right_one(tmp_path) -> None:
    done = run_cli(
        "worker",
        *("--model", str(tmp_path / "no-such-model"), "--metrics-port", "0"),
        env=cli_env(KAFKA_SCORER_BOOTSTRAP_SERVER="kafka:9092"),
    )
    assert "KAFKA_SCORER_BOOTSTRAP_SERVER is not a setting" in done.stderr
    assert "did you mean KAFKA_SCORER_BOOTSTRAP_SERVERS?" in done.stderr


def _unusable_devices() -> list[tuple[str, str]]:
    """A name torch does not know, and the first GPU index past what this machine has (cuda:0 on a
    machine without CUDA): both refused in one line wherever the suite runs."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    past = "no usable CUDA GPU" if count == 0 else "GPU(s) are visible"
    return [("gpu", "is not a torch device"), (f"cuda:{count}", past)]


def test_a_device_this_machine_cannot_use_is_one_line(tmp_path) -> None:
    """Every unusable device, each its own worker, run side by side (each child is mostly torch's import)."""
    children = {
        device: (
            expected,
            start_cli(
                "worker",
                *("--model", str(tmp_path), "--device", device, "--metrics-port", "0"),  # a directory
                *("--bootstrap-servers", f"127.0.0.1:{free_port()}", "--log-level", "ERROR"),
            ),
        )
        for device, expected in _unusable_devices()
    }
    try:
        for device, (expected, child) in children.items():
            _, stderr = child.communicate(timeout=120)
            assert child.returncode == 2, (device, stderr)
            line = _one_line(stderr)
            assert expected in line and "--device" in line, device
    finally:
        for _, child in children.values():
            child.kill()  # a no-op once it exited


def test_a_busy_metrics_port_is_one_line_before_the_model_loads(tmp_path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_cli(
            "worker",
            *(
                "--model",
                str(tmp_path),
                "--metrics-port",
                str(port),
            ),  # a directory: not refused before the port
            *("--bootstrap-servers", f"127.0.0.1:{free_port()}", "--log-level", "ERROR"),
        )
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert "--metrics-port" in line and str(port) in line
    assert "loading model" not in done.stderr


def test_every_secret_setting_is_kept_out_of_error_lines() -> None:
    """errors.py imports no config, so it lists the secrets itself: a SecretStr added to the settings
    without joining that list would have its value echoed by the next bad-setting line."""
    import typing

    from pydantic import SecretStr

    from kafka_scorer.config import Settings

    secret = {
        name
        for name, info in Settings.model_fields.items()
        if info.annotation is SecretStr or SecretStr in typing.get_args(info.annotation)
    }
    assert secret == errors.SECRET_SETTINGS


def test_a_message_s_first_line_skips_blank_lines_and_names_an_empty_one() -> None:
    """What the warm-up, the attention bench and the broker command print of an exception's text."""
    advice = "InvalidCxxCompiler: No working C++ compiler\n\nSet TORCHDYNAMO_VERBOSE=1 for the trace"
    assert errors.first_line(advice, "x") == "InvalidCxxCompiler: No working C++ compiler"
    assert errors.first_line("\n  \n  late start  \nmore", "x") == "late start"
    assert errors.first_line("", "RuntimeError") == "RuntimeError"
    assert errors.first_line(" \n ", "RuntimeError") == "RuntimeError"
