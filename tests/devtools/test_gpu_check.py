"""`./dev gpu-check` without a GPU: the plan it would run, a step that hangs is killed with its children
and the rest goes on, and two real steps at CPU size write the tables, the JSON and the logs."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tarfile
import time
from pathlib import Path

import pytest

from devtools.gpu_check import run as gpu_check
from devtools.gpu_check.run import Outcome, Step, main, run_step


def test_dry_run_lists_every_gpu_step_within_the_budget(capsys) -> None:
    assert main(["--dry-run", "--out", "somewhere"]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = {line.split(" ", 1)[0]: line for line in lines[:-1]}
    assert list(steps) == [
        "cuda-tier",
        "label-kernel",
        "open-loop",
        "graphs",
        "profile",
        "attention",
        "open-loop-best",
        "bench-0.6b",
        "floor-8b",
        "deterministic",
        "fixed-matmul",
    ]
    assert "-m pytest" in steps["cuda-tier"] and "-m cuda tests/cuda_tests" in steps["cuda-tier"]
    assert "--device cuda" in steps["label-kernel"]
    assert "--workload open-loop" in steps["open-loop"] and "qwen3-0.6b" in steps["open-loop"]
    assert "--workload rerank --workload many-items" in steps["bench-0.6b"]
    assert "--backend flex --backend cascade --backend spans --backend varlen" in steps["bench-0.6b"]
    assert "kafka_scorer_bench.graphs --device cuda --model-shape qwen3-0.6b" in steps["graphs"]
    assert "qwen3-8b" in steps["floor-8b"] and "--workload many-items" in steps["floor-8b"]
    assert "kafka_scorer_bench.attention --device cuda --model-shape qwen3-0.6b" in steps["attention"]
    assert "--attention-json" in steps["open-loop-best"] and "--workload open-loop" in steps["open-loop-best"]
    assert "kafka_scorer_bench.deterministic --device cuda --model-shape qwen3-0.6b" in steps["deterministic"]
    assert "kafka_scorer_bench.fixed_matmul --device cuda --model-shape qwen3-0.6b" in steps["fixed-matmul"]
    assert lines[-1] == "budget 480 s in all; tables to somewhere"


def test_steps_run_in_the_order_asked(capsys) -> None:
    """A session's device time may end before the check does: the decisive steps go first."""
    assert main(["--dry-run", "--steps", "attention,cuda-tier,graphs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines[:-1]] == ["attention", "cuda-tier", "graphs"]


def test_unknown_step_is_named_with_the_known_ones(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--dry-run", "--steps", "cuda-tier,warp-drive"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "warp-drive" in err and "floor-8b" in err


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie waits for init to reap it: it runs no more


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_hanging_step_is_killed_with_its_children(tmp_path: Path) -> None:
    """The step starts a grandchild (as a bench starts a worker and a broker) and both hang: after the
    step's timeout the whole process group is gone, and the outcome says so."""
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    started = time.monotonic()
    outcome = run_step(Step("hang", "hangs", ["-c", code], timeout_s=2), tmp_path, remaining_s=100)
    assert outcome.status == "timeout" and "killed after 2 s" in outcome.note
    assert time.monotonic() - started < 30
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(grandchild)


def test_a_step_is_not_started_without_time_left(tmp_path: Path) -> None:
    outcome = run_step(Step("late", "late", ["-c", "pass"], timeout_s=60), tmp_path, remaining_s=5)
    assert outcome.status == "skipped" and "out of time" in outcome.note


def test_tiny_check_writes_the_tables_json_and_logs(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    rc = main(["--tiny", "--steps", "cuda-tier,label-kernel", "--out", str(out), "--work-dir", str(work)])
    assert rc == 0
    assert sorted(os.listdir(out)) == ["gpu-check-logs.tar.gz", "gpu-check.json", "gpu-check.md"]
    report = json.loads((out / "gpu-check.json").read_text())
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["cuda-tier"]["status"] == "ok" and "passed" in steps["cuda-tier"]["summary"]
    kernel = steps["label-kernel"]
    assert kernel["status"] == "ok" and kernel["report"]["shape"]["rows"] == 16
    markdown = (out / "gpu-check.md").read_text()
    assert f"transformers {importlib.metadata.version('transformers')}, triton " in markdown
    assert "## CUDA tier" in markdown and "## Label kernel" in markdown
    assert "| cuda-tier | ok |" in markdown and "| label-kernel | ok |" in markdown
    assert "vs log_softmax" in markdown  # the step's figure in its status line
    with tarfile.open(out / "gpu-check-logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["cuda-tier.log", "label-kernel.log"]


def test_a_check_stopped_from_outside_keeps_its_finished_steps(tmp_path: Path, monkeypatch) -> None:
    """The device's own time limit may end the whole check mid-step: what finished is already written,
    and the files name the step it stopped in; a log an earlier call left is not passed off as this one's."""
    out, work = tmp_path / "out", tmp_path / "work"
    work.mkdir()
    (work / "open-loop.log").write_text("from an earlier call")

    def first_step_then_stopped(step: Step, work: Path, remaining_s: float) -> Outcome:
        if step.name != "cuda-tier":
            raise KeyboardInterrupt  # stands for the kill: nothing after this line runs
        (work / "cuda-tier.log").write_text("3 passed")
        return Outcome("cuda-tier", "ok", 1.0, 0, summary="3 passed")

    monkeypatch.setattr(gpu_check, "run_step", first_step_then_stopped)
    with pytest.raises(KeyboardInterrupt):
        main(["--tiny", "--steps", "cuda-tier,label-kernel", "--out", str(out), "--work-dir", str(work)])
    markdown = (out / "gpu-check.md").read_text()
    assert "| cuda-tier | ok |" in markdown and "3 passed" in markdown
    assert "| label-kernel | running |" in markdown and "stopped during this step" in markdown
    steps = json.loads((out / "gpu-check.json").read_text())["steps"]
    assert [(s["name"], s["status"]) for s in steps] == [("cuda-tier", "ok"), ("label-kernel", "running")]
    with tarfile.open(out / "gpu-check-logs.tar.gz") as tar:
        assert tar.getnames() == ["cuda-tier.log"]


def test_a_report_from_an_earlier_run_is_not_taken_for_this_ones(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text('{"stale": true}')
    outcome = run_step(Step("quiet", "writes nothing", ["-c", "pass"], 60, "r.json"), tmp_path, 100)
    assert outcome.status == "ok" and outcome.report is None


def test_a_checkpoint_half_written_by_a_killed_step_is_removed(tmp_path: Path) -> None:
    """Killed while writing a model, the step leaves no folder that a later run would load as whole;
    the checkpoints finished before it stay."""
    old = tmp_path / "models" / "finished"
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    half = tmp_path / "models" / "half"
    config = str(half / "config.json")
    code = f"import os, time; os.makedirs({str(half)!r}); open({config!r}, 'w'); time.sleep(60)"
    outcome = run_step(Step("build", "builds", ["-c", code], timeout_s=3), tmp_path, remaining_s=100)
    assert outcome.status == "timeout"
    assert not half.exists() and (old / "config.json").exists()


def test_a_step_killed_at_its_limit_keeps_the_report_it_had_written(tmp_path: Path) -> None:
    """A bench rewrites its report after each workload: killed during the next one, the step keeps the
    report of the finished ones. Half a JSON file (a step killed while writing its own) is no report."""
    report = tmp_path / "r.json"

    def step_writing(text: str) -> Step:
        code = f"import time; open({str(report)!r}, 'w').write({text!r}); time.sleep(60)"
        return Step("bench", "benches", ["-c", code], timeout_s=3, report="r.json")

    outcome = run_step(step_writing('{"partial": true, "workloads": {"rerank": {}}}'), tmp_path, 100)
    assert outcome.status == "timeout" and outcome.report == {"partial": True, "workloads": {"rerank": {}}}
    outcome = run_step(step_writing('{"partial": tr'), tmp_path, 100)
    assert outcome.status == "timeout" and outcome.report is None
