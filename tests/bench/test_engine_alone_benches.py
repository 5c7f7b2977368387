"""The engine-alone benches at CPU size: `bench.graphs --quick` (both Scorers run, the "on" one
through its padded static buffers, their scores agree), `bench.profile_forward --quick` (the
gpu-check sections render their reports), `bench.deterministic --quick` (a templated decoder
workload with the prefix cache on, and ColBERT; in deterministic mode each job alone equals its
batched scores bit for bit) and
`bench.attention --quick` (every CPU backend agrees with the dense reference), `bench.fixed_matmul
--quick` (on the CPU the batched blocks keep their bits at every count, as the engine relies on)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace


def test_quick_graphs_bench_reports_each_batch_and_renders_its_table(tmp_path: Path) -> None:
    from devtools.gpu_check.tables import step_markdown, step_summary
    from kafka_scorer_bench.graphs import BATCHES, main

    out = tmp_path / "graphs.json"
    main(["--quick", "--device", "cpu", "--graph-tokens", "1024", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["graphs"] == "128..1024:uncaptured"
    assert [b["requests"] for b in report["batches"]] == [r for r, _ in BATCHES]
    assert all(b["off_ms"] > 0 and b["on_ms"] > 0 and b["max_abs_diff"] <= 1e-4 for b in report["batches"])
    outcome = SimpleNamespace(name="graphs", report=report, summary="", note="", status="ok")
    markdown = step_markdown(outcome)
    assert markdown.startswith("## CUDA graphs on and off") and markdown.count("\n| 1 |") == 2
    assert step_summary(outcome).startswith("graphs off/on per forward: 28 tokens")


def test_quick_profile_splits_the_forward_into_categories(tmp_path: Path) -> None:
    """The profile of a served forward: every category's share sums to the whole, the matmuls and the
    attention are found by name, and the gpu-check section renders it."""
    from devtools.gpu_check.tables import step_markdown, step_summary
    from kafka_scorer_bench.profile_forward import category, main

    assert category("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_TNT") == "matmul"
    assert category("triton_tem_fused_flex_attention_0") == "attention"
    assert category("triton_poi_fused_add_mul_rsqrt_0") == "elementwise"
    out = tmp_path / "profile.json"
    main(["--quick", "--device", "cpu", "--requests", "2", "--forwards", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    assert abs(sum(report["categories"].values()) - 1) < 1e-6 and report["ms_per_forward"] > 0
    assert report["categories"]["matmul"] > 0 and report["categories"]["attention"] > 0
    outcome = SimpleNamespace(name="profile", report=report, summary="", note="", status="ok")
    assert "| category | share |" in step_markdown(outcome)
    assert "ms per forward: " in step_summary(outcome)


def test_quick_deterministic_bench_reports_both_modes_and_bit_identity(tmp_path: Path, capsys) -> None:
    from kafka_scorer_bench.deterministic import main

    report = tmp_path / "deterministic.json"
    main(
        [
            "--quick",
            "--workload", "templated",
            "--workload", "late-interaction",
            "--repeats", "1",
            "--model-dir", str(tmp_path / "models"),
            "--json", str(report),
        ]
    )  # fmt: skip
    workloads = json.loads(report.read_text())["workloads"]
    assert set(workloads) == {"templated", "late-interaction"}
    assert workloads["templated"]["cached_share"] > 0  # the prefix cache served the mode's hits
    for row in workloads.values():
        assert row["alone_equals_batched"] is True
        assert row["default_items_per_s"] > 0 and row["deterministic_items_per_s"] > 0
        assert row["max_abs_diff"] < 1e-4
    assert "late-interaction" in capsys.readouterr().out
    from devtools.gpu_check.tables import step_markdown, step_summary

    outcome = SimpleNamespace(name="deterministic", report=json.loads(report.read_text()), summary="")
    outcome.note, outcome.status = "", "ok"
    assert "| late-interaction |" in step_markdown(outcome) and "| yes |" in step_markdown(outcome)
    assert step_summary(outcome).endswith("alone == batched: yes")


def test_quick_attention_bench_times_every_cpu_backend_against_dense(tmp_path: Path) -> None:
    from devtools.gpu_check.tables import step_markdown, step_summary
    from kafka_scorer.engine.attention.registry import BACKENDS
    from kafka_scorer_bench.attention import CPU_SKIPS, main

    out = tmp_path / "attention.json"
    main(["--quick", "--device", "cpu", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    expected = sorted(set(BACKENDS) - set(CPU_SKIPS))
    for row in report["layouts"].values():
        assert sorted(row["ms"]) == expected and all(ms > 0 for ms in row["ms"].values())
        assert max(row["max_abs_diff"].values()) < 1e-5
    outcome = SimpleNamespace(name="attention", report=report, summary="", note="", status="ok")
    assert "| rerank |" in step_markdown(outcome) and step_summary(outcome).startswith("fastest: rerank ")


def test_a_backend_that_fails_is_named_and_the_others_are_still_timed(tmp_path: Path, monkeypatch) -> None:
    """On a GPU day a kernel failing at the 0.6B's shapes must not cost the step the other backends'
    figures (the attention table decides `auto`'s choice)."""
    import dataclasses

    from devtools.gpu_check.tables import step_markdown
    from kafka_scorer.engine.attention import registry
    from kafka_scorer_bench.attention import main

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setitem(
        registry.BACKENDS, "cascade", dataclasses.replace(registry.BACKENDS["cascade"], attend=broken)
    )
    out = tmp_path / "attention.json"
    main(
        [
            "--quick",
            "--device",
            "cpu",
            "--repeats",
            "1",
            "--backend",
            "dense",
            "--backend",
            "cascade",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    for row in report["layouts"].values():
        assert list(row["ms"]) == ["dense"] and "no kernel image" in row["errors"]["cascade"]
    outcome = SimpleNamespace(name="attention", report=report, summary="", note="", status="ok")
    assert "| failed |" in step_markdown(outcome) and "`cascade` failed: RuntimeError" in step_markdown(
        outcome
    )


def test_quick_fixed_matmul_bench_finds_the_cpus_batched_blocks_invariant(tmp_path: Path) -> None:
    from devtools.gpu_check.tables import step_markdown, step_summary
    from kafka_scorer_bench.fixed_matmul import main, projections
    from kafka_scorer_bench.models import SHAPES

    out = tmp_path / "fixed-matmul.json"
    main(["--quick", "--device", "cpu", "--tokens", "1024", "--repeats", "1", "--json", str(out)])
    report = json.loads(out.read_text())
    rows = report["projections"]
    assert {name: (r["in"], r["out"]) for name, r in rows.items()} == projections(SHAPES["tiny"])
    assert projections(SHAPES["qwen3-0.6b"])["qkv"] == (1024, 2048 + 2 * 1024)  # 16 q heads, 8 kv, 128 wide
    for row in rows.values():
        assert row["counts_checked"] == [2, 3, 4, 7, 8] and row["batched_counts_differing"] == []
        assert row["strategies_agree"] and min(row["plain_ms"], row["per_block_ms"], row["batched_ms"]) > 0
        assert row["triton_ms"] is None  # no triton on the CPU outside its interpreter
    outcome = SimpleNamespace(name="fixed-matmul", report=report, summary="", note="", status="ok")
    assert step_markdown(outcome).count("| yes | — | yes |") == 4
    assert step_summary(outcome).startswith("batched blocks keep their bits at every count: yes")


def test_the_invariance_check_names_the_counts_that_change_a_block() -> None:
    """A matmul whose result follows the block count is caught at exactly those counts."""
    import torch

    from kafka_scorer.engine.layers.invariant import ROWS
    from kafka_scorer_bench.fixed_matmul import counts_that_differ

    def drifts(x, weight, bias):  # the bits of block 0 move once there are more than three blocks
        return x @ weight.T + (1e-3 if x.shape[0] > 3 * ROWS else 0.0)

    x, weight = torch.randn(8 * ROWS, 16), torch.randn(4, 16)
    assert counts_that_differ(drifts, x, weight, [2, 3, 4, 8]) == [4, 8]
