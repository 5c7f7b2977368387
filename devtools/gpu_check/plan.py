"""What `./dev gpu-check` runs: each step's command, its time limit and the report it writes.

The order is the cheap and decisive first, the 8B model last; `--tiny` is the same steps at CPU test
size. The runner, the budget and the outputs are `gpu_check.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    args: list[str]
    """The interpreter's arguments (`-m module ...`)."""
    timeout_s: float
    report: str | None = None
    """The JSON file the step writes (relative to the work dir), read back into the tables."""


def plan_steps(work: Path, tiny: bool) -> list[Step]:
    """The steps in the order they run: the cheap and decisive first, the 8B model last."""
    models = str(work / "models")
    if tiny:  # the same commands at CPU test size
        device, big, small = ["--device", "cpu"], ["--quick"], ["--quick"]
        tier = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "tests/cuda_tests", "-m", "not cuda"]
        tier += ["-k", "label"]  # the CPU variants of the label-kernel test: seconds
        kernel = ["--rows", "16", "--vocab", "512", "--hidden", "32", "--repeats", "1"]
        open_loop: list[str] = []
        open_loop_best: list[str] = []
        backends: list[str] = []
        graphs = ["--quick", "--graph-tokens", "1024", "--repeats", "2"]
        profile = ["--quick", "--requests", "2", "--forwards", "1"]
        determinism = ["--quick", "--workload", "short", "--repeats", "1"]
        attention = ["--quick", "--repeats", "1"]
        fixed = ["--quick", "--repeats", "1"]
    else:
        device, big, small = (
            ["--device", "cuda"],
            ["--model-shape", "qwen3-8b"],
            ["--model-shape", "qwen3-0.6b"],
        )
        tier = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "-m", "cuda", "tests/cuda_tests"]
        kernel = []
        open_loop = ["--rates", "25,50,100,200,300,400,600", "--rate-seconds", "6"]
        open_loop_best = ["--rates", "140,200,300,400,600", "--rate-seconds", "6"]
        # dense is the slow reference the CPU suite checks: on the GPU the served backends are timed,
        # and the opt-in spans and varlen kernels beside them (their speed decides whether auto may pick one)
        backends = ["--backend", "flex", "--backend", "cascade", "--backend", "spans", "--backend", "varlen"]
        graphs = ["--model-shape", "qwen3-0.6b"]
        profile = ["--model-shape", "qwen3-0.6b"]
        determinism = ["--model-shape", "qwen3-0.6b", "--workload", "rerank", "--workload", "many-items"]
        determinism += ["--repeats", "2", "--max-batch-tokens", "16384"]
        attention = ["--model-shape", "qwen3-0.6b", "--repeats", "5"]
        fixed = ["--model-shape", "qwen3-0.6b"]
    bench = ["-m", "kafka_scorer", "bench", *device, "--model-dir", models, "--skip-label-kernel"]
    return [
        Step("cuda-tier", "CUDA tier (pytest -m cuda tests/cuda_tests)", tier, 170),
        Step(
            "label-kernel",
            "Label kernel at 4,096 x 151,936",
            [
                "-m",
                "kafka_scorer_bench.label_kernel",
                *device,
                *kernel,
                "--json",
                str(work / "label-kernel.json"),
            ],
            60,
            "label-kernel.json",
        ),
        Step(
            "open-loop",
            "Open loop, SGLang's shape, 0.6B",
            [*bench, *small, "--workload", "open-loop", *open_loop, "--json", str(work / "open-loop.json")],
            170,
            "open-loop.json",
        ),
        Step(
            "graphs",
            "CUDA graphs on and off, SGLang's shape, 0.6B",
            [
                "-m",
                "kafka_scorer_bench.graphs",
                *device,
                *graphs,
                "--model-dir",
                models,
                "--json",
                str(work / "graphs.json"),
            ],
            90,
            "graphs.json",
        ),
        Step(
            "profile",
            "Where a served forward's time goes, 0.6B",
            [
                "-m",
                "kafka_scorer_bench.profile_forward",
                *device,
                *profile,
                "--model-dir",
                models,
                "--json",
                str(work / "profile.json"),
            ],
            60,
            "profile.json",
        ),
        Step(
            "attention",
            "One layer's attention alone, every backend, 0.6B heads",
            [
                "-m",
                "kafka_scorer_bench.attention",
                *device,
                *attention,
                "--json",
                str(work / "attention.json"),
            ],
            90,  # flex compiles once per layout, in the untimed first call
            "attention.json",
        ),
        Step(
            "open-loop-best",
            "Open loop on the fastest correct attention backend, SGLang's shape, 0.6B",
            [
                "-m",
                "devtools.gpu_check.open_loop_best",
                "--attention-json",
                str(work / "attention.json"),
                "--json",
                str(work / "open-loop-best.json"),
                "--",
                *bench[2:],
                *small,
                "--workload",
                "open-loop",
                *open_loop_best,
            ],
            150,
            "open-loop-best.json",
        ),
        Step(
            "bench-0.6b",
            "rerank and many-items, 0.6B",
            [
                *bench,
                *small,
                "--workload",
                "rerank",
                "--workload",
                "many-items",
                *backends,
                "--repeats",
                "2",
                "--repeat-budget",
                "8",
                "--steady-seconds",
                "3",
                "--json",
                str(work / "bench-0.6b.json"),
            ],
            290,
            "bench-0.6b.json",
        ),
        Step(
            "floor-8b",
            "many-items floor fraction, 8B",
            [
                *bench,
                *big,
                "--workload",
                "many-items",
                "--jobs",
                "1",
                "--repeats",
                "1",
                "--skip-worker",
                "--json",
                str(work / "floor-8b.json"),
            ],
            200,
            "floor-8b.json",
        ),
        Step(
            "deterministic",
            "What deterministic mode costs, 0.6B",
            [
                "-m",
                "kafka_scorer_bench.deterministic",
                *device,
                *determinism,
                "--model-dir",
                models,
                "--json",
                str(work / "deterministic.json"),
            ],
            120,
            "deterministic.json",
        ),
        Step(
            "fixed-matmul",
            "Deterministic mode's projections, per block, batched or one Triton launch, 0.6B",
            [
                "-m",
                "kafka_scorer_bench.fixed_matmul",
                *device,
                *fixed,
                "--json",
                str(work / "fixed-matmul.json"),
            ],
            60,
            "fixed-matmul.json",
        ),
    ]
