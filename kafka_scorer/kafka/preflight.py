"""One test connection at start: TLS and SASL settings either work or are named in one line.

aiokafka treats every failed connection alike — a certificate it does not trust, a client certificate
the broker wants, a wrong password and a broker that is down all end in a retry — so the worker would
log "unreachable" forever for a mistake that never fixes itself. Before the model loads, the worker
(and `kafka-scorer submit`) tries one bootstrap server after another with the real settings: TLS
handshake and ApiVersions over a plain socket (TLS 1.3 delivers a rejected client certificate as an
alert after the handshake, which asyncio would hide), one Metadata request when SASL is off (a SASL
listener hangs up there), and the SASL exchange exactly as aiokafka runs it. A refusal becomes a
`SettingError` naming the setting (exit code 2); a broker that cannot be reached at all is not a
settings problem and keeps the ordinary retry. No topic is read, written or created.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiokafka import errors as kafka_errors
from aiokafka.conn import collect_hosts, create_conn

from kafka_scorer.config import Settings
from kafka_scorer.errors import SettingError, setting_hint
from kafka_scorer.kafka.connection import client_options

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 10.0
"""Longest one test connection may take; a broker slower than this counts as unreachable, not refused."""

_FIRST_RETRY_S, _LAST_RETRY_S = 0.5, 5.0  # the same cap as the clients' own reconnect backoff
_HUNG_UP_RECHECK_S = 0.5
_REPEAT_S = 60.0  # while waiting for a broker, one line a minute: the first was said before the model loaded

# OpenSSL alert reasons a server sends when it wants a (different) client certificate.
_CLIENT_CERT_REJECTED = (
    "CERTIFICATE_REQUIRED",
    "BAD_CERTIFICATE",
    "UNKNOWN_CA",
    "CERTIFICATE_UNKNOWN",
    "HANDSHAKE_FAILURE",
    "ACCESS_DENIED",
)
# What a TLS client reads when the port does not speak TLS at all.
_NOT_TLS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNKNOWN_PROTOCOL")


@dataclass(frozen=True)
class _HungUp:
    """The listener accepted the connection and closed it unanswered: a protocol mismatch, unless it
    was a broker restarting, which is why it must happen twice before it counts."""

    error: SettingError


async def check_connection(
    settings: Settings, timeout_s: float = CHECK_TIMEOUT_S, unreached: list[str] | None = None
) -> bool:
    """True once a bootstrap server accepted the settings; False when none could be reached (each
    server's reason, `host:port: why`, is appended to `unreached` when given).

    Raises `SettingError` when a server answered and refused them (or the TLS files cannot be used).
    """
    options = client_options(settings)
    options.pop("bootstrap_servers")
    options.pop("metadata_max_age_ms")  # a client's setting, not a connection's (create_conn refuses it)
    for host, port, _family in collect_hosts(settings.bootstrap_servers, randomize=False):
        verdict = await _probe_twice(settings, options.get("ssl_context"), host, port, timeout_s)
        if isinstance(verdict, str):
            log.debug("start-up check: %s:%s not reached: %s", host, port, verdict)
            if unreached is not None:
                unreached.append(f"{host}:{port}: {verdict}")
            continue
        if settings.security_protocol.startswith("SASL") and not await _authenticate(
            settings, options, host, port, timeout_s
        ):
            continue
        return True
    return False


async def _probe_twice(
    settings: Settings, context: ssl.SSLContext | None, host: str, port: int, timeout_s: float
) -> str | None:
    verdict = await asyncio.to_thread(probe_listener, settings, context, host, port, timeout_s)
    if isinstance(verdict, _HungUp):
        await asyncio.sleep(_HUNG_UP_RECHECK_S)
        verdict = await asyncio.to_thread(probe_listener, settings, context, host, port, timeout_s)
        if isinstance(verdict, _HungUp):
            raise verdict.error
    return verdict


def probe_listener(
    settings: Settings, context: ssl.SSLContext | None, host: str, port: int, timeout_s: float
) -> str | _HungUp | None:
    """Blocking: connect, TLS handshake when `context` is given, ApiVersions, and (without SASL) one
    Metadata request. None when all were answered; a string saying why the broker counts as
    unreachable; `_HungUp` when it closed on us. A TLS refusal raises `SettingError` at once.

    Plain sockets, not aiokafka: asyncio reports a TLS alert that arrives after the handshake (TLS 1.3
    sends "certificate required" that way) as a bare end of stream, and the alert is the diagnosis.
    """
    where = f"{host}:{port}"
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        return f"cannot connect ({exc})"
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(raw)
        try:
            if context is not None:
                sock = stack.enter_context(context.wrap_socket(raw, server_hostname=host))
            if not _round_trip(sock, _API_VERSIONS):
                return _HungUp(_hung_up_at_first_request(settings, where))
            if not settings.security_protocol.startswith("SASL") and not _round_trip(sock, _METADATA):
                return _HungUp(_wants_sasl(settings, where))
        except ssl.SSLError as exc:
            raise _refusal(exc, settings, where) from None
        except OSError as exc:  # a timeout included: slow or half-up, not refused
            return f"no answer ({exc!r})"
    return None


def _frame(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    client_id = b"kafka-scorer-preflight"
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


_API_VERSIONS = _frame(18, 0, 1)
_METADATA = _frame(3, 1, 2, struct.pack(">i", 0))  # v1 with an empty topic list: brokers only


def _round_trip(sock: socket.socket, request: bytes) -> bool:
    """Send one request; True when a whole response frame came back, False on end of stream."""
    sock.sendall(request)
    header = _read_exact(sock, 4)
    if header is None:
        return False
    (size,) = struct.unpack(">i", header)
    return _read_exact(sock, size) is not None


def _read_exact(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 16))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


async def _authenticate(
    settings: Settings, options: dict[str, Any], host: str, port: int, timeout_s: float
) -> bool:
    """The SASL exchange exactly as aiokafka runs it; False when the broker went away meanwhile."""
    try:
        conn = await asyncio.wait_for(
            create_conn(host, port, request_timeout_ms=int(timeout_s * 1000), **options), timeout_s
        )
    except Exception as exc:  # a check: every failure is diagnosed into one line, or re-raised below
        problem = diagnose(exc, settings, f"{host}:{port}")
        if problem is not None:
            raise problem from None
        log.debug("start-up check: SASL with %s:%s not completed: %r", host, port, exc)
        return False
    conn.close()
    return True


async def wait_until_accepted(settings: Settings, stop: asyncio.Event) -> bool:
    """Retry `check_connection` with backoff until a broker answers; False when `stop` came first.

    For a worker whose cluster was down at start: the settings are proven on the first connection
    that reaches a broker, not left to aiokafka's silent reconnects.
    """
    delay_s = _FIRST_RETRY_S
    started = said_at = time.monotonic()
    while not stop.is_set():
        if await check_connection(settings):
            log.info("broker %s reached; TLS/SASL settings accepted", settings.bootstrap_servers)
            return True
        if time.monotonic() - said_at >= _REPEAT_S:  # the first line came before the model loaded
            said_at = time.monotonic()
            log.warning(
                "broker %s still unreachable after %.0fs (security_protocol=%s); retrying every %.0fs or "
                "less — a TLS listener needs SSL or SASL_SSL, and the address must be the one the broker "
                "advertises",
                settings.bootstrap_servers,
                said_at - started,
                settings.security_protocol,
                _LAST_RETRY_S,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay_s)  # a signal ends the wait at once
        delay_s = min(_LAST_RETRY_S, delay_s * 2)
    return False


def diagnose(exc: BaseException, settings: Settings, where: str) -> SettingError | None:
    """The setting a refused connection points at, or None for an outage (refused TCP, timeout)."""
    for cause in _chain(exc):
        if isinstance(cause, kafka_errors.SaslAuthenticationFailed | kafka_errors.AuthenticationFailedError):
            return _sasl_refused(cause, settings, where)
        if isinstance(cause, kafka_errors.UnsupportedSaslMechanismError):
            return SettingError(
                "sasl_mechanism",
                f"the Kafka broker at {where} does not offer sasl_mechanism={settings.sasl_mechanism} "
                f"({cause}): set {setting_hint('sasl_mechanism')} to one it offers",
            )
        if isinstance(cause, ssl.SSLError):
            return _refusal(cause, settings, where)
    return None


def _refusal(exc: ssl.SSLError, settings: Settings, where: str) -> SettingError:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _untrusted(exc, settings, where)
    return _tls_refused(exc, settings, where)


def _hung_up_at_first_request(settings: Settings, where: str) -> SettingError:
    if settings.security_protocol.endswith("SSL"):
        return SettingError(
            "security_protocol",
            f"the Kafka broker at {where} closed the TLS connection without answering: check "
            f"{setting_hint('security_protocol')} and {setting_hint('ssl_certfile')}",
        )
    return SettingError(
        "security_protocol",
        f"the Kafka broker at {where} closed the connection without answering; its listener probably "
        f"uses TLS: set {setting_hint('security_protocol')} to SSL or SASL_SSL "
        f"(now {settings.security_protocol})",
    )


def _wants_sasl(settings: Settings, where: str) -> SettingError:
    return SettingError(
        "security_protocol",
        f"the Kafka broker at {where} answered ApiVersions, then closed the connection at the first "
        f"request; its listener probably requires SASL: set {setting_hint('security_protocol')} to "
        f"SASL_SSL or SASL_PLAINTEXT (now {settings.security_protocol}) with sasl_mechanism, "
        "sasl_username and sasl_password",
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and its causes: aiokafka wraps the TLS error of a broken connection in its own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _sasl_refused(cause: BaseException, settings: Settings, where: str) -> SettingError:
    said = " ".join(str(cause).split()) or type(cause).__name__
    return SettingError(
        "sasl_password",
        f"the Kafka broker at {where} refused SASL {settings.sasl_mechanism} authentication as "
        f"sasl_username={settings.sasl_username!r} ({said}): check {setting_hint('sasl_password')} "
        f"and {setting_hint('sasl_username')}",
    )


def _untrusted(cause: ssl.SSLCertVerificationError, settings: Settings, where: str) -> SettingError:
    detail = cause.verify_message or _reason(cause)
    if "mismatch" in detail.lower():
        return SettingError(
            "bootstrap_servers",
            f"the Kafka broker's certificate at {where} is not issued for that name ({detail}): connect by "
            f"a name the certificate lists ({setting_hint('bootstrap_servers')})",
        )
    now = f"ssl_cafile={settings.ssl_cafile!r}" if settings.ssl_cafile else "ssl_cafile unset: system CAs"
    return SettingError(
        "ssl_cafile",
        f"the Kafka broker's certificate at {where} is not trusted ({detail}; {now}): set "
        f"{setting_hint('ssl_cafile')} to the CA bundle that signed it",
    )


def _tls_refused(cause: ssl.SSLError, settings: Settings, where: str) -> SettingError:
    reason = _reason(cause)
    upper = reason.upper()
    if any(mark in upper for mark in _CLIENT_CERT_REJECTED):
        if not settings.ssl_certfile:
            return SettingError(
                "ssl_certfile",
                f"the Kafka broker at {where} requires a client certificate (mutual TLS; {reason}): set "
                f"{setting_hint('ssl_certfile')} and {setting_hint('ssl_keyfile')}",
            )
        return SettingError(
            "ssl_certfile",
            f"the Kafka broker at {where} rejected the client certificate ssl_certfile="
            f"{settings.ssl_certfile!r} ({reason}): use one signed by a CA the broker trusts "
            f"({setting_hint('ssl_certfile')}, {setting_hint('ssl_keyfile')})",
        )
    if any(mark in upper for mark in _NOT_TLS):
        return SettingError(
            "security_protocol",
            f"the Kafka broker at {where} does not speak TLS on this port ({reason}): set "
            f"{setting_hint('security_protocol')} to PLAINTEXT or SASL_PLAINTEXT, or "
            f"{setting_hint('bootstrap_servers')} to its TLS listener",
        )
    return SettingError(
        "security_protocol",
        f"TLS with the Kafka broker at {where} failed ({reason}): check {setting_hint('security_protocol')}, "
        f"{setting_hint('ssl_cafile')}, {setting_hint('ssl_certfile')} and {setting_hint('ssl_keyfile')}",
    )


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc)


def unreachable_at_start(settings: Settings, unreached: list[str]) -> str:
    """The line a worker prints before loading its model when no bootstrap server answered."""
    why = "; ".join(unreached) or "no address"
    return (
        f"Kafka broker {settings.bootstrap_servers} not reachable ({why}); loading the model meanwhile "
        f"and retrying until it answers: check that the broker runs and {setting_hint('bootstrap_servers')}"
    )
