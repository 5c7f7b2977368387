"""`./dev kafka start|stop|status`: one Apache Kafka broker for a developer, outliving the command.

The broker lives in `$KAFKA_SCORER_KAFKA_RUN` (default `~/.cache/kafka-scorer/dev-broker`): its
properties, `broker.log`, its log directory `data/`, and `state.json` (pid and ports). `start` reuses the
ports and the log of the last start (`--empty` deletes the log first), so a stop and a start keep the
topics. Point the tests or a worker at it with the `export` line `start` and `status` print.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools.apache_kafka import ApacheKafka, ApacheKafkaError
from devtools.kafka_distribution import ApacheKafkaUnavailable
from devtools.processes import runs, terminate

NOT_RUNNING = 3  # `status`'s exit code when no broker runs (LSB's "program is not running")


@dataclass(frozen=True)
class DevBrokerState:
    """What `start` leaves for `stop` and `status`: the JVM's pid and the ports it was given."""

    pid: int
    port: int
    controller_port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"


def run_dir(env: Mapping[str, str] = os.environ) -> Path:
    override = env.get("KAFKA_SCORER_KAFKA_RUN")
    return Path(override) if override else Path.home() / ".cache" / "kafka-scorer" / "dev-broker"


def _read_state(where: Path) -> DevBrokerState | None:
    try:
        return DevBrokerState(**json.loads((where / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _running(where: Path) -> DevBrokerState | None:
    """The recorded broker, if that pid still runs *this* broker (a pid may have been reused)."""
    state = _read_state(where)
    if state is not None and runs(state.pid, str(where / "server.properties")):
        return state
    return None


def _announce(state: DevBrokerState, where: Path) -> None:
    print(f"Apache Kafka running (pid {state.pid}) on {state.bootstrap_servers}; log {where / 'broker.log'}")
    print(f"export KAFKA_BOOTSTRAP_SERVERS={state.bootstrap_servers}")


def start(where: Path, port: int | None, empty: bool) -> int:
    running = _running(where)
    if running is not None:
        _announce(running, where)
        return 0
    last = _read_state(where)
    broker = ApacheKafka(
        run_dir=where,
        port=port or (last.port if last else None),
        controller_port=last.controller_port if last else None,
        die_with_parent=False,
    )
    if empty:
        broker.wipe()
    broker.start()
    assert broker.pid is not None
    state = DevBrokerState(broker.pid, broker.properties.port, broker.properties.controller_port)
    (where / "state.json").write_text(json.dumps(asdict(state)))
    print(f"started in {broker.startup_s:.1f}s")
    _announce(state, where)
    return 0


def stop(where: Path) -> int:
    state = _running(where)
    if state is None:
        print("Apache Kafka is not running")
        return 0
    terminate(state.pid, timeout_s=30.0)
    print(f"stopped Apache Kafka (pid {state.pid}); its log directory {where / 'data'} is kept")
    return 0


def status(where: Path) -> int:
    state = _running(where)
    if state is None:
        print(f"Apache Kafka is not running (run directory {where})")
        return NOT_RUNNING
    _announce(state, where)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev kafka", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    starting = sub.add_parser("start", help="start the broker (resolving Apache Kafka the first time)")
    starting.add_argument("--port", type=int, help="the client port (default: the last one, else a free one)")
    starting.add_argument("--empty", action="store_true", help="delete the broker's log before starting")
    sub.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL); its log is kept")
    sub.add_parser("status", help=f"print where it runs; exit {NOT_RUNNING} when it does not")
    args = parser.parse_args(argv)
    where = run_dir()
    try:
        if args.command == "start":
            return start(where, args.port, args.empty)
        return stop(where) if args.command == "stop" else status(where)
    except ApacheKafkaUnavailable as exc:  # Java or Maven missing: say which, no traceback
        print(f"./dev kafka: {exc}", file=sys.stderr)
        return 2
    except ApacheKafkaError as exc:  # it exited at start or never answered: the message ends with its log
        print(f"./dev kafka: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
