"""`./dev` picks the torch build for the machine: the CPU build from PyTorch's CPU index where there is
no NVIDIA GPU (the package index's Linux torch is the CUDA build, several GB of NVIDIA libraries), the
package index's build on a GPU machine or where the CPU index cannot be reached. `./dev torch-plan`
prints the decision without installing anything; the inputs (GPU present, index reachable) are forced
through the script's own override variables, so every branch runs here. `./dev gpu-check` is the one
command that takes no venv at all (a lent GPU host is bare: its python3 imports the project).
`./dev kafka start|stop|status` runs a real Apache Kafka that outlives the command (on this interpreter
through `KAFKA_SCORER_PYTHON`, so no venv is made here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plan(**env: str) -> list[str]:
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "torch-plan"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_no_gpu_takes_the_cpu_index() -> None:
    reason, first, fallback = _plan(KAFKA_SCORER_ASSUME_GPU="0", KAFKA_SCORER_ASSUME_CPU_INDEX="reachable")
    assert "no NVIDIA GPU" in reason
    assert first.split()[-2:] == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    assert "torch==" in first and "--index-url https://download.pytorch.org/whl/cpu" in fallback


@pytest.mark.parametrize(("gpu", "index"), [("1", "reachable"), ("1", "unreachable"), ("0", "unreachable")])
def test_package_index_otherwise(gpu: str, index: str) -> None:
    reason, first, fallback = _plan(KAFKA_SCORER_ASSUME_GPU=gpu, KAFKA_SCORER_ASSUME_CPU_INDEX=index)
    assert "--index-url" not in first + fallback
    assert ("NVIDIA GPU found" in reason) is (gpu == "1")


def test_unreachable_index_is_probed_quickly() -> None:
    """The probe decides in seconds on a closed network (pip itself would retry per package)."""
    reason, *_ = _plan(KAFKA_SCORER_ASSUME_GPU="0", KAFKA_SCORER_TORCH_CPU_INDEX="http://127.0.0.1:9/none")
    assert "unreachable" in reason


def _install_plan(command: str) -> str:
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "install-plan", command],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_the_demo_installs_the_product_and_only_the_tests_install_the_test_extras() -> None:
    """Issue 26: `./dev demo` put the test extras (2.6 GB: triton, sentence-transformers, a MiniLM wheel,
    testcontainers, ruff) into a user's venv; tests/integration/test_demo.py runs the demo without them."""
    assert _install_plan("demo") == _install_plan("run") == "pip install -c constraints/lock.txt -e ."
    assert _install_plan("test") == "pip install -c constraints/lock.txt -e .[test]"


def test_gpu_check_runs_without_a_venv(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(ROOT / "dev"), "gpu-check", "--dry-run", "--out", str(tmp_path)],
        env={
            **os.environ,
            "KAFKA_SCORER_PYTHON": sys.executable,
            "KAFKA_SCORER_VENV": str(tmp_path / "venv"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.splitlines()[0].startswith("cuda-tier ")
    assert f"tables to {tmp_path}" in done.stdout
    assert not (tmp_path / "venv").exists()


def _dev_kafka(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`./dev kafka ARGS` on this interpreter (no venv made), its broker living in `run_dir`."""
    return subprocess.run(
        ["bash", str(ROOT / "dev"), "kafka", *args],
        env={**os.environ, "KAFKA_SCORER_PYTHON": sys.executable, "KAFKA_SCORER_KAFKA_RUN": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_dev_kafka_status_says_when_no_broker_runs(tmp_path: Path) -> None:
    done = _dev_kafka(tmp_path, "status")
    assert done.returncode == 3 and "not running" in done.stdout, done.stdout + done.stderr
    assert _dev_kafka(tmp_path, "stop").returncode == 0


@pytest.mark.apache_kafka
def test_dev_kafka_starts_a_broker_that_outlives_the_command_and_stops_it(
    tmp_path: Path, apache_kafka_distribution
) -> None:
    """`start` returns with the JVM running and prints the line to export; `status` finds it by its pid,
    a second `start` reuses it, `stop` ends it."""
    started = _dev_kafka(tmp_path, "start")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        export = started.stdout.splitlines()[-1]
        assert export.startswith("export KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:"), started.stdout
        status = _dev_kafka(tmp_path, "status")
        assert status.returncode == 0 and status.stdout.splitlines()[-1] == export
        again = _dev_kafka(tmp_path, "start")
        assert again.stdout.splitlines()[-1] == export and "started in" not in again.stdout
    finally:
        stopped = _dev_kafka(tmp_path, "stop")
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    assert _dev_kafka(tmp_path, "status").returncode == 3
    assert "Kafka Server started" in (tmp_path / "broker.log").read_text()
