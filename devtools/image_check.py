"""`./dev image-check`: the container image built from the lock and run as a user runs it.

A Dockerfile that nobody builds rots quietly: a base image's pip, a file left out of the build context,
a dependency the lock pins differently, a worker that cannot stop inside a container. This builds the
image (on a stand-in base where `python:3.11-slim` cannot be pulled: image_base.py), runs it with host
networking against the embedded broker started here on 127.0.0.1, sends rerank jobs through
`kafka-scorer submit` as a caller would, and holds every result to the engine's own scores for the same
jobs in this process, then checks /readyz, /metrics and a clean stop on SIGTERM (exit 0, the worker's
`worker stopped cleanly` line). Last, what can be checked of compose/ without its images
(compose_check.py).

Where no Docker engine can start, it skips with one loud line and exits 0, unless
KAFKA_SCORER_REQUIRE_DOCKER=1 (CI's setting) makes that a failure: CI cannot quietly lose this tier.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec

from devtools.compose_check import compose_checks
from devtools.docker_engine import EnginePlan, engine_facts, plan_engine, running_engine
from devtools.image_base import build_standin, choose_base

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "kafka-scorer:image-check"
TEMPLATE = "qwen3-reranker"
REQUEST_TOPIC = "scoring-requests"
REPLY_TOPIC = "scoring-results"
TOLERANCE = 1e-4
"""Absolute, on float32 CPU scores of the same checkpoint: batching and torch builds differ in the
last bits, a wrong model, template or preprocessing differs by far more."""
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60
CLEAN_STOP_LINE = "worker stopped cleanly"
REQUIRE_ENV = "KAFKA_SCORER_REQUIRE_DOCKER"
PYPI = "https://pypi.org/simple"
CPU_INDEX = os.environ.get("KAFKA_SCORER_TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")

QUERIES = (
    "What is the capital of California?",
    "Which passage is about rivers and mountains?",
    "Kafka topics, partitions and consumers: what is an offset?",
    "Is this review positive?",
    "Where do consumers keep their position?",
)
DOCUMENTS = (
    "Sacramento is the capital of California.",
    "Los Angeles is a large city in the south.",
    "The Sacramento River flows from the mountains to the bay.",
    "An offset is the position of a record in a partition.",
    "The food was great and the service was friendly.",
    "Consumers commit offsets to remember how far they read.",
    "San Francisco and San Diego are on the coast.",
)


def say(text: str) -> None:
    print(f"image-check: {text}", file=sys.stderr, flush=True)


def skip(reason: str) -> int:
    """The one loud line; a failure instead where CI requires the tier."""
    if os.environ.get(REQUIRE_ENV) == "1":
        print(f"image-check: FAILED: {reason} ({REQUIRE_ENV}=1)", file=sys.stderr, flush=True)
        return 1
    print(
        f"!!! image-check SKIPPED: {reason}; the image was not built or run !!!", file=sys.stderr, flush=True
    )
    return 0


def rerank_jobs(count: int) -> list[dict[str, object]]:
    """Rerank-shaped jobs (`documents`, `top_n`), each query against a different window of documents."""
    jobs: list[dict[str, object]] = []
    for i in range(count):
        size = 2 + i % 5
        documents = [DOCUMENTS[(i + k) % len(DOCUMENTS)] for k in range(size)]
        jobs.append(
            {"id": f"image-check-{i}", "query": QUERIES[i % len(QUERIES)], "documents": documents, "top_n": 3}
        )
    return jobs


@dataclass(frozen=True)
class Comparison:
    problems: list[str]
    max_difference: float


def compare_results(expected: Sequence[object], received: Sequence[object], tolerance: float) -> Comparison:
    """The container's results against the engine's, by job id: every job answered without error, the
    same checkpoint (model_revision), each score within `tolerance`, the same documents ranked."""
    from kafka_scorer.wire.protocol import Result

    want = {r.id: r for r in expected if isinstance(r, Result)}
    got = {r.id: r for r in received if isinstance(r, Result)}
    problems = [f"{job}: no result from the container" for job in want.keys() - got.keys()]
    problems += [f"{job}: a result for a job never sent" for job in got.keys() - want.keys()]
    worst = 0.0
    for job in sorted(want.keys() & got.keys()):
        a, b = want[job], got[job]
        if a.error is not None or b.error is not None:
            problems.append(f"{job}: error in-process {a.error}, in the container {b.error}")
            continue
        if a.model_revision != b.model_revision:
            problems.append(f"{job}: model_revision {b.model_revision!r}, in-process {a.model_revision!r}")
        flat_a = [x for row in a.scores or [] for x in row]
        flat_b = [x for row in b.scores or [] for x in row]
        if len(flat_a) != len(flat_b):
            problems.append(f"{job}: {len(flat_b)} scores, in-process {len(flat_a)}")
            continue
        difference = max((abs(x - y) for x, y in zip(flat_a, flat_b)), default=0.0)
        worst = max(worst, difference)
        if difference > tolerance:
            problems.append(f"{job}: scores differ by {difference:.3g} (> {tolerance:g})")
        if {r.index for r in a.results or []} != {r.index for r in b.results or []}:
            problems.append(
                f"{job}: top_n documents {[r.index for r in b.results or []]}, in-process "
                f"{[r.index for r in a.results or []]}"
            )
    return Comparison(problems, worst)


def torch_index() -> str:
    """The CPU build's index when it is reachable (the Dockerfile's default), else the package index's
    torch, as `./dev torch-plan` decides for a venv."""
    choice = os.environ.get("KAFKA_SCORER_ASSUME_CPU_INDEX")
    if choice in ("reachable", "unreachable"):
        return CPU_INDEX if choice == "reachable" else PYPI
    try:
        urllib.request.urlopen(CPU_INDEX + "/", timeout=5).close()
    except (OSError, urllib.error.URLError):
        return PYPI
    return CPU_INDEX


def build_image(base: str, index: str, log: Path) -> None:
    """The legacy builder (DOCKER_BUILDKIT=0): it needs no buildx plugin, which neither Debian's docker.io
    nor every client has; `--network host` because the daemon runs without a bridge."""
    command = [
        "docker",
        "build",
        "--network",
        "host",
        "--build-arg",
        f"BASE_IMAGE={base}",
        "--build-arg",
        f"TORCH_INDEX_URL={index}",
        "-t",
        IMAGE,
        str(ROOT),
    ]
    with log.open("wb") as out:
        done = subprocess.run(
            command, stdout=out, stderr=out, env={**os.environ, "DOCKER_BUILDKIT": "0"}, check=False
        )
    if done.returncode:
        raise RuntimeError(f"docker build failed ({done.returncode}); last lines: {tail(log, 15)}")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_mismatches(lock: str, installed: dict[str, str], python: str) -> tuple[int, list[str]]:
    """The lock's pins that apply to the image's Python (markers evaluated for it) against what the
    image holds: (pins checked, mismatches). Pins of packages the image does not install (the test
    extras) are not checked; a local version label (torch's `+cpu`) is not a difference."""
    from packaging.markers import Marker

    environment = {"python_full_version": python, "python_version": ".".join(python.split(".")[:2])}
    checked, problems = 0, []
    for line in lock.splitlines():
        requirement, _, marker = line.partition(";")
        name, sep, version = requirement.strip().partition("==")
        if not sep or line.startswith((" ", "#")):
            continue
        if marker.strip() and not Marker(marker.strip()).evaluate(environment):
            continue
        have = installed.get(normalized(name))
        if have is None:
            continue
        checked += 1
        if have.split("+")[0] != version.strip():
            problems.append(f"{name} {have} in the image, {version.strip()} in the lock")
    return checked, problems


def image_versions(image: str) -> tuple[str, dict[str, str]]:
    """The image's Python version and its installed distributions, asked of the image itself."""
    script = (
        "import importlib.metadata as m, json, platform; print(json.dumps([platform.python_version(), "
        "{d.metadata['Name']: d.version for d in m.distributions()}]))"
    )
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--entrypoint", "python", image, "-c", script],
        capture_output=True,
        text=True,
        check=True,
    )
    python, dists = json.loads(done.stdout)
    return python, {normalized(name): version for name, version in dists.items()}


def check_lock(image: str) -> str:
    lock = ROOT / "constraints/lock.txt"
    if not lock.exists():
        return "no constraints/lock.txt: newest releases installed, none checked"
    python, installed = image_versions(image)
    checked, problems = lock_mismatches(lock.read_text(encoding="utf-8"), installed, python)
    if problems:
        raise RuntimeError("the image does not hold the lock's versions:\n  " + "\n  ".join(problems))
    return f"{checked} installed packages at constraints/lock.txt's versions (Python {python})"


def image_size(image: str) -> int:
    done = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def tail(path: Path, lines: int) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def free_port() -> int:
    from kafka_scorer.embedded.broker import free_port as pick

    return pick("127.0.0.1")


@contextmanager
def worker_container(model_dir: Path, bootstrap: str, metrics_port: int) -> Iterator[str]:
    """The image's default command (`worker`) with host networking, the model mounted read-only as
    compose mounts it; removed after, whatever happened."""
    name = f"kafka-scorer-image-check-{os.getpid()}"
    env = {
        "KAFKA_SCORER_BOOTSTRAP_SERVERS": bootstrap,
        "KAFKA_SCORER_MODEL": "/model",
        "KAFKA_SCORER_TEMPLATE": TEMPLATE,
        "KAFKA_SCORER_DEVICE": "cpu",
        "KAFKA_SCORER_DTYPE": "float32",
        "KAFKA_SCORER_REQUEST_TOPICS": REQUEST_TOPIC,
        "KAFKA_SCORER_REPLY_TOPIC": REPLY_TOPIC,
        "KAFKA_SCORER_GROUP_ID": "kafka-scorer-image-check",
        "KAFKA_SCORER_METRICS_HOST": "127.0.0.1",
        "KAFKA_SCORER_METRICS_PORT": str(metrics_port),
    }
    command = ["docker", "run", "-d", "--name", name, "--network", "host", "-v", f"{model_dir}:/model:ro"]
    command += [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    subprocess.run([*command, IMAGE], capture_output=True, check=True)
    try:
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def container_logs(name: str) -> str:
    done = subprocess.run(["docker", "logs", name], capture_output=True, text=True, check=False)
    return done.stdout + done.stderr


def container_state(name: str) -> tuple[bool, int]:
    done = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name],
        capture_output=True,
        text=True,
        check=True,
    )
    running, code = done.stdout.split()
    return running == "true", int(code)


def wait_ready(name: str, port: int) -> None:
    """/readyz answers 200 once the worker has warmed up and consumes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        running, code = container_state(name)
        if not running:
            raise RuntimeError(
                f"the worker exited with {code} before it was ready:\n{container_logs(name)[-3000:]}"
            )
        with contextlib.suppress(OSError):
            if http_get(port, "/readyz")[0] == 200:
                return
        time.sleep(1)
    raise RuntimeError(f"/readyz not 200 within {READY_TIMEOUT_S:.0f} s:\n{container_logs(name)[-3000:]}")


def submit(jobs_file: Path, out_file: Path, bootstrap: str) -> list[object]:
    """`kafka-scorer submit` on the host, as a caller of the service runs it."""
    from kafka_scorer.wire.protocol import Result

    command = [
        sys.executable,
        "-m",
        "kafka_scorer",
        "submit",
        str(jobs_file),
        "-o",
        str(out_file),
        "--bootstrap-servers",
        bootstrap,
        "--request-topic",
        REQUEST_TOPIC,
        "--reply-topic",
        REPLY_TOPIC,
        "--timeout",
        "180",
        "--no-progress",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"kafka-scorer submit exited {done.returncode}: {done.stderr[-2000:]}")
    return [msgspec.json.decode(line, type=Result) for line in out_file.read_bytes().splitlines() if line]


def in_process(model_dir: Path, jobs: list[dict[str, object]]) -> list[object]:
    """The same jobs scored by the engine in this process: what the container must answer."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.wire.protocol import Job

    scorer = Scorer(str(model_dir), device="cpu", dtype="float32", template=TEMPLATE)
    return list(scorer.score_jobs([msgspec.convert(job, Job) for job in jobs]))


def metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def stop_cleanly(name: str) -> float:
    """SIGTERM as `docker stop` and Kubernetes send it; the worker must drain and exit 0 on its own."""
    started = time.monotonic()
    subprocess.run(["docker", "kill", "--signal", "TERM", name], capture_output=True, check=True)
    try:
        done = subprocess.run(
            ["docker", "wait", name], capture_output=True, text=True, timeout=STOP_TIMEOUT_S, check=True
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the worker did not exit within {STOP_TIMEOUT_S} s of SIGTERM") from None
    code = int(done.stdout.strip())
    logs = container_logs(name)
    if code != 0 or CLEAN_STOP_LINE not in logs:
        raise RuntimeError(
            f"after SIGTERM: exit {code}, {CLEAN_STOP_LINE!r} logged: {CLEAN_STOP_LINE in logs}\n"
            f"{logs[-3000:]}"
        )
    return time.monotonic() - started


def readable_by_all(model_dir: Path) -> None:
    """The image's user (uid 10001) reads the mount: safetensors writes its file 0600, mkdtemp 0700."""
    for path in (model_dir.parent, model_dir):
        path.chmod(0o755)
    for path in model_dir.iterdir():
        path.chmod(0o644)


def serve_and_compare(workdir: Path, count: int) -> None:
    """The container against a broker on the host: jobs in, results equal to the engine's, probes, stop."""
    from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker
    from kafka_scorer.embedded.seeded_broker import AUTO_CREATED_PARTITIONS, SeededBroker

    model_dir = build_tiny_reranker(workdir / "model", seed=0)
    readable_by_all(model_dir)
    jobs = rerank_jobs(count)
    jobs_file = workdir / "jobs.jsonl"
    jobs_file.write_text("".join(json.dumps(job) + "\n" for job in jobs), encoding="utf-8")
    expected = in_process(model_dir, jobs)
    metrics_port = free_port()
    with SeededBroker([REQUEST_TOPIC, REPLY_TOPIC], AUTO_CREATED_PARTITIONS) as broker:
        bootstrap = broker.bootstrap_servers
        with worker_container(model_dir, bootstrap, metrics_port) as name:
            started = time.monotonic()
            wait_ready(name, metrics_port)
            say(f"worker in the container ready: /readyz 200 after {time.monotonic() - started:.0f} s")
            started = time.monotonic()
            received = submit(jobs_file, workdir / "results.jsonl", bootstrap)
            took = time.monotonic() - started
            comparison = compare_results(expected, received, TOLERANCE)
            if comparison.problems:
                raise RuntimeError(
                    "results differ from the engine in-process:\n  " + "\n  ".join(comparison.problems[:20])
                )
            say(
                f"{len(received)} rerank jobs answered through the broker in {took:.1f} s, equal to the "
                f"engine in-process (largest score difference {comparison.max_difference:.2g})"
            )
            check_probes(metrics_port, count)
            say(f"SIGTERM: exit 0 and {CLEAN_STOP_LINE!r} after {stop_cleanly(name):.1f} s")


def check_probes(port: int, count: int) -> None:
    status, _ = http_get(port, "/readyz")
    health, _ = http_get(port, "/healthz")
    code, text = http_get(port, "/metrics")
    jobs = metric(text, "kafka_scorer_jobs_total")
    if status != 200 or health != 200 or code != 200 or jobs is None or jobs < count:
        raise RuntimeError(
            f"probes: /readyz {status}, /healthz {health}, /metrics {code} with "
            f"kafka_scorer_jobs_total {jobs} (want >= {count})"
        )
    say(f"/readyz 200, /healthz 200, /metrics 200 with kafka_scorer_jobs_total {jobs:.0f}")


def report_compose() -> bool:
    ok = True
    for check in compose_checks(ROOT / "compose"):
        if check.ok is None:
            say(f"{check.name}: NOT CHECKED: {check.detail}")
        elif check.ok:
            say(f"{check.name}: ok: {check.detail}")
        else:
            say(f"{check.name}: FAILED: {check.detail}")
            ok = False
    return ok


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev image-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50, metavar="N", help="rerank jobs to send (default 50)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, model, results)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from kafka_scorer.worker.logs import quiet_progress_bars

    args = parse(argv)
    started = time.monotonic()
    quiet_progress_bars()  # before transformers loads: no progress bars between the check's lines
    plan = plan_engine(engine_facts())
    if plan.action == "skip":
        return skip(plan.reason)
    workdir = Path(tempfile.mkdtemp(prefix="kafka-scorer-image-check-"))
    try:
        return run_check(plan, workdir, args.jobs, started)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        say(f"FAILED: {exc}")
        say(f"logs kept in {workdir}")
        args.keep = True
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def run_check(plan: EnginePlan, workdir: Path, count: int, started: float) -> int:
    with running_engine(plan, workdir / "dockerd.log"):
        say(plan.reason)
        base = choose_base()
        if base.action == "skip":
            return skip(base.reason)
        say(base.reason)
        if base.action == "build":
            step = time.monotonic()
            build_standin(base.image, workdir / "standin.log")
            say(f"stand-in {base.image} built in {time.monotonic() - step:.0f} s")
        index = torch_index()
        step = time.monotonic()
        build_image(base.image, index, workdir / "build.log")
        say(
            f"{IMAGE} built in {time.monotonic() - step:.0f} s ({image_size(IMAGE) / 1e9:.2f} GB; "
            f"torch from {index})"
        )
        say(check_lock(IMAGE))
        serve_and_compare(workdir, count)
    compose_ok = report_compose()
    say(f"{'passed' if compose_ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if compose_ok else 1


if __name__ == "__main__":
    sys.exit(main())
