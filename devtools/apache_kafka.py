"""A real Apache Kafka broker (KRaft, broker and controller in one JVM) on loopback, for tests and `./dev`.

What the embedded brokers cannot show — transactions with the stock client, the group protocol as Kafka
implements it, a log that survives a restart — needs the real broker. This starts one: it resolves the
jars (`KafkaDistribution`), formats a fresh log directory, starts `kafka.Kafka` on free ports and waits
until a metadata request lists the broker. The ports are fixed for the object's life, so the tests can
stop it and start it again where their clients left it: keeping the log (`restart()`), or with the log
deleted and formatted anew (`restart(empty=True)`, like a broker whose disk was replaced).

Started here in ~5-10 s with ~350 MB RSS (`-Xmx512m`, serial GC: a test broker, not a throughput one).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from devtools import kafka_probe
from devtools.kafka_distribution import ApacheKafkaUnavailable, KafkaDistribution, java_command
from devtools.kafka_properties import BrokerProperties, Listener
from devtools.kafka_security import ScramUser
from devtools.processes import alive, die_with_parent, terminate
from kafka_scorer.embedded.broker import free_port

HEAP = "512m"
JVM_OPTIONS = ("-XX:+UseSerialGC", "-Djava.awt.headless=true")
LOG4J_CONFIG = """\
status = warn
shutdownHook = disable
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def cluster_id() -> str:
    """What `kafka-storage.sh random-uuid` prints (16 random bytes, URL-safe base64, unpadded), made here:
    one JVM start (~1 s) less per format. Kafka avoids ids that start with '-' (they read as a flag)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not made.startswith("-"):
            return made


class ApacheKafkaError(RuntimeError):
    """The broker exited at start or did not answer in time; the message ends with its log."""


class ApacheKafka:
    """One Apache Kafka node in `run_dir` (properties, log4j config, `broker.log`, `data/`).

    `run_dir=None` makes a temporary one, removed by `close()`; a given one is kept (`./dev kafka`).
    `die_with_parent=False` lets the JVM outlive this process (`./dev kafka start` returns at once)."""

    def __init__(
        self,
        distribution: KafkaDistribution | None = None,
        run_dir: Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        listeners: tuple[Listener, ...] = (),
        extra: Mapping[str, str] | None = None,
        start_timeout_s: float = 120.0,
        stop_timeout_s: float = 30.0,
        die_with_parent: bool = True,
        scram_users: tuple[ScramUser, ...] = (),
        node_id: int = 1,
        voters: str = "",
        cluster: str | None = None,
        heap: str = HEAP,
    ) -> None:
        self.distribution = distribution or KafkaDistribution.default()
        self._own_dir = run_dir is None
        self.run_dir = Path(tempfile.mkdtemp(prefix="apache-kafka-")) if run_dir is None else run_dir
        self.properties = BrokerProperties(
            log_dir=self.run_dir / "data",
            port=port or free_port(),
            controller_port=controller_port or free_port(),
            listeners=listeners,
            extra=dict(extra or {}),
            node_id=node_id,
            voters=voters,
        )
        self.cluster_id = cluster  # a cluster's nodes share one, given; one node makes its own at each format
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.die_with_parent = die_with_parent
        self.scram_users = scram_users  # written at each format: a wiped log gets them again
        self._proc: subprocess.Popen[bytes] | None = None
        self._spawned_at = 0.0
        self.startup_s: float | None = None  # the last start's seconds, from spawn to answering

    @property
    def bootstrap_servers(self) -> str:
        return self.properties.bootstrap_servers

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and alive(self._proc.pid)

    @property
    def log_file(self) -> Path:
        return self.run_dir / "broker.log"

    def log_tail(self, chars: int = 6000) -> str:
        """The end of the broker's log and of what the JVM printed (a failing test shows it)."""
        parts = []
        for path in (self.run_dir / "stdout.txt", self.log_file):
            if path.is_file():
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            java_command(),
            f"-Xmx{self.heap}",
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.run_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.run_dir}",
            "-cp",
            self.distribution.classpath,
            main,
            *args,
        ]

    def _write_config(self) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "log4j2.properties").write_text(LOG4J_CONFIG)
        config = self.run_dir / "server.properties"
        config.write_text(self.properties.render())
        return config

    def _format(self, config: Path) -> None:
        """An empty KRaft log under a new cluster id (`kafka-storage.sh format --standalone`), with the
        SCRAM users in it: KRaft has no other way to have them before the first client connects."""
        scram = [part for user in self.scram_users for part in ("--add-scram", user.format_argument())]
        # a node of a static quorum formats with the cluster's id and no quorum of its own
        quorum = () if self.properties.voters else ("--standalone",)
        format_args = ("format", *quorum, "-t", self.cluster_id or cluster_id(), "-c", str(config), *scram)
        done = subprocess.run(
            self._java("kafka.tools.StorageTool", *format_args),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            log_dir = self.properties.log_dir
            raise ApacheKafkaError(f"formatting {log_dir} failed:\n{done.stdout}{done.stderr}")

    def start(self) -> ApacheKafka:
        """Start (resolving the jars and formatting the log the first time) and wait until it answers."""
        if self.running:
            return self
        return self.spawn().wait_ready()

    def spawn(self) -> ApacheKafka:
        """Start the JVM without waiting: a cluster's nodes answer only once a quorum of them runs, so
        they are all spawned first, then waited for (`wait_ready`)."""
        self.distribution.resolve()
        config = self._write_config()
        if not (self.properties.log_dir / "meta.properties").is_file():
            self._format(config)
        began = time.monotonic()
        with open(self.run_dir / "stdout.txt", "ab") as out:
            self._proc = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C in a terminal reaches us; we stop the broker in order
                preexec_fn=die_with_parent if self.die_with_parent else None,
            )
        self._spawned_at = began
        return self

    def wait_ready(self) -> ApacheKafka:
        """Wait until this node answers metadata listing itself (a node of a cluster can answer with the
        others before it has registered); raises `ApacheKafkaError` with its log after `start_timeout_s`."""
        began = self._spawned_at
        assert self._proc is not None
        while time.monotonic() - began < self.start_timeout_s:
            if self._proc.poll() is not None:
                rc, self._proc = self._proc.returncode, None
                raise ApacheKafkaError(f"Apache Kafka exited at start (rc={rc}):\n{self.log_tail()}")
            if kafka_probe.answers(self.bootstrap_servers, node_id=self.properties.node_id):
                self.startup_s = time.monotonic() - began
                return self
            time.sleep(0.2)
        self.stop()
        raise ApacheKafkaError(
            f"Apache Kafka did not answer on {self.bootstrap_servers} in {self.start_timeout_s:.0f}s:\n"
            f"{self.log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM to the broker's own pid, SIGKILL after `stop_timeout_s`; the log directory stays."""
        proc, self._proc = self._proc, None
        if proc is not None:
            terminate(proc.pid, self.stop_timeout_s)
            proc.wait(self.stop_timeout_s)

    def kill(self) -> None:
        """SIGKILL, as a machine that loses power: no controlled shutdown, the log stays as it was."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(self.stop_timeout_s)

    def wipe(self) -> None:
        """Delete the log directory (stopped broker only): the next start formats an empty one."""
        if self.running:
            raise ApacheKafkaError("wipe() needs a stopped broker")
        shutil.rmtree(self.properties.log_dir, ignore_errors=True)

    def restart(self, empty: bool = False) -> ApacheKafka:
        """Stop and start on the same ports: with the log kept, or with it deleted (`empty=True`)."""
        self.stop()
        if empty:
            self.wipe()
        return self.start()

    def close(self) -> None:
        """Stop, and remove the run directory when this object made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = ["ApacheKafka", "ApacheKafkaError", "ApacheKafkaUnavailable", "Listener"]
