"""The Dockerfile's base image for `./dev image-check`: `python:3.11-slim`, or a stand-in where it cannot
be pulled.

CI's machines reach Debian's package mirrors but no image registry, so the official base never arrives
there. The stand-in is built from Debian's packages the way the official one is in spirit: Debian
bookworm (whose python3 is 3.11, the official image's minor version) by debootstrap, a venv on PATH so
`python` and `pip` are the commands the Dockerfile calls, and this machine's CA bundle with pip pointed
at it, because these machines reach PyPI through a TLS-inspecting egress whose CA only the host trusts.
It is imported with `docker import` under a tag of its own (never `python:3.11-slim`: a fake under the
official name would shadow the real one on a machine that later can pull it) and passed to the build as
BASE_IMAGE. Its tag carries a hash of the recipe and the CA bundle, so it is built once per machine.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

OFFICIAL_BASE = "python:3.11-slim"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
VENV = "/opt/python"
IMAGE_CHANGES = (
    f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
RECIPE_VERSION = "1"
"""Raise with any change above, so a machine's cached stand-in is rebuilt."""


@dataclass(frozen=True)
class BasePlan:
    """`use` an image that is there, `build` the stand-in under `image`, or `skip` (with why)."""

    action: Literal["use", "build", "skip"]
    image: str
    reason: str


def plan_base(
    official_present: bool, standin: str, standin_present: bool, debootstrap: bool, root: bool
) -> BasePlan:
    """The decision alone: the official image when it is there, else the stand-in, built if need be."""
    if official_present:
        return BasePlan("use", OFFICIAL_BASE, f"{OFFICIAL_BASE} is present")
    if standin_present:
        return BasePlan("use", standin, f"{OFFICIAL_BASE} absent; the stand-in {standin} is present")
    if not debootstrap:
        return BasePlan(
            "skip",
            standin,
            f"{OFFICIAL_BASE} absent and no debootstrap to build a stand-in (apt-get install debootstrap)",
        )
    if not root:
        return BasePlan(
            "skip", standin, f"{OFFICIAL_BASE} absent and building a stand-in with debootstrap needs root"
        )
    return BasePlan(
        "build",
        standin,
        f"{OFFICIAL_BASE} absent (no registry reached): building {standin} from Debian {SUITE}",
    )


def standin_tag(ca_bundle: bytes) -> str:
    digest = hashlib.sha1(RECIPE_VERSION.encode() + b"\0" + " ".join(PACKAGES).encode() + b"\0" + ca_bundle)
    return f"kafka-scorer-base:{SUITE}-{digest.hexdigest()[:12]}"


def image_present(image: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", image], capture_output=True, check=False)
    return done.returncode == 0


def choose_base() -> BasePlan:
    tag = standin_tag(CA_BUNDLE.read_bytes() if CA_BUNDLE.exists() else b"")
    return plan_base(
        official_present=image_present(OFFICIAL_BASE),
        standin=tag,
        standin_present=image_present(tag),
        debootstrap=shutil.which("debootstrap") is not None or Path("/usr/sbin/debootstrap").exists(),
        root=os.geteuid() == 0,
    )


def build_standin(tag: str, log: Path) -> None:
    """debootstrap a minimal bookworm with python3, make the venv, trust the host's CAs, import it."""
    with tempfile.TemporaryDirectory(prefix="kafka-scorer-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
        _run(
            [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR],
            log,
        )
        if CA_BUNDLE.exists():
            shutil.copyfile(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
        (rootfs / "etc/pip.conf").write_text(f"[global]\ncert = {CA_BUNDLE}\n", encoding="utf-8")
        _run(["chroot", str(rootfs), "python3", "-m", "venv", VENV], log)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (rootfs / cache).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        changes = [arg for change in IMAGE_CHANGES for arg in ("--change", change)]
        with log.open("ab") as out:
            done = subprocess.run(
                ["docker", "import", *changes, "-", tag],
                stdin=tar.stdout,
                stdout=out,
                stderr=out,
                check=False,
            )
        tar.wait()
        if done.returncode or tar.returncode:
            raise RuntimeError(f"docker import of the stand-in failed (log: {log})")


def _run(command: list[str], log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(command, stdout=out, stderr=out, check=False)
    if done.returncode:
        raise RuntimeError(f"{command[0]} failed with {done.returncode} (log: {log})")
