"""`kafka-scorer` commands as a person starts them in a terminal: real processes, their output in a file,
and the probes read over HTTP. For tests that assert the lines an operator sees."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from devtools.processes import die_with_parent
from tests.cli.helpers import ROOT, cli_env

FAST_GROUP = ("--session-timeout-ms", "2000", "--heartbeat-interval-ms", "300", "--fetch-max-wait-ms", "20")
"""Worker flags that make the embedded broker's rebalances and fetches quick (BROKERS.md)."""


def start(*args: str, log: Path, **env: str) -> subprocess.Popen[bytes]:
    """`kafka-scorer ARGS` with stdout and stderr together in `log`."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kafka_scorer", *args],
            cwd=ROOT,
            env=cli_env(PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # a test process ended by its timeout leaves nothing running
        )


def wait_for(log: Path, needle: str, proc: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while needle not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"exited rc={proc.returncode}:\n{log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"no {needle!r}:\n{log.read_text(errors='replace')}"
        time.sleep(0.1)


def probe(port: int, path: str = "/readyz") -> int:
    """The HTTP status of a worker's probe (0: nothing answered)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def wait_for_probe(port: int, status: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := probe(port)) != status:
        assert proc.poll() is None, f"exited rc={proc.returncode}"
        assert time.monotonic() < deadline, f"/readyz stayed {seen}, expected {status}"
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def stopped_at_exit(*procs: subprocess.Popen[bytes]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Every process given (and any appended to the yielded list) is stopped when the block ends."""
    running = list(procs)
    try:
        yield running
    finally:
        for proc in reversed(running):
            stop(proc)
