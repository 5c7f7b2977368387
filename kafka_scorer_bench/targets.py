"""The project's performance goals, judged on a finished report: each as measured value against its goal.

Apart from the run itself so the goals live in one place and read as a list, and so a report can be
judged without re-running anything.
"""

from __future__ import annotations

import torch


def evaluate_targets(
    results: dict, label_kernel: dict | None, device: torch.device, backend: str | None
) -> list[dict]:
    """The issue's targets, each as measured / goal, for the backend the worker would use."""
    gpu = device.type == "cuda"
    targets: list[dict] = []

    def add(name: str, value: float | None, goal: float, note: str = "") -> None:
        met = None if value is None else value >= goal
        targets.append({"target": name, "value": value, "goal": goal, "met": met, "note": note})

    for name in ("rerank", "many-items"):
        if name in results and backend is not None:
            value = results[name]["ratios"]["b_over_a_vs_token_ratio"].get(backend)
            add(
                f"{name}: (b)/(a) as a share of the token ratio [{backend}] — MIS engine vs. the same "
                "engine pair by pair, against the tokens MIS saves",
                value,
                0.9,
            )
    if "rerank" in results and backend is not None:
        add(
            f"rerank: (b)/(c) items/s [{backend}] — MIS engine vs. the transformers baseline",
            results["rerank"]["ratios"]["b_over_c"].get(backend),
            6.0 if gpu else 8.0,
        )
    for name, w in results.items():
        if w["ratios"].get("d_over_b") is not None:
            add(
                f"{name}: (d)/(b) items/s — the worker through a broker vs. the engine alone",
                w["ratios"]["d_over_b"],
                0.9,
            )
    if label_kernel:
        shape = label_kernel["shape"]
        note = f"rows={shape['rows']} vocab={shape['vocab']}" + (
            ""
            if (shape["rows"], shape["vocab"]) == (4096, 151_936)
            else " (the issue's shape is 4096 x 151936)"
        )
        add(
            "label kernel: logprobs speed-up vs log_softmax + gather",
            label_kernel["speedup_vs_baseline"].get("logprobs"),
            5.0,
            note,
        )
    if gpu and "many-items" in results and backend is not None:
        floor = results["many-items"]["contenders"].get(f"b:{backend}", {}).get("floor_fraction")
        add(
            f"many-items: (b) forward as a fraction of the matmul peak [{backend}] — MIS engine vs. "
            "the hardware",
            floor,
            0.5,
        )
    return targets
