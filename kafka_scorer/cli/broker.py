"""`kafka-scorer broker`: the embedded Kafka-protocol broker on its own, until Ctrl-C.

The demo and the tests start a broker for themselves; a person who wants to run `kafka-scorer worker`
against their own producer on a laptop, without Docker or a Kafka install, needs one that stays up on
a known port, with the request and reply topics already there — created before the port opens, so a
client retrying through a restart of this broker never races their creation. Storage is memory:
everything is gone when it stops (docs/quickstart.md and docs/worker.md say so too).
"""

from __future__ import annotations

import argparse
import signal
import sys

from kafka_scorer.errors import EXIT_USER_ERROR, first_line

DEFAULT_TOPICS = ("scoring-requests", "scoring-results")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", metavar="HOST", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=9092, metavar="N", help="port to listen on; 0: a free one"
    )
    parser.add_argument(
        "--topic",
        action="append",
        dest="topics",
        metavar="NAME",
        help="topic to create at start; repeat for more (default: scoring-requests and scoring-results)",
    )
    from kafka_scorer.embedded.seeded_broker import AUTO_CREATED_PARTITIONS

    parser.add_argument(
        "--partitions",
        type=int,
        default=AUTO_CREATED_PARTITIONS,
        metavar="N",
        help="partitions of each created topic (the default is what the broker gives a topic created on "
        "first use)",
    )


def run(args: argparse.Namespace) -> int:
    from kafka_scorer.embedded.broker import BrokerError, check_can_listen
    from kafka_scorer.embedded.seeded_broker import SeededBroker

    if args.partitions < 1:
        print("kafka-scorer broker: error: --partitions must be at least 1", file=sys.stderr)
        return EXIT_USER_ERROR
    try:
        if args.port:
            check_can_listen(args.host, args.port)
    except OSError as exc:
        print(
            f"kafka-scorer broker: error: cannot listen on {args.host}:{args.port} ({exc.strerror}); "
            "choose another --port",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    topics = args.topics or list(DEFAULT_TOPICS)
    try:
        # The topics exist before the port opens: a client retrying through a restart cannot race
        # their creation (embedded/seeded_broker.py).
        with SeededBroker(topics, args.partitions, host=args.host, port=args.port or None) as broker:
            print(
                f"broker ready on {broker.bootstrap_servers} (memory storage; topics: {', '.join(topics)}); "
                "Ctrl-C stops it",
                flush=True,
            )
            _wait_for_signal()
    except BrokerError as exc:
        print(f"kafka-scorer broker: error: {first_line(str(exc), type(exc).__name__)}", file=sys.stderr)
        return EXIT_USER_ERROR
    print("broker stopped", flush=True)
    return 0


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM; the broker is stopped by the caller's `with`."""
    received = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda sig, _frame: received.append(sig))
    while not received:
        signal.pause()
