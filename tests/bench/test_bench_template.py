"""`kafka-scorer bench --template qwen3-reranker`: the rerank workload as text under the preset.

Structure only, nothing timed: the engine really runs the text jobs through the template (its scores
agree with the baseline on the whole prompts), no-MIS runs every whole prompt, and MIS runs the
template's head (system prompt, instruction, query) once per job — the token counts prove it,
counted here with the checkpoint's own tokenizer on the model card's prompt written out as text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafka_scorer.cli import main
from kafka_scorer.wire.protocol import TemplateRef
from tests.engine.test_templates import card_prompt


@dataclass
class Run:
    rc: int
    report: dict
    models: Path
    prepared: list[tuple[bool, TemplateRef | None]]
    """(query was text, the template the engine applied) of every job the engine prepared."""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    from kafka_scorer.engine.scoring_engine import ScoringEngine

    root = tmp_path_factory.mktemp("bench-template")
    out = root / "bench.json"
    prepared: list[tuple[bool, TemplateRef | None]] = []
    prepare = ScoringEngine.prepare

    def spy(self, job, job_id):
        done = prepare(self, job, job_id)
        prepared.append((isinstance(job.query, str), getattr(done, "template", None)))
        return done

    flags = ["--quick", "--repeats", "1", "--workload", "rerank", "--template", "qwen3-reranker"]
    flags += ["--skip-worker", "--skip-label-kernel", "--model-dir", str(root / "models"), "--json", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ScoringEngine, "prepare", spy)
        rc = main(["bench", *flags])
    return Run(rc, json.loads(out.read_text()), root / "models", prepared)


def test_template_bench_passes_its_cross_check(run: Run) -> None:
    rc, report = run.rc, run.report
    w = report["workloads"]["rerank"]
    assert rc == 0 and report["ok"] is True
    # (a) and (b) sent text, and the engine applied the preset to every job (warm-up slices included)
    assert run.prepared and all(text for text, _ in run.prepared)
    assert {template.name for _, template in run.prepared if template} == {"qwen3-reranker"}
    assert all(template is not None for _, template in run.prepared)
    assert w["cross_check"]["ok"] and w["cross_check"]["errors"] == 0
    for contender in w["contenders"].values():
        assert contender["errors"] == 0


def test_template_tokens_show_the_shared_part_computed_once(run: Run) -> None:
    from transformers import AutoTokenizer

    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer_bench.templated import templated_workload
    from kafka_scorer_bench.workloads import workload_spec

    report, models = run.report, run.models
    w = report["workloads"]["rerank"]
    t = w["template"]
    assert t["name"] == "qwen3-reranker"
    assert (
        t["hash"]
        == hashlib.sha256(card_prompt("{query}", "{item}", "{instruction}").encode()).hexdigest()[:12]
    )

    checkpoint = next(models.glob("*-causal-*-chat"))
    scorer = Scorer(str(checkpoint), dtype="float32", device="cpu", template="qwen3-reranker")
    texts = templated_workload(workload_spec("rerank", quick=True), scorer).sent
    assert texts is not None and all(isinstance(job.query, str) for job in texts)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    whole = sum(
        len(tokenizer(card_prompt(job.query, item))["input_ids"]) for job in texts for item in job.items
    )  # type: ignore[arg-type]
    head = len(tokenizer(card_prompt("", "").split("<Query>: ")[0] + "<Query>: ")["input_ids"])

    jobs = len(texts)
    a = w["contenders"]["a"]["forward_tokens"]
    assert a == whole  # no-MIS: every item's whole prompt, the head included each time
    assert t["no_mis_tokens"] * jobs == pytest.approx(whole)
    saved_per_extra_item = (a - w["contenders"]["b:dense"]["forward_tokens"]) / sum(
        len(job.items) - 1 for job in texts
    )
    assert saved_per_extra_item == pytest.approx(t["shared_tokens"])  # MIS: the shared part once per job
    assert t["shared_tokens"] >= head  # ... and that part holds the whole template head
    for backend in report["meta"]["backends"]:
        assert w["contenders"][f"b:{backend}"]["forward_tokens"] == pytest.approx(t["mis_tokens"] * jobs)


def test_template_line_in_the_printed_report(run: Run) -> None:
    from kafka_scorer_bench.report_text import format_report

    report = run.report
    text = format_report(report)
    t = report["workloads"]["rerank"]["template"]
    assert f"template qwen3-reranker (hash {t['hash']}), tokens per job: shared part" in text
    assert f"MIS {t['mis_tokens']:,.0f} (shared part once), no-MIS {t['no_mis_tokens']:,.0f}" in text
