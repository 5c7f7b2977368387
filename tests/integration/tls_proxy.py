"""A TLS (and optionally SASL) terminating proxy in front of the plaintext embedded broker.

tansu 0.6.0 serves no TLS and cannot check SASL credentials, so the tests put this in front of it:
clients do a real TLS handshake with the proxy (server certificate from a test CA, client
certificates verified when mutual TLS is on), then, with SASL, a real Kafka SaslHandshake /
SaslAuthenticate exchange that the proxy answers itself (PLAIN, SCRAM-SHA-256/512:
tests/integration/sasl_server.py). ApiVersions before the handshake goes through to tansu, as
clients expect the broker's versions. Once a client is authenticated the proxy only copies bytes.
The broker advertises the proxy's port (EmbeddedBroker(advertised_port=...)), so metadata and
FindCoordinator answers send clients back through the proxy, never around it.

It runs its own event loop on a thread, so a test may block (subprocess.run) while it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tests.integration.sasl_server import MECHANISMS, AuthFailed, server_for
from tests.integration.tls_material import Pair
from tests.integration.tls_stream import TlsStream

log = logging.getLogger(__name__)

T = TypeVar("T")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 33, 58


@dataclass(frozen=True)
class ProxyConfig:
    server: Pair  # the certificate the proxy presents
    client_ca: Path | None = None  # mutual TLS: client certificates must chain to this CA
    users: dict[str, str] | None = None  # SASL on: user -> password


def server_context(config: ProxyConfig) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(config.server.cert, config.server.key)
    if config.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(config.client_ca)
    return context


# ---- Kafka framing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request frame: its header fields and where its body starts."""

    frame: bytes
    api_key: int
    version: int
    correlation_id: int
    body_at: int


def parse_request(frame: bytes) -> Request:
    """Request header v1 (api key, version, correlation id, client id), plus the tagged fields of
    header v2 for the flexible versions this proxy answers (SaslAuthenticate v2)."""
    api_key, version, correlation_id, client_id_len = struct.unpack_from(">hhih", frame)
    at = 10 + max(client_id_len, 0)
    if api_key == SASL_AUTHENTICATE and version >= 2:
        at = _skip_tagged_fields(frame, at)
    return Request(frame, api_key, version, correlation_id, at)


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _skip_tagged_fields(data: bytes, at: int) -> int:
    count, at = _uvarint(data, at)
    for _ in range(count):
        _tag, at = _uvarint(data, at)
        size, at = _uvarint(data, at)
        at += size
    return at


def _to_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


async def read_frame(reader: asyncio.StreamReader | TlsStream) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def handshake_mechanism(request: Request) -> str:
    (length,) = struct.unpack_from(">h", request.frame, request.body_at)
    start = request.body_at + 2
    return request.frame[start : start + length].decode()


def handshake_response(request: Request, mechanism: str, enabled: list[str]) -> bytes:
    """SaslHandshake v0/v1: error code, then the mechanisms this listener enables."""
    error = 0 if mechanism in enabled else UNSUPPORTED_SASL_MECHANISM
    body = struct.pack(">hi", error, len(enabled)) + b"".join(_string(m) for m in enabled)
    return struct.pack(">i", request.correlation_id) + body


def authenticate_bytes(request: Request) -> bytes:
    data, at = request.frame, request.body_at
    if request.version >= 2:
        length, at = _uvarint(data, at)
        return data[at : at + length - 1]
    (length,) = struct.unpack_from(">i", data, at)
    return data[at + 4 : at + 4 + length]


def authenticate_response(request: Request, error: int, message: str | None, auth: bytes) -> bytes:
    """SaslAuthenticate v0-v2 (v1 adds the session lifetime, v2 is flexible: compact fields, tags)."""
    if request.version >= 2:
        text = b"\x00" if message is None else _to_uvarint(len(message.encode()) + 1) + message.encode()
        body = (
            struct.pack(">h", error)
            + text
            + _to_uvarint(len(auth) + 1)
            + auth
            + struct.pack(">q", 0)
            + b"\x00"
        )
        return struct.pack(">i", request.correlation_id) + b"\x00" + body
    text = struct.pack(">h", -1) if message is None else _string(message)
    body = struct.pack(">h", error) + text + struct.pack(">i", len(auth)) + auth
    if request.version >= 1:
        body += struct.pack(">q", 0)
    return struct.pack(">i", request.correlation_id) + body


# ---- the proxy -----------------------------------------------------------------------------------


class TlsProxy:
    """`with TlsProxy(config, port, upstream_port):` serves 127.0.0.1:`port` until the block ends."""

    def __init__(self, config: ProxyConfig, port: int, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.config = config
        self.host, self.port, self.upstream_port = host, port, upstream_port
        self.enabled = list(MECHANISMS)
        # Refusals seen, so a test can tell that the proxy refused rather than that nothing got through.
        self.refused_handshakes = 0
        self.refused_logins = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._context: ssl.SSLContext | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> None:
        self._context = server_context(self.config)
        self._server = await asyncio.start_server(self._serve, self.host, self.port, reuse_address=True)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        client = TlsStream(self._context, client_r, client_w)
        upstream_w = None
        try:
            await client.handshake()
            upstream_r, upstream_w = await asyncio.open_connection(self.host, self.upstream_port)
            if self.config.users is not None and not await self._authenticate(client, upstream_r, upstream_w):
                return
            await asyncio.gather(_to_broker(client, upstream_w), _to_client(upstream_r, client))
        except ssl.SSLError:
            self.refused_handshakes += 1  # the alert went out; the client reports it
        except (OSError, asyncio.IncompleteReadError):
            pass  # a client or the broker went away: close both sides
        except asyncio.CancelledError:
            pass  # the proxy stops; ending quietly spares asyncio's stream callback a cancelled task
        finally:
            self._tasks.discard(task)
            client.close()
            if upstream_w is not None:
                upstream_w.close()

    async def _authenticate(
        self, client: TlsStream, upstream_r: asyncio.StreamReader, upstream_w: asyncio.StreamWriter
    ) -> bool:
        """Answer the SASL exchange; True once the client is authenticated, False to hang up."""
        assert self.config.users is not None
        authenticator = None
        while True:
            request = parse_request(await read_frame(client))
            if request.api_key == API_VERSIONS:  # the broker's versions, as a real listener gives them
                upstream_w.write(frame(request.frame))
                await client.write(frame(await read_frame(upstream_r)))
            elif request.api_key == SASL_HANDSHAKE:
                mechanism = handshake_mechanism(request)
                await client.write(frame(handshake_response(request, mechanism, self.enabled)))
                authenticator = (
                    server_for(mechanism, self.config.users) if mechanism in self.enabled else None
                )
            elif request.api_key == SASL_AUTHENTICATE and authenticator is not None:
                try:
                    step = authenticator.step(authenticate_bytes(request))
                except AuthFailed as exc:
                    self.refused_logins += 1
                    failed = authenticate_response(request, SASL_AUTHENTICATION_FAILED, str(exc), b"")
                    await client.write(frame(failed))
                    return False  # a Kafka broker closes the connection after a failed login too
                await client.write(frame(authenticate_response(request, 0, None, step.reply)))
                if step.done:
                    return True
            else:  # anything else before authentication: a broker hangs up
                return False


async def _to_broker(client: TlsStream, upstream: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await client.read():
            upstream.write(data)
            await upstream.drain()
    with contextlib.suppress(OSError):
        upstream.write_eof()


async def _to_client(upstream: asyncio.StreamReader, client: TlsStream) -> None:
    with contextlib.suppress(OSError):
        while data := await upstream.read(1 << 16):
            await client.write(data)
    client.close()
