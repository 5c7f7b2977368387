"""TLS, mutual TLS and SASL/SCRAM on an Apache Kafka listener, configured from PEM files.

The security is the broker's own: Kafka 4.x reads PEM key and trust stores (`ssl.keystore.type=PEM`,
KIP-651), so the certificates a test makes with `cryptography` serve as they are, with no keytool or
JKS step. Each listener gets its own `listener.name.<name>.` properties, so one broker can offer a
TLS, a mutual-TLS and a SCRAM listener side by side (one JVM for a whole test module). SCRAM users on
KRaft exist from the start only if the storage format writes them (KIP-900, `--add-scram`): see
`ScramUser` and `ApacheKafka(scram_users=...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
_UNSAFE_IN_SCRAM_ARGUMENT = set(',[]="= \n')


@dataclass(frozen=True)
class ScramUser:
    """A SCRAM credential written into the log at format time (`kafka-storage.sh format --add-scram`)."""

    name: str
    password: str
    mechanism: str = "SCRAM-SHA-512"

    def __post_init__(self) -> None:
        # The tool splits its argument on ',', '=' and brackets: such a character would silently make
        # another user or password than the test meant, so it is refused here instead.
        for field_name in ("name", "password"):
            if _UNSAFE_IN_SCRAM_ARGUMENT & set(getattr(self, field_name)):
                raise ValueError(f'ScramUser.{field_name} must not contain any of , [ ] = " or spaces')

    def format_argument(self) -> str:
        """The value of one `--add-scram` option, e.g. `SCRAM-SHA-512=[name=alice,password=secret]`."""
        return f"{self.mechanism}=[name={self.name},password={self.password}]"


def write_pem_keystore(cert: Path, key: Path, into: Path) -> Path:
    """One file with the unencrypted PKCS#8 private key and then the certificate chain: what Kafka's
    `ssl.keystore.type=PEM` reads from `ssl.keystore.location`."""
    into.write_text(key.read_text() + cert.read_text())
    return into


def _prefix(listener_name: str) -> str:
    return f"listener.name.{listener_name.lower()}."


def ssl_properties(
    listener_name: str, keystore: Path, truststore: Path | None = None, client_auth: str = "none"
) -> dict[str, str]:
    """Server TLS on one listener from a PEM keystore (`write_pem_keystore`); with
    `client_auth="required"` and the CA in `truststore`, mutual TLS."""
    if client_auth not in ("none", "requested", "required"):
        raise ValueError(f"client_auth must be none, requested or required, not {client_auth!r}")
    if client_auth != "none" and truststore is None:
        raise ValueError("client certificates need a truststore holding the CA that signs them")
    prefix = _prefix(listener_name)
    properties = {
        f"{prefix}ssl.keystore.type": "PEM",
        f"{prefix}ssl.keystore.location": str(keystore),
        f"{prefix}ssl.client.auth": client_auth,
    }
    if truststore is not None:
        properties[f"{prefix}ssl.truststore.type"] = "PEM"
        properties[f"{prefix}ssl.truststore.location"] = str(truststore)
    return properties


def scram_properties(listener_name: str, mechanisms: tuple[str, ...] = ("SCRAM-SHA-512",)) -> dict[str, str]:
    """SASL/SCRAM on one listener (SASL_PLAINTEXT or SASL_SSL), checked against the users in the
    cluster's metadata; the listener's TLS, if any, comes from `ssl_properties`."""
    prefix = _prefix(listener_name)
    properties = {f"{prefix}sasl.enabled.mechanisms": ",".join(mechanisms)}
    for mechanism in mechanisms:
        properties[f"{prefix}{mechanism.lower()}.sasl.jaas.config"] = SCRAM_LOGIN
    return properties
