"""The broker's side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802), for the TLS/SASL proxy.

No broker runnable here checks SASL credentials: tansu 0.6.0 cannot create SCRAM users once
authentication is required, and noida-db accepts any PLAIN password. So the test proxy verifies them
itself, with the exchanges a Kafka broker runs: a wrong password is refused by the same arithmetic,
not by a flag.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass, field

SCRAM_HASHES: dict[str, Callable[..., hashlib._Hash]] = {
    "SCRAM-SHA-256": hashlib.sha256,
    "SCRAM-SHA-512": hashlib.sha512,
}
MECHANISMS = ("PLAIN", *SCRAM_HASHES)
SCRAM_ITERATIONS = 4096  # Kafka's minimum


class AuthFailed(Exception):
    """The client's credentials or messages were refused; the text goes back as the error message."""


@dataclass
class Step:
    """What the server answers to one client message; `done` once the client is authenticated."""

    reply: bytes
    done: bool


class PlainServer:
    """PLAIN: one message `authzid NUL user NUL password`."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = users

    def step(self, message: bytes) -> Step:
        try:
            _authzid, user, password = message.decode("utf-8").split("\0")
        except ValueError:
            raise AuthFailed("malformed PLAIN message") from None
        expected = self._users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthFailed("Authentication failed: Invalid username or password")
        return Step(b"", done=True)


@dataclass
class ScramServer:
    """SCRAM: client-first -> server-first (nonce, salt, iterations) -> client-final (proof) ->
    server-final (the server's signature, so the client knows the server holds the key too)."""

    users: dict[str, str]
    mechanism: str
    _hash: Callable[..., hashlib._Hash] = field(init=False)
    _state: dict[str, str | bytes] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._hash = SCRAM_HASHES[self.mechanism]

    def step(self, message: bytes) -> Step:
        text = message.decode("utf-8")
        return self._final(text) if self._state else self._first(text)

    def _first(self, text: str) -> Step:
        parts = text.split(",", 2)  # gs2 header "n,," (no channel binding, no authzid), then the bare part
        if len(parts) != 3 or parts[0] not in ("n", "y"):
            raise AuthFailed("malformed SCRAM client-first message")
        bare = parts[2]
        attrs = _attributes(bare)
        user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        if user not in self.users or "r" not in attrs:
            raise AuthFailed("Authentication failed: Invalid username or password")
        salt = os.urandom(16)
        nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={SCRAM_ITERATIONS}"
        digest = self._hash().name
        salted = hashlib.pbkdf2_hmac(digest, self.users[user].encode(), salt, SCRAM_ITERATIONS)
        self._state = {"bare": bare, "server_first": server_first, "nonce": nonce, "salted": salted}
        return Step(server_first.encode(), done=False)

    def _final(self, text: str) -> Step:
        without_proof, _, proof_attr = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        if not proof_attr or attrs.get("r") != self._state["nonce"]:
            raise AuthFailed("malformed SCRAM client-final message")
        auth_message = f"{self._state['bare']},{self._state['server_first']},{without_proof}".encode()
        salted = self._state["salted"]
        assert isinstance(salted, bytes)
        stored = self._hash(self._hmac(salted, b"Client Key")).digest()
        signature = self._hmac(stored, auth_message)
        proof = base64.b64decode(proof_attr)
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        # The client proved it knows the key whose hash the server stores: H(proof XOR signature).
        if len(proof) != len(signature) or not hmac.compare_digest(self._hash(recovered).digest(), stored):
            raise AuthFailed(f"Authentication failed: invalid credentials with {self.mechanism}")
        server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return Step(b"v=" + base64.b64encode(server_signature), done=True)

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


def _attributes(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def server_for(mechanism: str, users: dict[str, str]) -> PlainServer | ScramServer:
    if mechanism == "PLAIN":
        return PlainServer(users)
    return ScramServer(users, mechanism)
