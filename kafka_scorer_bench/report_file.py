"""A bench report on disk, whole or not at all.

The benches rewrite their JSON report as they go (after each workload, after each rate), so a run
killed at its time limit — a step of `./dev gpu-check` — leaves what it measured. Each write goes
beside the file and is renamed over it: a kill in the middle of a write leaves the previous report,
never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_report(path: str | Path, report: dict) -> None:
    target = Path(path)
    scratch = target.with_name(f".{target.name}.writing")
    scratch.write_text(json.dumps(report, indent=2))
    os.replace(scratch, target)
