"""Starting and stopping the JVM broker as a child process, by its own pid, never by name."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from pathlib import Path


def die_with_parent() -> None:
    """In the child, before exec: on Linux, SIGTERM when the parent dies, so a test run that is killed
    leaves no JVM behind (a broker started for `./dev kafka` must outlive its command, and skips this)."""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie child of ours counts as gone)."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass  # not our child: ask the kernel
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def runs(pid: int, needle: str) -> bool:
    """True when `pid` runs and its command line holds `needle`: a pid from a state file may have been
    reused by another process since, which must not be signalled."""
    if not alive(pid):
        return False
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM (Kafka's controlled shutdown flushes and closes its log), then SIGKILL after `timeout_s`."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.05)
    raise TimeoutError(f"process {pid} survived SIGKILL for {timeout_s}s")
