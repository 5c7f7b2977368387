"""Apache Kafka's jars, resolved from Maven Central once per machine into a cache outside the repository.

There is no Apache Kafka package on the development and CI machines, and no Docker engine, but Java 17
and Maven are installed: Maven resolves `org.apache.kafka:kafka_2.13` and its
runtime dependencies (~45 jars, ~43 MB) in seconds, and `java -cp 'libs/*' kafka.Kafka` runs the broker
from them. A log4j2 SLF4J binding is added so the broker writes a log a failing test can show (Kafka's
own artifact brings only the SLF4J API, which would print nothing).

The cache (`$KAFKA_SCORER_KAFKA_HOME`, default `~/.cache/kafka-scorer/kafka-VERSION`) holds `libs/` and a
stamp written last: a directory without the stamp is a resolution that did not finish, and is redone.
Two test processes resolving at once on a fresh machine take turns on a file lock.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"  # log4j-slf4j-impl: Kafka 4.1 resolves slf4j-api 1.7, the 2.x binding would not bind
MIN_JAVA = 17  # Kafka 4.x brokers need Java 17
RESOLVE_TIMEOUT_S = 600.0


class ApacheKafkaUnavailable(RuntimeError):
    """Java or Maven is missing (or too old), or Maven could not resolve the jars: the message names
    what to install. Tests that need the JVM broker skip on it (fail where it is required)."""


def pom(version: str = KAFKA_VERSION) -> str:
    """A one-purpose Maven project whose runtime dependencies are the broker's classpath."""
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ]
    body = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        "<groupId>kafka-scorer.devtools</groupId><artifactId>apache-kafka-runtime</artifactId>"
        f"<version>1</version><dependencies>{body}</dependencies></project>\n"
    )


def java_command() -> str:
    """`java` on PATH, at least Java 17; raises `ApacheKafkaUnavailable` saying what is missing."""
    java = shutil.which("java")
    if java is None:
        raise ApacheKafkaUnavailable(
            f"Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+, and no `java` is on PATH "
            "(e.g. apt-get install openjdk-17-jre-headless)"
        )
    done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr)
    major = int(found.group(1)) if found else 0
    major = int(found.group(2)) if found and major == 1 and found.group(2) else major  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        raise ApacheKafkaUnavailable(
            f"Apache Kafka {KAFKA_VERSION} needs Java {MIN_JAVA}+; `{java} -version` says: "
            f"{done.stderr.strip().splitlines()[:1]}"
        )
    return java


def _maven_command() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ApacheKafkaUnavailable(
            f"resolving Apache Kafka {KAFKA_VERSION} from Maven Central needs Maven, and no `mvn` is on PATH "
            "(e.g. apt-get install maven), or set KAFKA_SCORER_KAFKA_HOME to a directory already resolved"
        )
    return mvn


@dataclass(frozen=True)
class KafkaDistribution:
    """Where one Apache Kafka version's jars live on this machine, and how to get them there."""

    home: Path
    version: str = KAFKA_VERSION

    @classmethod
    def default(cls, env: Mapping[str, str] = os.environ) -> KafkaDistribution:
        """`$KAFKA_SCORER_KAFKA_HOME`, else `~/.cache/kafka-scorer/kafka-VERSION`: outside the repository,
        so a checkout, a worktree and `rm -rf .venv` all share the one download."""
        override = env.get("KAFKA_SCORER_KAFKA_HOME")
        cache = Path.home() / ".cache" / "kafka-scorer"
        home = Path(override) if override else cache / f"kafka-{KAFKA_VERSION}"
        return cls(home.expanduser())

    @property
    def libs(self) -> Path:
        return self.home / "libs"

    @property
    def classpath(self) -> str:
        return f"{self.libs}/*"

    @property
    def _stamp(self) -> Path:
        """Names the pom it was resolved from: another version or another binding resolves again."""
        digest = hashlib.sha1(pom(self.version).encode()).hexdigest()[:12]
        return self.home / f".resolved-{digest}"

    @property
    def resolved(self) -> bool:
        return self._stamp.is_file()

    def resolve(self) -> KafkaDistribution:
        """The jars in `libs/`, downloading them the first time (Maven's own cache, ~/.m2, is reused)."""
        if self.resolved:
            return self
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be resolving the same home
            if not self.resolved:
                self._download()
        return self

    def _download(self) -> None:
        mvn = _maven_command()
        with tempfile.TemporaryDirectory(prefix="resolve-", dir=self.home) as work:
            (Path(work) / "pom.xml").write_text(pom(self.version))
            libs = Path(work) / "libs"
            cmd = [mvn, "-q", "-B", "-f", str(Path(work) / "pom.xml"), "dependency:copy-dependencies"]
            cmd += [f"-DoutputDirectory={libs}", "-DincludeScope=runtime"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S)
            except subprocess.TimeoutExpired as exc:
                limit = f"{RESOLVE_TIMEOUT_S:.0f}s"
                raise ApacheKafkaUnavailable(f"Maven did not resolve Apache Kafka in {limit}") from exc
            if done.returncode != 0 or not any(libs.glob("kafka_2.13-*.jar")):
                raise ApacheKafkaUnavailable(
                    f"Maven could not resolve Apache Kafka {self.version} (rc={done.returncode}):\n"
                    f"{(done.stdout + done.stderr)[-3000:]}"
                )
            shutil.rmtree(self.libs, ignore_errors=True)
            libs.rename(self.libs)
        self._stamp.write_text(pom(self.version))
