"""Is the broker serving? An aiokafka metadata round trip that lists the broker, not an open port.

A KRaft broker binds its listener before it has registered with its controller; until then metadata
lists no broker and a client's first request can fail. The probe runs its own event loop on a thread, so
it can be called from synchronous code and from inside a running loop alike.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _cluster_answers(bootstrap: str, timeout_s: float, node_id: int | None) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        cluster = await admin.describe_cluster()
        brokers = cluster.get("brokers") or []
        return bool(brokers) and (node_id is None or any(b["node_id"] == node_id for b in brokers))
    except Exception:  # any failure means "not yet": the caller retries until its deadline
        return False
    finally:
        await admin.close()


def _in_thread(run: Callable[[], bool]) -> bool:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(run()), name="apache-kafka-probe", daemon=True)
    thread.start()
    thread.join()
    return bool(result and result[0])


def answers(bootstrap: str, timeout_s: float = 3.0, node_id: int | None = None) -> bool:
    """True when the broker at `bootstrap` (host:port) answers metadata with a broker in it (with
    `node_id` in it, where given: a cluster's node answers with the others before it registered)."""
    host, _, port = bootstrap.rpartition(":")
    if not _port_open(host, int(port)):
        return False
    return _in_thread(lambda: asyncio.run(_cluster_answers(bootstrap, timeout_s, node_id)))
