"""`kafka-scorer demo --template qwen3-reranker` end to end as a child process: text jobs through the
embedded broker and a worker serving the tiny reranker with the preset, printed as rankings.

Each printed ranking is checked against the independent reference of the template tests: the model
card's prompt written out as text, tokenized as one string, stock transformers one pair at a time
(tests/engine/test_templates.py). The demo's tiny reranker is rebuilt here from the same seed (the
build is deterministic: the same bytes, so the same `model_revision`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import pytest

from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker
from kafka_scorer.cli.demo_rerank import rerank_job
from kafka_scorer.engine.load.revision import checkpoint_revision
from tests.engine.test_templates import CARD_INSTRUCTION, card_prompt, reference_rows
from tests.integration.cli_runs import run_demo
from tests.integration.test_demo import table_lines

pytestmark = pytest.mark.integration

RANKED = re.compile(r"^(\d+)\. #(\d+) (\d\.\d{4}) (.+)$")
SHORT_JOBS = 12


@dataclass
class RankingRow:
    job_id: str
    mis: str
    labels: str
    instruction: str
    top_n_items: str
    lines: list[str] = field(default_factory=list)

    @property
    def ranked(self) -> list[tuple[int, int, float, str]]:
        """(rank, index, score, item text) of every ranking line."""
        return [(int(m[1]), int(m[2]), float(m[3]), m[4]) for line in self.lines if (m := RANKED.match(line))]


def parse_rankings(out: str) -> dict[str, RankingRow]:
    rows: dict[str, RankingRow] = {}
    for job_id, lines in table_lines(out, 7).items():
        _, mis, labels, instruction, top_n_items, _, _ = lines[0]
        ranking = [line[5] for line in lines if line[5]]
        rows[job_id] = RankingRow(job_id, mis, labels, instruction, top_n_items, ranking)
    return rows


def test_demo_template_prints_rankings_the_reference_agrees_with(tmp_path) -> None:
    reranker, out, err = run_demo("qwen3-reranker", lambda: build_tiny_reranker(tmp_path / "reranker"))
    assert "Traceback" not in err
    rows = parse_rankings(out)
    assert set(rows) == {f"rr-{n:02d}" for n in range(SHORT_JOBS - 1)} | {"bad-job"}, out

    bad = " ".join(rows.pop("bad-job").lines)
    assert bad.startswith("ERROR invalid_request: label_tokens: 'not at all' is"), bad

    seen = {"labels": set(), "instruction": set(), "mis": set()}
    for n in range(SHORT_JOBS - 1):
        job = rerank_job(n)
        row = rows[job.id]
        seen["labels"].add(row.labels)
        seen["instruction"].add(row.instruction)
        seen["mis"].add(row.mis)
        assert isinstance(job.query, str) and job.top_n is not None
        prompts = [
            card_prompt(job.query, str(item), job.instruction or CARD_INSTRUCTION) for item in job.items
        ]
        relevance = [r[0] for r in reference_rows(reranker, prompts, ["yes", "no"], apply_softmax=True)]
        want = sorted(range(len(job.items)), key=lambda i: (-relevance[i], i))[: job.top_n]
        ranked = row.ranked
        assert [r[0] for r in ranked] == list(range(1, len(want) + 1)), row
        assert [r[1] for r in ranked] == want, (row, relevance)
        for _, index, score, text in ranked:
            assert score == pytest.approx(relevance[index], abs=6e-5), (row, relevance)
            item = str(job.items[index])
            assert item.startswith(text.removesuffix("…")) and len(text) <= 30, (text, item)
    assert seen == {
        "labels": {"yes,no", "preset"},
        "instruction": {"preset", "custom"},
        "mis": {"yes", "no", "auto"},
    }

    template_text = card_prompt("{query}", "{item}", "{instruction}")
    template_hash = hashlib.sha256(template_text.encode()).hexdigest()[:12]
    provenance = [line for line in out.splitlines() if line.startswith("provenance:")]
    assert provenance == [
        f"provenance: template qwen3-reranker (hash {template_hash}), "
        f"model_revision {checkpoint_revision(str(reranker))}, dtype float32"
    ], out
    assert "11/12 jobs answered" not in out and "12/12 jobs answered (1 with an error reply)" in out
    assert "RANDOM" in out
