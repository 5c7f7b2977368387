"""An asyncio test that outlives its timeout is stopped, however busy its loop (tests/async_timeouts.py).

With pytest-timeout's default `signal` method the test below runs its full 20 s and passes: the alarm's
exception lands in the busy background task and asyncio keeps it there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BUSY_LOOP_TEST = """
import asyncio, time

async def _busy():
    while True:
        started = time.monotonic()
        while time.monotonic() - started < 0.05:  # CPU work inside one task step
            pass
        await asyncio.sleep(0)

async def test_outlives_its_timeout():
    task = asyncio.create_task(_busy())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
"""


def test_an_asyncio_test_with_a_busy_loop_is_stopped_at_its_timeout(tmp_path: Path) -> None:
    (tmp_path / "test_busy.py").write_text(BUSY_LOOP_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.async_timeouts"]
    started = time.monotonic()
    done = subprocess.run(
        [*argv, "--timeout", "2", "test_busy.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert done.returncode != 0 and "Timeout" in done.stdout + done.stderr, done.stdout[-2000:]
    assert took < 15, f"the timeout did not stop the test: it ran {took:.1f}s"
