"""`./dev gpu-check`: the CUDA tier and the GPU benches in one call, within a fixed time, tables out.

A GPU is lent rarely and briefly, so what must run on one runs from one command: the CUDA tests
(`pytest -m cuda tests/cuda_tests`), the label-kernel micro-benchmark at the issue's shape, the 0.6B Qwen3
shape's rerank and many-items workloads (every contender), the open-loop latency table, and the 8B
shape's many-items floor fraction. Each step is its own process in its own process group with its own
timeout, cut further so the whole stays within `--budget-s`: a step that hangs is killed with its
children (a bench's worker and broker too) and the next one still runs.

It needs no virtual environment, only an interpreter that imports the project (on a bare GPU host,
PYTHONPATH pointing at the checkout and the wheels it lacks). What it leaves in `--out`: `gpu-check.md`
(every table, as docs/performance.md shows them), `gpu-check.json` (each step's status and full JSON
report) and `gpu-check-logs.tar.gz` (each step's output). Checkpoints and per-step files stay in
`--work-dir`, so a second run reuses the generated models. `--dry-run` prints the steps and runs
nothing; `--tiny` runs the same steps at CPU test size (what tests/bench/test_gpu_check.py does).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.gpu_check.plan import Step, plan_steps
from devtools.gpu_check.tables import step_markdown, step_summary

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: the CUDA tier's tests live under it (absent from an installed package)."""
DEFAULT_BUDGET_S = 480.0
MIN_STEP_S = 20.0
"""A step is not started with less than this left of the budget: it could not finish anything."""


@dataclass
class Outcome:
    name: str
    status: str  # ok, failed, timeout, skipped
    seconds: float = 0.0
    returncode: int | None = None
    note: str = ""
    report: dict | None = None
    summary: str = ""
    failures: list[str] = field(default_factory=list)


def command_line(step: Step) -> str:
    return " ".join([Path(sys.executable).name, *step.args])


def _is_pytest(step: Step) -> bool:
    return step.args[:2] == ["-m", "pytest"]


def run_step(step: Step, work: Path, remaining_s: float) -> Outcome:
    """Run one step in a process group of its own; on its timeout the whole group is killed."""
    timeout = min(step.timeout_s, remaining_s)
    if remaining_s < MIN_STEP_S:
        return Outcome(step.name, "skipped", note=f"out of time ({remaining_s:.0f} s of the budget left)")
    if _is_pytest(step) and not (ROOT / "tests" / "cuda_tests").is_dir():
        return Outcome(step.name, "skipped", note=f"no tests/cuda_tests under {ROOT} (run from the checkout)")
    log_path = work / f"{step.name}.log"
    if step.report:  # a report left by an earlier run must not pass for this one's
        (work / step.report).unlink(missing_ok=True)
    started, wall_started = time.monotonic(), time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with open(log_path, "wb") as log:
        log.write(f"$ {command_line(step)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            [sys.executable, *step.args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            _drop_models_touched_since(work / "models", wall_started)
            outcome = Outcome(
                step.name, "timeout", time.monotonic() - started, note=f"killed after {timeout:.0f} s"
            )
            outcome.report = _report(work, step)  # a bench's workloads finished before the kill
            return outcome
        finally:
            _kill_group(proc)  # whatever the step left behind (a worker, a broker) goes with it
    outcome = Outcome(step.name, "ok" if code == 0 else "failed", time.monotonic() - started, code)
    outcome.report = _report(work, step)
    text = log_path.read_text(errors="replace")
    if _is_pytest(step):
        outcome.summary = _pytest_summary(text)
        outcome.failures = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)
    if code != 0 and not outcome.summary:
        outcome.note = text.strip().splitlines()[-1][:300] if text.strip() else f"exit {code}"
    return outcome


def _report(work: Path, step: Step) -> dict | None:
    """The step's JSON report, if it wrote a whole one (the bench rewrites it after each workload; a
    step killed while writing a report of its own may leave half of one, which is no report)."""
    path = work / step.report if step.report else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None


def _drop_models_touched_since(models: Path, since: float) -> None:
    """A checkpoint a killed step was writing would pass for a whole one next time (its config.json is
    there): every checkpoint folder written to during the step goes; finished ones from before stay."""
    if not models.is_dir():
        return
    for folder in models.iterdir():
        if folder.is_dir() and folder.stat().st_mtime >= since - 1:
            shutil.rmtree(folder, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _pytest_summary(text: str) -> str:
    lines = [line.strip("= ") for line in text.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1] if lines else ""


def write_outputs(out: Path, work: Path, outcomes: list[Outcome], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    sections = [
        f"# GPU check: {meta['device_name']}",
        "",
        f"{meta['started_at']}, {meta['seconds']:.0f} s of a {meta['budget_s']:.0f} s budget; torch "
        f"{meta['torch']}, transformers {meta['transformers']}, triton {meta['triton']}, kafka-scorer at "
        f"{meta['commit'] or 'an unknown commit'}",
        "",
        "| step | status | seconds | note |",
        "| --- | --- | ---: | --- |",
        *(f"| {o.name} | {o.status} | {o.seconds:.0f} | {step_summary(o)} |" for o in outcomes),
    ]
    for outcome in outcomes:
        sections += ["", step_markdown(outcome)]
    (out / "gpu-check.md").write_text("\n".join(sections) + "\n")
    payload = {"meta": meta, "steps": [o.__dict__ for o in outcomes]}
    (out / "gpu-check.json").write_text(json.dumps(payload, indent=2))
    with tarfile.open(out / "gpu-check-logs.tar.gz", "w:gz") as tar:
        for outcome in outcomes:  # this run's steps only: the work dir keeps an earlier call's logs
            log = work / f"{outcome.name}.log"
            if log.is_file() and outcome.status != "running":
                tar.add(log, arcname=log.name)


def _installed(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _running(step: Step) -> Outcome:
    """The row of the step under way, as the files say it while it runs."""
    return Outcome(step.name, "running", note="the check was stopped during this step")


def _output(command: list[str]) -> str:
    """A command's first line of output, or "" where it fails or is missing."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return next(iter(done.stdout.splitlines()), "").strip()
    return ""


def _meta(budget_s: float, started: float) -> dict:
    """Taken before the first step. The GPU's name comes from nvidia-smi where there is one: asking torch
    would hold a CUDA context in this process while every step runs (on a GPU in exclusive-process mode
    no step could then open one)."""
    import torch

    name = _output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if not name:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    return {
        "device_name": name,
        "torch": torch.__version__,
        # a lent machine's image is not the dev venv (torch 2.11 and triton 3.6 there, for one)
        "transformers": _installed("transformers"),
        "triton": _installed("triton"),
        "commit": _output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "budget_s": budget_s,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out", help="where the tables go "
                        "(default: $OUT, else ./gpu-check-out)")  # fmt: skip
    parser.add_argument(
        "--work-dir", default="/tmp/kafka-scorer-gpu-check", help="checkpoints and step files"
    )
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the whole check's time")
    parser.add_argument("--steps", help="comma-separated steps, run in the order given (default: all)")
    parser.add_argument("--tiny", action="store_true", help="the same steps at CPU test size")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their limits only")
    args = parser.parse_args(argv)
    work = Path(args.work_dir)
    steps = plan_steps(work, args.tiny)
    if args.steps:
        wanted = args.steps.split(",")
        unknown = sorted(set(wanted) - {s.name for s in steps})
        if unknown:
            parser.error(
                f"--steps: unknown {', '.join(unknown)}; the steps are {', '.join(s.name for s in steps)}"
            )
        by_name = {s.name: s for s in steps}
        steps = [by_name[name] for name in dict.fromkeys(wanted)]  # in the order asked: decisive first
    if args.dry_run:
        for step in steps:
            print(f"{step.name} (at most {step.timeout_s:.0f} s): {command_line(step)}")
        print(f"budget {args.budget_s:.0f} s in all; tables to {args.out}")
        return 0
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    started, deadline = time.time(), time.monotonic() + args.budget_s
    meta = _meta(args.budget_s, started)
    outcomes: list[Outcome] = []
    for step in steps:
        print(f"gpu-check: {step.name} ...", flush=True)
        # The files are rewritten before every step: a check stopped from outside (the device's own time
        # limit, which may be shorter than --budget-s) leaves every finished step's tables and says
        # which one it was stopped in.
        write_outputs(out, work, [*outcomes, _running(step)], {**meta, "seconds": time.time() - started})
        outcome = run_step(step, work, deadline - time.monotonic())
        print(
            f"gpu-check: {step.name} {outcome.status} in {outcome.seconds:.0f} s {outcome.note}", flush=True
        )
        outcomes.append(outcome)
    write_outputs(out, work, outcomes, {**meta, "seconds": time.time() - started})
    print((out / "gpu-check.md").read_text())
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
