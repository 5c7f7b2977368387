"""The embedded broker with its topics created before any client can reach it: `kafka-scorer broker`.

Started plainly, tansu opens its port and the topics are created a moment later. A client that was
retrying through a broker restart (a producer, a worker's reply producer) gets in first: its produce
auto-creates the topic, `CreateTopics` arrives at the same moment, and tansu 0.6 keeps the two apart:
the partition then reports a log end of 2 while readers get offsets 0-14, later sends are refused with
`UnknownError`, and acknowledged records were never delivered to any reader (issue 26).

So the broker listens on a private loopback port, advertising the public one; its topics are created
there (tansu's own `topic create`, which talks to the address it is given rather than to the advertised
one); only then does tansu's proxy open the public port in front of it. No client can reach the broker
before its topics exist. The proxy adds one loopback hop per request.
"""

from __future__ import annotations

import subprocess
from types import TracebackType

from kafka_scorer.embedded.broker import BrokerError, EmbeddedBroker, _BrokerProcess, free_port, tansu_binary

AUTO_CREATED_PARTITIONS = 4
"""What tansu 0.6 gives a topic created on produce or on a metadata request (it has no setting for it):
the default of `kafka-scorer broker --partitions`, so every topic of the embedded broker has as many."""

_CREATE_TIMEOUT_S = 20.0


class _TansuProxy(_BrokerProcess):
    """tansu's Kafka proxy: the public port, forwarding to the broker behind it."""

    name = "tansu-proxy"

    def __init__(self, host: str, port: int | None, origin_port: int) -> None:
        super().__init__(host, port)
        self.origin_port = origin_port

    def command(self) -> list[str]:
        here = f"tcp://{self.host}:{self.port}"
        return [
            tansu_binary(),
            "proxy",
            "--listener-url",
            here,
            "--advertised-listener-url",
            here,
            "--origin-url",
            f"tcp://{self.host}:{self.origin_port}",
        ]


class SeededBroker:
    """tansu (memory storage) on `host:port` whose `topics` exist before the port opens."""

    def __init__(self, topics: list[str], partitions: int, host: str = "127.0.0.1", port: int | None = None):
        self.host = host
        self.port = port or free_port(host)
        self.topics = list(dict.fromkeys(topics))  # each once: a second create would be refused
        self.partitions = partitions
        self._broker = EmbeddedBroker(host=host, port=free_port(host), advertised_port=self.port)
        self._proxy = _TansuProxy(host, self.port, self._broker.port)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._broker.running and self._proxy.running

    def start(self) -> SeededBroker:
        self._broker.start()
        try:
            for topic in self.topics:
                self._create(topic)
            self._proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._proxy.stop(timeout_s)
        self._broker.stop(timeout_s)

    def output(self) -> str:
        return self._broker.output() + self._proxy.output()

    def _create(self, topic: str) -> None:
        where = f"tcp://{self.host}:{self._broker.port}"
        command = [tansu_binary(), "topic", "create", "--broker", where, "--partitions", str(self.partitions)]
        try:
            done = subprocess.run(
                [*command, topic], capture_output=True, text=True, timeout=_CREATE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise BrokerError(f"creating topic {topic} took over {_CREATE_TIMEOUT_S:.0f}s") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise BrokerError(f"could not create topic {topic}: {said[-1] if said else done.returncode}")

    def __enter__(self) -> SeededBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
