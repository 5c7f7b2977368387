"""`kafka-scorer worker` as a child process of the benchmark: the worker exactly as deployed.

The open-loop bench measures latency as a user sees it, so nothing of the worker may share the
benchmark client's process: not its event loop, not its GIL, not its threads. The child is the plain
CLI (`python -m kafka_scorer worker` with the bench's own interpreter and environment, so it imports the
same kafka_scorer, also where the project is only on PYTHONPATH), its log goes to a file read back for
"worker ready" and for the error message should it exit.

The child stays in the bench's process group, so whoever kills the bench's group (a step timeout of
`./dev gpu-check`) kills the worker with it; on Linux it also gets SIGTERM should the bench die alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

READY_LINE = "worker ready"
"""What the worker logs once it has loaded, warmed up and started consuming (worker/service.py)."""

START_UP_STEPS = {
    "warm_up_s": r"warm-up at the served shapes took ([\d.]+) ?s",
    "label_kernels_s": r"label kernels tuned for .* in ([\d.]+) s",
    "cuda_graphs_s": r"CUDA graphs captured for .* in ([\d.]+) s",
}
"""The start-up lines with a duration (cli/worker.py, engine/load/warm_up.py): what the seconds to ready went
to. The label kernels and the graphs are parts of the warm-up, logged on CUDA only."""


def _terminate_with_parent() -> None:
    """In the child, before exec: SIGTERM when the bench dies (Linux `PR_SET_PDEATHSIG`)."""
    if sys.platform != "linux":
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class WorkerProcessError(RuntimeError):
    """The worker exited, or did not say it was ready in time; the message ends with its log's tail."""


class WorkerProcess:
    """Start with `start()`, wait for its ready line with `wait_ready()`, end with `stop()`."""

    def __init__(self, flags: list[str], *, log_dir: str | None = None) -> None:
        self.args = [sys.executable, "-m", "kafka_scorer", "worker", *flags]
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the child's lifetime
            prefix="kafka-scorer-bench-worker-", suffix=".log", dir=log_dir, delete=False
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        # The bench's own settings must not leak into the worker through KAFKA_SCORER_* variables.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_SCORER_")}
        env.update(TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen(
            self.args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_terminate_with_parent,
        )
        return self

    def output(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def logged_setting(self, name: str) -> str | None:
        """A `name=value` the worker logged (its "serving ..." line names the settings it resolved)."""
        found = re.search(rf"\b{re.escape(name)}=(\S+)", self.output())
        return found.group(1) if found else None

    def start_up_steps(self) -> dict[str, float | None]:
        """Seconds of each of `START_UP_STEPS` the worker logged; None for one it did not."""
        text = self.output()
        found = {name: re.search(pattern, text) for name, pattern in START_UP_STEPS.items()}
        return {name: float(match.group(1)) if match else None for name, match in found.items()}

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive:
            code = None if self._proc is None else self._proc.returncode
            raise WorkerProcessError(f"the bench's worker exited (rc={code}); its log ends:\n{self.tail()}")

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from start to the ready line (model load and the worker's own warm-up included)."""
        started = time.monotonic()
        while READY_LINE not in self.output():
            self.check_alive()
            if time.monotonic() - started > timeout_s:
                raise WorkerProcessError(
                    f"the bench's worker did not log {READY_LINE!r} in {timeout_s:.0f} s; its log ends:\n"
                    f"{self.tail()}"
                )
            time.sleep(0.1)
        return time.monotonic() - started

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM (the worker drains and commits), SIGKILL after `grace_s`; the log file is removed."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)
