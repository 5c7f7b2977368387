"""What a timed run costs besides time: the peak memory it adds and the CPU other processes took.

Kept apart from the contenders because it is all platform plumbing (/proc, libc, CUDA counters) that
every contender shares, and because a figure taken on a busy machine must say so next to the number.

Peak memory is what a run adds on top of the loaded weights: CUDA `max_memory_allocated`; on CPU the
kernel's peak-RSS mark (`VmHWM`, reset through /proc/self/clear_refs) after returning freed heap.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass
class Measured:
    """Filled in when a `RunProbe.measure()` block ends."""

    peak_bytes: int = 0
    foreign_cpu_load: float | None = None
    """Share of all CPUs that *other* processes used meanwhile (Linux): a figure taken on a busy
    machine is marked as such instead of passing for the code's speed."""


class RunProbe:
    """Peak memory a block adds above where it started (CUDA or Linux CPU), and the CPU others used."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method = "cuda max_memory_allocated" if device.type == "cuda" else "VmHWM - VmRSS"
        self._libc = None
        if device.type != "cuda":
            with contextlib.suppress(OSError):
                self._libc = ctypes.CDLL("libc.so.6")
            if not _reset_peak_rss():
                self.method = "ru_maxrss delta (lower bound: peak RSS cannot be reset here)"

    @contextlib.contextmanager
    def measure(self) -> Iterator[Measured]:
        out = Measured()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            cpu = _cpu_snapshot()
            yield out
            torch.cuda.synchronize(self.device)
            out.foreign_cpu_load = _foreign_load(cpu, _cpu_snapshot())
            out.peak_bytes = torch.cuda.max_memory_allocated(self.device) - before
            return
        if self._libc is not None:
            self._libc.malloc_trim(0)  # hand freed heap back, so reuse of old pages does not hide a peak
        reset = _reset_peak_rss()
        before = _proc_status_bytes("VmRSS") if reset else _ru_maxrss_bytes()
        cpu = _cpu_snapshot()
        yield out
        out.foreign_cpu_load = _foreign_load(cpu, _cpu_snapshot())
        after = _proc_status_bytes("VmHWM") if reset else _ru_maxrss_bytes()
        out.peak_bytes = max(0, after - before)


@contextlib.contextmanager
def others_cpu() -> Iterator[Measured]:
    """Only the CPU share other processes used during the block: no device sync, no memory mark (for a
    client whose work runs in child processes, as the open-loop bench's worker and broker do)."""
    out = Measured()
    start = _cpu_snapshot()
    yield out
    out.foreign_cpu_load = _foreign_load(start, _cpu_snapshot())


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a host clock read after it covers the work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest_call(call: Callable[[], T], device: torch.device, repeats: int, warm: int = 2) -> tuple[float, T]:
    """Seconds of the fastest of `repeats` timed calls after `warm` untimed ones, and the last call's
    result. The fastest, not the mean: on a shared machine a disturbed call only ever reads slower."""
    result = None
    for _ in range(warm):
        result = call()
    best = math.inf
    for _ in range(repeats):
        sync(device)
        started = time.perf_counter()
        result = call()
        sync(device)
        best = min(best, time.perf_counter() - started)
    return best, result  # type: ignore[return-value]  # repeats + warm >= 1 at every caller


def cpu_model() -> str:
    """The processor's name as /proc/cpuinfo gives it (a report's first line names the machine)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def _cpu_snapshot() -> tuple[float, int, int] | None:
    """(wall, busy ticks of the whole machine, ticks of this process and its children) from /proc.

    Children count as ours: (d)'s broker is a child process and its work is part of (d)'s cost.
    """
    try:
        with open("/proc/stat") as fh:
            ticks = [int(v) for v in fh.readline().split()[1:]]
        own = _process_ticks("self")
    except (OSError, ValueError, IndexError):
        return None
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if entry.isdigit() and entry != me:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = _stat_fields(entry)
                if fields[1] == me:
                    own += int(fields[11]) + int(fields[12])
    return time.perf_counter(), sum(ticks) - ticks[3] - ticks[4], own


def _stat_fields(pid: str) -> list[str]:
    """/proc/PID/stat after the command name: state, ppid, ... (utime and stime at 11 and 12)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _process_ticks(pid: str) -> int:
    fields = _stat_fields(pid)
    return int(fields[11]) + int(fields[12])


def _foreign_load(start: tuple[float, int, int] | None, end: tuple[float, int, int] | None) -> float | None:
    """None for runs under a second: /proc counts in 10 ms ticks, too coarse to say anything."""
    if start is None or end is None or end[0] - start[0] < 1.0:
        return None
    others = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, others / os.sysconf("SC_CLK_TCK") / ((end[0] - start[0]) * (os.cpu_count() or 1)))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _proc_status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _ru_maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
