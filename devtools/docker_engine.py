"""A Docker engine for `./dev image-check`: the one that answers, or a `dockerd` started for the check.

CI's machines have Debian's `docker.io` installed by `.ci/run` but no daemon running, and no image
registry or container network beyond the host is wanted: the daemon started here has no bridge and no
iptables rules (`--bridge=none`), so builds and containers use the host's network and everything stays
on 127.0.0.1. This module decides (a pure function over facts, so the decision is unit-tested without
Docker) and starts; it installs nothing: installing a system daemon is the CI script's business, not
a developer tool's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DAEMON_ARGS = ("--bridge=none", "--iptables=false", "--ip-masq=false")
"""No bridge, no NAT: containers run with --network host, so nothing listens beyond the host's own."""
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class EngineFacts:
    """What the machine has: the client, the daemon binary, whether we are root, whether an engine answers."""

    docker: str | None
    dockerd: str | None
    root: bool
    answers: bool


@dataclass(frozen=True)
class EnginePlan:
    """`use` the engine that answers, `start` dockerd, or `skip` (with why, for the one loud line)."""

    action: Literal["use", "start", "skip"]
    reason: str


def plan_engine(facts: EngineFacts) -> EnginePlan:
    """The decision alone; `engine_facts` gathers its inputs."""
    if facts.docker is None:
        return EnginePlan("skip", "no docker client on PATH (Debian: apt-get install docker.io)")
    if facts.answers:
        return EnginePlan("use", "a Docker engine answers")
    if facts.dockerd is None:
        return EnginePlan(
            "skip", "no Docker engine answers and no dockerd is installed (apt-get install docker.io)"
        )
    if not facts.root:
        return EnginePlan("skip", "no Docker engine answers and starting dockerd needs root")
    return EnginePlan("start", f"no Docker engine answers: starting {facts.dockerd} {' '.join(DAEMON_ARGS)}")


def engine_answers() -> bool:
    """Whether `docker info` reaches a daemon (a few seconds at most)."""
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def engine_facts() -> EngineFacts:
    docker = shutil.which("docker")
    return EngineFacts(
        docker=docker,
        dockerd=shutil.which("dockerd")
        or next((p for p in ("/usr/sbin/dockerd",) if Path(p).exists()), None),
        root=os.geteuid() == 0,
        answers=docker is not None and engine_answers(),
    )


@contextmanager
def running_engine(plan: EnginePlan, log: Path) -> Iterator[None]:
    """The engine for the check's duration: a daemon this started is stopped after (by its own pid),
    so a developer's machine is left as it was found."""
    if plan.action == "use":
        yield
        return
    if plan.action != "start":
        raise RuntimeError(plan.reason)
    daemon = _start_daemon(log)
    try:
        yield
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()


def _start_daemon(log: Path) -> subprocess.Popen[bytes]:
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    with log.open("wb") as out:
        daemon = subprocess.Popen([dockerd, *DAEMON_ARGS], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"dockerd exited with {daemon.returncode}: {_tail(log)}")
        if engine_answers():
            return daemon
        time.sleep(1)
    daemon.terminate()
    raise RuntimeError(f"dockerd did not answer within {START_TIMEOUT_S:.0f} s: {_tail(log)}")


def _tail(log: Path, lines: int = 3) -> str:
    return " | ".join(log.read_text(errors="replace").splitlines()[-lines:])
