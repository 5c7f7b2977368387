"""The Kubernetes manifests in docs/scaling.md parse, use only settings that exist, and the KEDA scaler
watches the worker's own group and topic: a renamed setting or a copy-paste slip fails here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kafka_scorer.config import Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "scaling.md"


def _manifests() -> dict[str, dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    docs = [yaml.safe_load(block) for block in blocks]
    return {doc["kind"]: doc for doc in docs}


def _env(deployment: dict) -> dict[str, str | None]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_every_environment_variable_is_a_setting() -> None:
    env = _env(_manifests()["Deployment"])
    names = {name.removeprefix("KAFKA_SCORER_").lower() for name in env}
    assert names <= set(Settings.model_fields), names - set(Settings.model_fields)


def test_the_settings_validate_together() -> None:
    env = {
        name.removeprefix("KAFKA_SCORER_").lower(): value if value is not None else "from-a-secret"
        for name, value in _env(_manifests()["Deployment"]).items()
    }
    Settings(_env_file=None, **env)  # type: ignore[arg-type]


def test_keda_watches_the_workers_group_and_topic() -> None:
    manifests = _manifests()
    env = _env(manifests["Deployment"])
    trigger = manifests["ScaledObject"]["spec"]["triggers"][0]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["consumerGroup"] == env["KAFKA_SCORER_GROUP_ID"]
    assert trigger["metadata"]["topic"] == env["KAFKA_SCORER_REQUEST_TOPICS"]
    assert trigger["metadata"]["bootstrapServers"] == env["KAFKA_SCORER_BOOTSTRAP_SERVERS"]
    assert (
        manifests["ScaledObject"]["spec"]["scaleTargetRef"]["name"]
        == manifests["Deployment"]["metadata"]["name"]
    )


def test_pods_outlive_the_drain_and_probe_the_real_endpoints() -> None:
    deployment = _manifests()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    grace = float(_env(deployment)["KAFKA_SCORER_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > grace
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
