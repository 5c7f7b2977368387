"""`./dev` picks the torch build for the machine: the CPU build from PyTorch's CPU index where there is
no NVIDIA GPU (the package index's Linux torch is the CUDA build, several GB of NVIDIA libraries), the
package index's build on a GPU machine or where the CPU index cannot be reached. `./dev torch-plan`
prints the decision without installing anything; the inputs (GPU present, index reachable) are forced
through the script's own override variables, so every branch runs here."""

from __future__ import annotations

import os
import subprocess
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
    assert _install_plan("demo") == _install_plan("run") == "pip install -e ."
    assert _install_plan("test") == "pip install -e .[test]"
