"""What can be checked of compose/ without its images: the compose file by compose, Prometheus's config
by promtool.

Apache Kafka's, Prometheus's and Grafana's images cannot be pulled where no registry is reached, so the
stack itself never runs in CI (docs/operations.md says so). What compose and promtool would reject at
`up` can still be found: `docker compose config` (or Debian's docker-compose 1.29, the one a Debian
package gives) parses, interpolates and validates the file against the compose schema, with and
without the gpu profile; `promtool check config` loads compose/prometheus.yml as Prometheus would.
Compose 1.x predates the top-level `name:` key, so it is given a copy without that one line; everything
else is checked as written. A tool that is absent is one line saying what was not checked.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

PROFILES: tuple[tuple[str, ...], ...] = ((), ("--profile", "gpu"))


@dataclass(frozen=True)
class Check:
    """One check's outcome: `ok` False is a failure, None means it could not run (the tool is absent)."""

    name: str
    ok: bool | None
    detail: str


def compose_command() -> list[str] | None:
    """`docker compose` (v2) when the plugin answers, else Debian's `docker-compose`, else None."""
    if shutil.which("docker"):
        done = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if done.returncode == 0:
            return ["docker", "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def without_name_key(text: str) -> str:
    """The compose file for compose 1.x, which rejects the top-level `name:` (added by the compose spec
    after 1.29); every other line unchanged."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("name:"))


def check_compose_file(compose_dir: Path) -> Check:
    command = compose_command()
    if command is None:
        return Check("compose", None, "no compose binary (docker compose plugin or Debian's docker-compose)")
    source = compose_dir / "docker-compose.yml"
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-compose-") as tmp:
        target = source
        if command[0] != "docker":
            target = Path(tmp) / "docker-compose.yml"
            target.write_text(without_name_key(source.read_text(encoding="utf-8")), encoding="utf-8")
        for profile in PROFILES:
            done = subprocess.run(
                [
                    *command,
                    "-f",
                    str(target),
                    "--project-directory",
                    str(compose_dir),
                    *profile,
                    "config",
                    "-q",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode:
                return Check(
                    "compose", False, f"{' '.join(command)} config {' '.join(profile)}: {done.stderr.strip()}"
                )
    version = (
        "compose v2" if command[0] == "docker" else "docker-compose 1.x (the file less its `name:` line)"
    )
    return Check(
        "compose", True, f"{source.name} parsed and validated by {version}, default and gpu profiles"
    )


def check_prometheus_config(compose_dir: Path) -> Check:
    promtool = shutil.which("promtool")
    if promtool is None:
        return Check("promtool", None, "no promtool (Debian: apt-get install prometheus)")
    config = compose_dir / "prometheus.yml"
    done = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        return Check("promtool", False, (done.stdout + done.stderr).strip())
    return Check("promtool", True, f"{config.name} loaded by promtool check config")


def compose_checks(compose_dir: Path) -> list[Check]:
    return [check_compose_file(compose_dir), check_prometheus_config(compose_dir)]
