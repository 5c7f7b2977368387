"""The compose stack and the Dockerfile, checked by parsing: CI has no Docker engine.

What a `docker compose up` would trip over first is checked here: a `depends_on` naming a missing
service, an image that is neither official nor built from this repo, a `KAFKA_SCORER_*` variable the
settings model does not know (pydantic-settings would ignore it silently), a Prometheus target that
scrapes the wrong port, a mounted file that is not in the repo.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kafka_scorer.config import Settings
from kafka_scorer.config_docs import env_var

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

OFFICIAL_IMAGES = {"apache/kafka", "prom/prometheus", "grafana/grafana"}
SETTINGS_ENV = {env_var(name): name for name in Settings.model_fields}
_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}|\$(?P<bare>\w+)")


def interpolate(text: str) -> str:
    """Compose's `${VAR:-default}` with nothing set in the environment; `$$` is a literal `$`."""
    parts = text.split("$$")

    def sub(match: re.Match[str]) -> str:
        return match.group("default") or "" if match.group("op") in (":-", "-") else ""

    return "$".join(_INTERPOLATION.sub(sub, part) for part in parts)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process environment; one set on the CI host must not leak in."""
    for key in [k for k in os.environ if k.upper().startswith("KAFKA_SCORER_")]:
        monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: interpolate(str(value)) for key, value in env.items()}


def _worker_services(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in services.items() if "build" in svc}


def _metrics_port(service: dict[str, Any]) -> int:
    value = _env(service).get(env_var("metrics_port"))
    return int(value) if value is not None else Settings.model_fields["metrics_port"].default


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    instructions = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            instructions.append((keyword.upper(), rest.strip()))
    return instructions


def test_interpolation_helper() -> None:
    assert interpolate("${A:-x}.DLT ${B-y} ${C} $$1 $D") == "x.DLT y  $1 "


def test_every_interpolated_variable_has_a_default() -> None:
    """`docker compose up` must work with no compose/.env file at all."""
    text = COMPOSE_FILE.read_text(encoding="utf-8").replace("$$", "")
    for match in _INTERPOLATION.finditer(text):
        assert match.group("op") in (":-", "-"), f"{match.group(0)} has no default"


def test_depends_on_names_existing_services(services: dict[str, dict[str, Any]]) -> None:
    seen = 0
    for name, svc in services.items():
        for dep in svc.get("depends_on") or []:
            seen += 1
            assert dep in services, f"{name} depends on unknown service {dep!r}"
            assert dep != name
    assert seen >= 3


def test_images_are_official_or_built_from_this_repo(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        if "build" in svc:
            build = svc["build"] if isinstance(svc["build"], dict) else {"context": svc["build"]}
            context = (COMPOSE_DIR / build["context"]).resolve()
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            assert dockerfile == DOCKERFILE and dockerfile.is_file(), f"{name}: builds from {dockerfile}"
            continue
        image = interpolate(svc["image"])
        repo, _, tag = image.partition(":")
        assert repo in OFFICIAL_IMAGES, f"{name}: image {image!r} is not an allowed official image"
        assert tag and tag != "latest", f"{name}: pin the image tag ({image!r})"


def test_kafka_runs_in_kraft_mode_with_container_and_host_listeners(
    services: dict[str, dict[str, Any]],
) -> None:
    env = _env(services["kafka"])
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    hosts = {addr.rsplit(":", 1)[0] for addr in advertised.values()}
    assert hosts == {"kafka", "localhost"}
    host_port = advertised[next(k for k, v in advertised.items() if v.startswith("localhost:"))].rsplit(":")[
        1
    ]
    assert any(str(p).split(":")[0] == host_port for p in services["kafka"]["ports"])
    internal = next(v for v in advertised.values() if v.startswith("kafka:"))
    for name, svc in _worker_services(services).items():
        assert _env(svc)[env_var("bootstrap_servers")] == internal, f"{name} must use the container listener"


def test_worker_settings_are_real_and_valid(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker's environment, fed to the real settings model, must validate and take effect."""
    workers = _worker_services(services)
    assert {"worker", "worker-gpu"} <= set(workers)
    monkeypatch.chdir(COMPOSE_DIR)  # no stray .env file from the repo root
    for name, svc in workers.items():
        env = _env(svc)
        assert env.get(env_var("model")) and env.get(env_var("bootstrap_servers")), name
        unknown = {key for key in env if key.startswith("KAFKA_SCORER_")} - set(SETTINGS_ENV)
        assert not unknown, f"{name}: not settings in kafka_scorer/config.py: {sorted(unknown)}"
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            settings = Settings()
        for key, value in env.items():
            if key in SETTINGS_ENV:
                got = getattr(settings, SETTINGS_ENV[key])
                shown = ",".join(got) if isinstance(got, list) else str(got)
                assert shown == value, f"{name}: {key}={value!r} parsed as {got!r}"


def test_every_kafka_scorer_variable_anywhere_is_a_setting() -> None:
    """Also catches variables in comments, interpolations and the Dockerfile."""
    for path in (COMPOSE_FILE, DOCKERFILE, COMPOSE_DIR / "prometheus.yml"):
        for var in re.findall(r"KAFKA_SCORER_\w+", path.read_text(encoding="utf-8")):
            if var != "KAFKA_SCORER_":
                assert var in SETTINGS_ENV, f"{path.name}: {var} is not a field of Settings"


def test_topic_creator_creates_the_workers_topics_and_gates_them(services: dict[str, dict[str, Any]]) -> None:
    creator = services["topics"]
    assert interpolate(creator["image"]).partition(":")[0] == "apache/kafka"
    assert creator["depends_on"]["kafka"]["condition"] == "service_healthy"
    script = interpolate(" ".join(creator.get("entrypoint", [])) + " " + " ".join(creator["command"]))
    assert "kafka-topics.sh" in script and "--create" in script and "--if-not-exists" in script
    words = set(shlex.split(script.replace("\\\n", " "), comments=False))
    for name, svc in _worker_services(services).items():
        env = _env(svc)
        request_topics = env[env_var("request_topics")].split(",")
        wanted = [*request_topics, env[env_var("reply_topic")]]
        wanted += [env.get(env_var("dead_letter_topic")) or f"{t}.DLT" for t in request_topics]
        for topic in wanted:
            assert topic in words, f"{name} uses topic {topic!r} that the topics service does not create"
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert svc["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_gpu_worker_is_a_profile_with_an_nvidia_reservation(services: dict[str, dict[str, Any]]) -> None:
    cpu, gpu = services["worker"], services["worker-gpu"]
    assert "profiles" not in cpu, "the CPU worker is the default"
    assert "deploy" not in cpu
    assert _env(cpu)[env_var("device")] == "cpu"
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert _env(gpu)[env_var("device")].startswith("cuda")
    assert "cu" in gpu["build"]["args"]["TORCH_INDEX_URL"].rsplit("/", 1)[1]


def test_workers_stop_grace_exceeds_the_workers_own_grace(services: dict[str, dict[str, Any]]) -> None:
    """Docker's SIGKILL must not cut the worker's drain short (SPEC §7: no committed unanswered work)."""
    for name, svc in _worker_services(services).items():
        grace = _env(svc).get(env_var("shutdown_grace_s"), Settings.model_fields["shutdown_grace_s"].default)
        stop = svc["stop_grace_period"]
        assert stop.endswith("s") and float(stop[:-1]) > float(grace), name


def test_prometheus_scrapes_worker_services_on_their_metrics_port(
    services: dict[str, dict[str, Any]],
) -> None:
    mounts = [
        v for v in services["prometheus"]["volumes"] if v.split(":")[1] == "/etc/prometheus/prometheus.yml"
    ]
    assert len(mounts) == 1
    config = yaml.safe_load((COMPOSE_DIR / mounts[0].split(":")[0]).read_text(encoding="utf-8"))
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert targets
    scraped = set()
    for target in targets:
        host, port = target.rsplit(":", 1)
        assert host in services, f"scrape target {target} is not a compose service"
        assert int(port) == _metrics_port(services[host]), (
            f"{target}: the worker listens on {_metrics_port(services[host])}"
        )
        scraped.add(host)
    assert set(_worker_services(services)) <= scraped


def test_worker_ports_and_healthcheck_use_the_metrics_port(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in _worker_services(services).items():
        port = _metrics_port(svc)
        assert any(str(p).rsplit(":", 1)[-1] == str(port) for p in svc["ports"]), name
        assert f":{port}/" in " ".join(svc["healthcheck"]["test"]), name


async def test_worker_healthcheck_path_is_served_by_the_probe_server(
    services: dict[str, dict[str, Any]],
) -> None:
    """Start the worker's real probe server and request the path the compose healthcheck uses."""
    from kafka_scorer.worker.metrics import ProbeServer, Readiness, WorkerMetrics

    paths = set()
    for svc in _worker_services(services).values():
        (url,) = re.findall(r"http://[^'\"]+", " ".join(svc["healthcheck"]["test"]))
        paths.add(urlsplit(url).path)
    ready = Readiness()
    ready.follow(lambda: None, lambda: True)
    server = ProbeServer(WorkerMetrics(), ready, "127.0.0.1", 0)
    await server.start()
    try:
        for path in paths:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            status = (await reader.readline()).decode()
            writer.close()
            assert status.split()[1] == "200", f"healthcheck path {path}: {status.strip()}"
    finally:
        await server.stop()


def test_mounted_paths_exist_and_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    checked = 0
    for name, svc in compose["services"].items():
        for volume in svc.get("volumes") or []:
            source = interpolate(volume).split(":")[0]
            if source.startswith((".", "/")):
                assert (COMPOSE_DIR / source).exists(), f"{name}: {source} does not exist in the repo"
                checked += 1
            else:
                assert source in declared, f"{name}: named volume {source!r} is not declared"
    assert checked >= 2


def test_dockerfile_builds_a_non_root_worker_image() -> None:
    instructions = _dockerfile_instructions()
    keywords = [k for k, _ in instructions]
    # the base is an argument (`./dev image-check` builds on a stand-in where no registry is reached),
    # python:3.11-slim by default
    assert instructions[keywords.index("FROM")][1] == "${BASE_IMAGE}"
    assert ("ARG", "BASE_IMAGE=python:3.11-slim") in instructions[: keywords.index("FROM")]
    args = {rest.split("=")[0] for k, rest in instructions if k == "ARG"}
    assert "TORCH_INDEX_URL" in args
    assert any("download.pytorch.org/whl/cpu" in rest for k, rest in instructions if k == "ARG")
    users = [rest for k, rest in instructions if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    assert json.loads(instructions[keywords.index("ENTRYPOINT")][1]) == ["kafka-scorer"]
    assert json.loads(instructions[keywords.index("CMD")][1]) == ["worker"]
    exposed = {int(p.split("/")[0]) for k, rest in instructions if k == "EXPOSE" for p in rest.split()}
    assert Settings.model_fields["metrics_port"].default in exposed
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^kafka-scorer = "kafka_scorer\.cli:main"$', pyproject, re.MULTILINE), (
        "no console script"
    )


def test_model_cache_volume_is_where_the_image_keeps_it(services: dict[str, dict[str, Any]]) -> None:
    """A hub model downloaded once must survive a container restart: the volume must cover HF_HOME."""
    env_lines = [rest for keyword, rest in _dockerfile_instructions() if keyword == "ENV"]
    (hf_home,) = re.findall(r"HF_HOME=(\S+)", " ".join(env_lines))
    for name, svc in _worker_services(services).items():
        targets = [interpolate(v).split(":")[1] for v in svc["volumes"]]
        assert hf_home in targets, f"{name}: no volume at HF_HOME={hf_home}"
        assert "/model" in targets and _env(svc)[env_var("model")] == "/model"


def test_dockerfile_copies_only_files_that_exist_and_are_not_ignored() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    sources = []
    for keyword, rest in _dockerfile_instructions():
        if keyword in ("COPY", "ADD") and "--from" not in rest:
            sources += [s for s in rest.split() if not s.startswith("--")][:-1]
    assert "pyproject.toml" in sources and "kafka_scorer" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which is not in the repo"
        assert not any(fnmatch.fnmatch(source, pattern) for pattern in ignored), (
            f".dockerignore drops {source}"
        )
