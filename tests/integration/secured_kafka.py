"""One Apache Kafka broker with its own TLS, mutual-TLS and SCRAM-SHA-512-over-TLS listeners.

The proxy tests (test_tls.py) prove the client side of TLS and SASL against a Python terminator; this
broker does the handshakes and the credential checks itself, as a production cluster does, so its
refusals are Kafka's own (which alert, when, which SASL error code). One JVM serves all three
listeners, so a test module pays one start (~10 s); the plain listener stays for the runner's probe
and for making topics.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devtools.apache_kafka import ApacheKafka
from devtools.kafka_distribution import KafkaDistribution
from devtools.kafka_properties import Listener
from devtools.kafka_security import ScramUser, scram_properties, ssl_properties, write_pem_keystore
from kafka_scorer.embedded.broker import free_port
from tests.integration.tls_material import TlsMaterial, make_tls_material

SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SecuredKafka:
    """The running broker, the certificates its listeners use, and the one SCRAM user it knows."""

    broker: ApacheKafka
    material: TlsMaterial
    user: ScramUser
    tls: str  # bootstrap of the server-TLS listener
    mtls: str  # bootstrap of the listener that requires a client certificate
    scram: str  # bootstrap of the SASL_SSL listener with SCRAM-SHA-512

    def security(self, mode: str, **overrides: str) -> dict[str, str]:
        """The settings a client needs on the `mode` listener (tls, mtls, scram), then `overrides`."""
        settings = {"security_protocol": "SSL", "ssl_cafile": str(self.material.ca)}
        if mode == "mtls":
            client = self.material.client
            settings |= {"ssl_certfile": str(client.cert), "ssl_keyfile": str(client.key)}
        elif mode == "scram":
            settings |= {"security_protocol": "SASL_SSL", "sasl_mechanism": SCRAM_MECHANISM}
            settings |= {"sasl_username": self.user.name, "sasl_password": self.user.password}
        elif mode != "tls":
            raise ValueError(f"mode must be tls, mtls or scram, not {mode!r}")
        return settings | overrides

    def bootstrap(self, mode: str) -> str:
        return {"tls": self.tls, "mtls": self.mtls, "scram": self.scram}[mode]


def _listeners(material: TlsMaterial, keystore: Path) -> tuple[tuple[Listener, ...], dict[str, str]]:
    tls = Listener("SSL", "SSL", free_port())
    mtls = Listener("MTLS", "SSL", free_port())  # a name of its own: its properties differ from SSL's
    scram = Listener("SASL_SSL", "SASL_SSL", free_port())
    properties = {
        **ssl_properties(tls.name, keystore),
        **ssl_properties(mtls.name, keystore, truststore=material.ca, client_auth="required"),
        **ssl_properties(scram.name, keystore),
        **scram_properties(scram.name, (SCRAM_MECHANISM,)),
    }
    return (tls, mtls, scram), properties


@contextlib.contextmanager
def secured_kafka(
    directory: Path, user: ScramUser, distribution: KafkaDistribution
) -> Iterator[SecuredKafka]:
    """Certificates made in `directory`, a broker started with them, stopped and removed on exit."""
    material = make_tls_material(directory)
    server = material.server
    keystore = write_pem_keystore(server.cert, server.key, directory / "broker-keystore.pem")
    listeners, properties = _listeners(material, keystore)
    broker = ApacheKafka(distribution, listeners=listeners, extra=properties, scram_users=(user,))
    with broker:
        tls, mtls, scram = (f"{lst.host}:{lst.port}" for lst in listeners)
        yield SecuredKafka(broker, material, user, tls=tls, mtls=mtls, scram=scram)
