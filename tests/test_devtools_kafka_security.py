"""The runner's security properties and SCRAM arguments, without starting a broker (the integration
test in tests/integration/test_kafka_security.py starts one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.kafka_security import SCRAM_LOGIN, ScramUser, scram_properties, ssl_properties


def test_scram_user_is_one_add_scram_argument() -> None:
    user = ScramUser("alice", "alice-secret")
    assert user.format_argument() == "SCRAM-SHA-512=[name=alice,password=alice-secret]"


@pytest.mark.parametrize("password", ["a,b", "a=b", "a]b", 'a"b', "a b"])
def test_scram_user_refuses_what_the_storage_tool_would_split(password: str) -> None:
    with pytest.raises(ValueError, match="password"):
        ScramUser("alice", password)


def test_mutual_tls_properties_are_per_listener_and_pem() -> None:
    props = ssl_properties("MTLS", Path("/k.pem"), Path("/ca.pem"), client_auth="required")
    assert props == {
        "listener.name.mtls.ssl.keystore.type": "PEM",
        "listener.name.mtls.ssl.keystore.location": "/k.pem",
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.type": "PEM",
        "listener.name.mtls.ssl.truststore.location": "/ca.pem",
    }
    with pytest.raises(ValueError, match="truststore"):
        ssl_properties("MTLS", Path("/k.pem"), client_auth="required")


def test_scram_properties_enable_each_mechanism_with_its_login_module() -> None:
    assert scram_properties("SASL_SSL", ("SCRAM-SHA-512",)) == {
        "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM_LOGIN,
    }
