"""Server-side TLS over asyncio streams through memory BIOs, so that refusals reach the client.

asyncio's own TLS (`start_server(ssl=...)`) drops the connection when a server-side handshake fails
without flushing the alert OpenSSL wrote, so a client refused for a missing or untrusted client
certificate sees a bare end of stream. A Kafka broker sends the alert (`certificate required`,
`unknown ca`), and the worker's diagnosis reads it; this stream sends it too.
"""

from __future__ import annotations

import asyncio
import ssl

_CHUNK = 1 << 16


class TlsStream:
    """One accepted TCP connection, TLS-wrapped as the server side."""

    def __init__(
        self, context: ssl.SSLContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._reader, self._writer = reader, writer

    async def handshake(self) -> None:
        """Complete the handshake; on a refusal, send the alert, then raise the SSLError."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._feed():
                    raise ConnectionResetError("client left during the TLS handshake") from None
                continue
            except ssl.SSLError:
                await self._flush()  # the alert
                raise
            await self._flush()
            return

    async def read(self) -> bytes:
        """Up to 64 KiB of plaintext; b"" at the end of the stream."""
        return await self._read_at_most(_CHUNK)

    async def readexactly(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = await self._read_at_most(size - len(data))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(data), size)
            data += chunk
        return bytes(data)

    async def _read_at_most(self, size: int) -> bytes:
        while True:
            try:
                return self._tls.read(size)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._feed():
                    return b""
            except ssl.SSLZeroReturnError:
                return b""

    async def write(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()

    def close(self) -> None:
        self._writer.close()

    async def _feed(self) -> bool:
        data = await self._reader.read(_CHUNK)
        if not data:
            return False
        self._incoming.write(data)
        return True

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()
