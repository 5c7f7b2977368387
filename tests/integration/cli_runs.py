"""`python -m kafka_scorer ...` as a child of a test, and the one-line error every refusal must be.

Shared by the TLS/SASL tests against the proxy (test_tls.py) and against Apache Kafka's own listeners
(test_kafka_security.py): both assert the same promise, that a refused setting is one line naming it.
And by the demo tests of the reranker templates (test_demo_rerank.py, test_demo_vision.py), which run
the demo as a person does and rebuild its model meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import TypeVar

from tests.cli import helpers
from tests.integration.kafka_helpers import ROOT

T = TypeVar("T")


def cli_flags(settings: dict[str, str]) -> list[str]:
    """Settings as command-line flags: `{"ssl_cafile": "x"}` -> `["--ssl-cafile", "x"]`."""
    return [part for name, value in settings.items() for part in ("--" + name.replace("_", "-"), value)]


def cli_env() -> dict[str, str]:
    """The test's environment without its KAFKA_SCORER_* (a developer's own settings must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SCORER_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["HF_HUB_OFFLINE"] = "1"
    return env


async def run_cli(*args: str, stdin: bytes | None = None, timeout_s: float = 120) -> tuple[int, str, str]:
    """A child process (`python -m kafka_scorer ARGS`) that does not block the test's event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kafka_scorer", *args, cwd=ROOT, env=cli_env(),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout_s)
    except TimeoutError:
        proc.kill()  # e.g. a worker retrying forever: the failure is the timeout, not a stray process
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


def run_demo(template: str, build: Callable[[], T], *, timeout_s: float = 240) -> tuple[T, str, str]:
    """`kafka-scorer demo --template TEMPLATE --short --dtype float32` as a child at 160 columns, asserted
    to exit 0, and `build()` run while it does: a test rebuilds the demo's tiny model from the same seed
    (the same bytes, so the same model_revision) in time the demo takes anyway. float32, since the
    tests compare the printed scores with a float32 reference (`auto` runs bf16 on a CPU that computes
    it natively: tests/engine/test_precision_fidelity.py). Returns what `build` made, stdout, stderr."""
    demo = helpers.start_cli(
        "demo", "--template", template, "--short", "--dtype", "float32", env=helpers.cli_env(COLUMNS="160")
    )
    try:
        built = build()
        out, err = demo.communicate(timeout=timeout_s)
    finally:
        if demo.poll() is None:  # a hung demo or a failed build: no stray process outlives the test
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, out + err
    return built, out, err


def one_line(stderr: str) -> str:
    """The only non-blank line of `stderr`, asserting there is exactly one and no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, stderr
    return lines[0]


def assert_names_setting(line: str, setting: str) -> None:
    """The line names the setting both ways a person can set it: the flag and the environment variable."""
    assert f"--{setting.replace('_', '-')}" in line and f"KAFKA_SCORER_{setting.upper()}" in line, line


def assert_worker_refused_at_start(run: tuple[int, str, str], setting: str, secrets: tuple[str, ...]) -> None:
    """`kafka-scorer worker` as a person runs it, refused by the broker: exit 2 and one line naming the
    setting, before the model loads, and no secret in anything it printed."""
    rc, stdout, stderr = run
    assert rc == 2, (setting, stderr)
    line = one_line(stderr)
    assert line.startswith("kafka-scorer worker: error: "), line
    assert_names_setting(line, setting)
    assert "loading model" not in stdout + stderr  # refused before the model, not minutes later
    assert not [secret for secret in secrets if secret in stdout + stderr]
