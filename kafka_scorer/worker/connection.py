"""aiokafka connection options (bootstrap, TLS, SASL) shared by the consumer and the producer.

Kept in one place so both clients always talk to the cluster the same way; settings validation has
already checked that the SASL fields come together (kafka_scorer/config.py).
"""

from __future__ import annotations

from typing import Any

from kafka_scorer.config import Settings


def client_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        from aiokafka.helpers import create_ssl_context

        options["ssl_context"] = create_ssl_context(
            cafile=settings.ssl_cafile, certfile=settings.ssl_certfile, keyfile=settings.ssl_keyfile
        )
    if settings.security_protocol.startswith("SASL"):
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = settings.sasl_password
    return options
