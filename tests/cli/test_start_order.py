"""What a command says first (issue 21 items 4 and 5): a misspelt variable before anything else, and a
model path that cannot exist in one line at once, without the hub's retries or its wording."""

from __future__ import annotations

import pytest

from tests.cli.helpers import cli_env, run_cli


def _lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.strip()]


def test_a_misspelt_model_variable_is_named_before_the_missing_model() -> None:
    done = run_cli("worker", "--metrics-port", "0", env=cli_env(KAFKA_SCORER_MODLE="./tiny-causal"))
    assert done.returncode == 2
    lines = _lines(done.stderr)
    assert "did you mean KAFKA_SCORER_MODEL?" in lines[0], lines
    assert "invalid setting model" in lines[1] and len(lines) == 2, lines


def test_a_misspelt_variable_comes_before_a_rejected_setting() -> None:
    env = cli_env(KAFKA_SCORER_BOOTSTRAP_SERVER="kafka:9092", KAFKA_SCORER_DELIVERY="twice")
    done = run_cli("worker", "--model", "x", env=env)
    assert done.returncode == 2
    lines = _lines(done.stderr)
    assert lines[0].startswith(
        "kafka-scorer worker: warning: environment variable KAFKA_SCORER_BOOTSTRAP_SERVER"
    )
    assert "did you mean KAFKA_SCORER_BOOTSTRAP_SERVERS?" in lines[0]
    assert "invalid setting delivery" in lines[1], lines


def test_every_other_command_checks_its_environment_first(tmp_path) -> None:
    """`model` stands for them: the warning comes before the command's own first check (a directory that
    is not empty, refused at once: building a model took 8 s for the same line)."""
    (tmp_path / "taken").write_text("x")
    done = run_cli("model", "causal", str(tmp_path), env=cli_env(KAFKA_SCORER_MODLE="x"), timeout=120)
    assert done.returncode == 2, done.stderr
    lines = _lines(done.stderr)
    assert lines[0] == (
        "kafka-scorer model: warning: environment variable KAFKA_SCORER_MODLE is not a setting and is "
        "ignored: did you mean KAFKA_SCORER_MODEL?"
    )
    assert "not an empty directory" in lines[1] and len(lines) == 2, lines


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("./no-such-model", "model: no such directory './no-such-model'"),
        (
            "models/rerankr",
            "'models/rerankr' is no local directory and, as a hub id, is not in the local cache",
        ),
    ],
)
def test_a_model_path_that_cannot_exist_fails_at_once_in_one_line(model: str, expected: str) -> None:
    """The test environment has HF_HUB_OFFLINE=1 (tests/cli/helpers.py), as a machine without hub access."""
    done = run_cli("worker", "--model", model, "--metrics-port", "0")
    assert done.returncode == 2
    lines = _lines(done.stderr)
    assert len(lines) == 1, lines
    assert lines[0].startswith("kafka-scorer worker: error: ") and expected in lines[0]
    assert "--model or KAFKA_SCORER_MODEL" in lines[0]
    assert "Repo id" not in done.stderr and "loading model" not in done.stderr


def test_worker_v_is_debug_with_tracebacks() -> None:
    """`-v` as on `demo` and `submit`: the same one line, with the traceback behind it."""
    done = run_cli("worker", "-v", "--model", "./no-such-model", "--metrics-port", "0")
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "SettingError" in done.stderr
    assert (
        done.stderr.rstrip()
        .splitlines()[-1]
        .startswith("kafka-scorer worker: error: model: no such directory")
    )
