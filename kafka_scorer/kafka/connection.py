"""aiokafka connection options (bootstrap, TLS, SASL) shared by the consumer and the producer.

Kept in one place so both clients, `kafka-scorer submit` and the start-up check
(kafka_scorer/kafka/preflight.py) always talk to the cluster the same way. Settings validation has
already checked that the files exist and that the TLS and SASL fields fit the protocol
(kafka_scorer/config.py); what is left here is what only reading the files can tell — a CA bundle
that holds no certificate, a key that does not match its certificate — and each such failure names
its setting.
"""

from __future__ import annotations

import ssl
from typing import Any

from kafka_scorer.config import Settings
from kafka_scorer.errors import SettingError, setting_hint


def client_options(settings: Settings) -> dict[str, Any]:
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
        # New partitions of a subscribed topic are seen only at a metadata refresh (then the group's
        # leader rejoins and shares them out): aiokafka's 5-minute default left them unread that long.
        "metadata_max_age_ms": settings.metadata_max_age_ms,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = ssl_context(settings)
    if settings.security_protocol.startswith("SASL"):
        password = settings.sasl_password
        options["sasl_mechanism"] = settings.sasl_mechanism
        # aiokafka takes the SCRAM credentials through the same two "plain" arguments.
        options["sasl_plain_username"] = settings.sasl_username
        options["sasl_plain_password"] = password.get_secret_value() if password is not None else None
    return options


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """Server verification against `ssl_cafile` (the system CAs when unset), hostname checked, and the
    client certificate for mutual TLS when `ssl_certfile` is given."""
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=settings.ssl_cafile)
    except ssl.SSLError as exc:
        raise SettingError(
            "ssl_cafile",
            f"ssl_cafile={settings.ssl_cafile!r} holds no usable CA certificate ({_reason(exc)}): give a PEM "
            f"CA bundle ({setting_hint('ssl_cafile')})",
        ) from None
    if settings.ssl_certfile:
        try:
            context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile, password=_no_passphrase)
        except ssl.SSLError as exc:
            raise SettingError(
                "ssl_certfile",
                f"ssl_certfile={settings.ssl_certfile!r} / ssl_keyfile={settings.ssl_keyfile!r} cannot "
                f"be used as a client certificate and key ({_reason(exc)}): give a PEM certificate and "
                f"its own unencrypted key ({setting_hint('ssl_certfile')}, {setting_hint('ssl_keyfile')})",
            ) from None
    return context


def _no_passphrase() -> bytes:
    """Called only for an encrypted key: without it OpenSSL would prompt on the terminal and hang."""
    raise SettingError(
        "ssl_keyfile",
        "ssl_keyfile: the client key is encrypted and there is no passphrase setting; store it "
        "unencrypted with restricted permissions (openssl pkey -in KEY -out PLAIN_KEY)",
    )


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc)


def new_producer(settings: Settings | None, **options: Any) -> Any:
    """An aiokafka producer, not started: on the settings' connection options (the client's sender),
    or on `options` alone (None: the bench's loopback broker, which names its `bootstrap_servers`).

    The aiokafka import happens here, not at module import: `kafka_scorer.client` stays light."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(**_base(settings), **options)


def new_consumer(settings: Settings | None, **options: Any) -> Any:
    """An aiokafka consumer, not started, built like `new_producer` (the client's reply reader)."""
    from aiokafka import AIOKafkaConsumer

    return AIOKafkaConsumer(**_base(settings), **options)


def _base(settings: Settings | None) -> dict[str, Any]:
    return client_options(settings) if settings is not None else {}
