"""Settings given as text, read into values: the parsers behind config.py's validators.

Each raises `ValueError` with a message that shows the expected form, which pydantic prefixes with
the setting's name, so a bad value fails at start in one line naming the setting and the fix.
"""

from __future__ import annotations

import os


def host_ports(value: str) -> str:
    """`bootstrap_servers`: comma-separated HOST:PORT (a bare host or [IPv6] takes the client's 9092)."""
    servers = [s.strip() for s in value.split(",") if s.strip()]
    if not servers:
        raise ValueError("empty: give at least one HOST:PORT, e.g. localhost:9092")
    for server in servers:
        host, colon, port = server.rpartition(":")
        if not colon or server.endswith("]"):  # a bare host (or [IPv6]): the client adds port 9092
            continue
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{server!r} is not HOST:PORT (e.g. localhost:9092)")
    return ",".join(servers)


def topic_priorities(value: str) -> dict[str, int]:
    """`topic_priorities`: TOPIC=N,TOPIC=N from the environment or a flag; N within the job field's
    range (-128..127)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        topic, equals, number = part.rpartition("=")
        try:
            priority = int(number)
        except ValueError:
            priority = None
        if not equals or not topic.strip() or priority is None:
            raise ValueError(f"{part!r} is not TOPIC=N (e.g. scoring-bulk=-1,scoring-interactive=1)")
        if not -128 <= priority <= 127:
            raise ValueError(f"{part!r}: a priority is from -128 to 127")
        out[topic.strip()] = priority
    return out


def readable_file(value: str | None) -> str | None:
    """A TLS file that is missing or unreadable fails at start, not after the model has loaded; an
    empty value (KAFKA_SCORER_SSL_CAFILE=) means unset."""
    if not value:
        return None
    if not os.path.exists(value):
        raise ValueError(f"no such file {value!r}")
    if not os.path.isfile(value):
        raise ValueError(f"{value!r} is not a file")
    if not os.access(value, os.R_OK):
        raise ValueError(f"{value!r} is not readable (permission denied)")
    return value
