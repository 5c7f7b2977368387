"""A CPU worker's process never imports triton (issue 26): transformers' model modules pull in
torch._dynamo, which imported it just to see it is installed, and triton's nanobind bindings then
reported ~30 leaked objects at every exit. Run in a child process: the mark is process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli.helpers import cli_env

CHILD = """
import sys
from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu
marked = {mark}
if marked:
    assert keep_triton_out_on_cpu("cpu")
import transformers.models.qwen3.modeling_qwen3  # what loading a Qwen3 checkpoint imports
print("triton" in sys.modules and sys.modules["triton"] is not None)
"""


def _child(mark: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD.format(mark=mark)],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finished(child: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = child.communicate(timeout=120)
    finally:
        child.kill()  # a no-op once it exited; an import hung past the timeout goes too
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def test_a_cpu_process_loads_transformers_models_without_triton_and_exits_quietly() -> None:
    pytest.importorskip("triton")  # where triton is not installed there is nothing to keep out
    children = _child(mark=False), _child(mark=True)  # side by side: each is mostly one import
    unmarked, marked = (_finished(child) for child in children)
    assert unmarked.stdout.strip() == "True", "torch._dynamo no longer imports triton: drop no_triton.py"
    assert marked.returncode == 0, marked.stderr
    assert marked.stdout.strip() == "False"
    assert "leaked" not in marked.stderr and "nanobind" not in marked.stderr, marked.stderr


def test_nothing_is_marked_for_a_gpu_or_a_bad_device(monkeypatch) -> None:
    import kafka_scorer.engine.load.transformers_parts as model
    from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu
    from kafka_scorer.errors import SettingError

    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setattr(model, "resolve_device", lambda device: model.torch.device("cuda"))
    assert keep_triton_out_on_cpu("auto") is False and "triton" not in sys.modules

    def refuse(device: str):
        raise SettingError("device", "no such device")

    monkeypatch.setattr(model, "resolve_device", refuse)
    assert keep_triton_out_on_cpu("tpu") is False and "triton" not in sys.modules


def test_nothing_is_marked_where_triton_s_interpreter_is_asked_for(monkeypatch) -> None:
    """TRITON_INTERPRET=1 asks for the kernels on the CPU (as the kernel tests run them): keep triton."""
    from kafka_scorer.cli.no_triton import keep_triton_out_on_cpu

    monkeypatch.delitem(sys.modules, "triton", raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert keep_triton_out_on_cpu("cpu") is False and "triton" not in sys.modules


def test_a_cpu_bench_exits_without_triton_s_leak_report() -> None:
    """`kafka-scorer bench` on the CPU printed ~60 nanobind "leaked" lines after its report."""
    pytest.importorskip("triton")
    args = ["--quick", "--workload", "short", "--skip-worker", "--skip-label-kernel", "--jobs", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "kafka_scorer", "bench", "--device", "cpu", *args, "--repeats", "1"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cross-check vs (c)" in done.stdout
    assert "leaked" not in done.stderr and "nanobind" not in done.stderr, done.stderr[-3000:]
