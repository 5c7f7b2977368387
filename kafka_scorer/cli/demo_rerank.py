"""`kafka-scorer demo --template NAME`: the reranking use case, one worker setting and plain text jobs.

A team moving a yes/no reranker onto the service wants to see three things before anything else: that
the worker wraps query and documents in the model's prompt by itself (`template`), that labels can be
named as words (`label_tokens`, or none at all: the preset's), and that a result says which items win
(`ranking`) and which checkpoint and prompt produced it (provenance). This module builds those jobs
and prints the answers as rankings; `demo.py` runs them through the same broker and worker as the
plain demo.

Without `--model` the served model is `build_tiny_reranker`'s random Qwen3-shaped CausalLM with a
Qwen-style chat tokenizer (`<|im_start|>`, `<|im_end|>`, `<think>`): the prompt is tokenized as the real
model's would be, the rankings themselves mean nothing. With `--template qwen3-vl-reranker` it is
`build_tiny_vl_reranker`'s random Qwen3-VL reranker, and every other job's last item is a picture
(content parts, SPEC §11), shown as `[image]` in the rankings.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_scorer import errors
from kafka_scorer.cli.result_view import ITEM_WIDTH, provenance_lines, ranking_lines
from kafka_scorer.cli.submit import new_submission
from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart
from kafka_scorer.wire.protocol import Job, Result

if TYPE_CHECKING:
    from kafka_scorer.cli.demo_parts import DemoJob, DemoModel

VISION_TEMPLATE = "qwen3-vl-reranker"
"""Without --model, this preset serves a tiny reranker that reads images, and some jobs carry one."""
BAD_LABELS = ["yes", "not at all"]
"""A label text that is several tokens: the worker must answer `invalid_request` naming it."""

QUERIES = [
    "What is the capital of California?",
    "Which passage is about rivers and mountains?",
    "Kafka topics, partitions and consumers: what is an offset?",
    "Is this review positive?",
]
DOCUMENTS = [
    "Sacramento is the capital of California.",
    "Los Angeles is a large city in the south.",
    "The Sacramento River flows from the mountains to the bay.",
    "An offset is the position of a record in a partition.",
    "The food was great and the service was friendly.",
    "Consumers commit offsets to remember how far they read.",
    "San Francisco and San Diego are on the coast.",
]
INSTRUCTIONS = [
    None,  # the preset's own instruction
    "Given a question, retrieve passages that answer it",
    "Given a topic, find documents about that topic",
]


def load_reranker(model: str | None, template: str, device: str, dtype: str, workdir: Path) -> DemoModel:
    """The user's model served with `template`, or the tiny random reranker when none is named (or it
    cannot be loaded: the same fallback as the plain demo)."""
    from kafka_scorer.cli.demo_parts import DemoModel, say
    from kafka_scorer.cli.model_source import check_model_source
    from kafka_scorer.engine.prepare.templates import TemplateError, load_template
    from kafka_scorer.engine.scorer import Scorer

    try:
        load_template(template)
    except TemplateError as exc:  # the operator's mistake, not the model's: no fallback hides it
        raise errors.UserFacingError(f"--template: {exc}") from None
    if model:
        try:
            check_model_source(model)  # a misspelt directory: at once, not after the hub's retries
            scorer = Scorer(model, device=device, dtype=dtype, template=template)
        except Exception as exc:  # any load failure: fall back, but say why in one line
            reason = errors.explain(exc) or f"{type(exc).__name__}: {exc}"
            say(f"cannot load --model {model}: {reason}")
            say("falling back to a tiny RANDOM reranker")
        else:
            return DemoModel("reranker", scorer, random=False, template=template)
    if template == VISION_TEMPLATE:  # a reranker that reads images, so the demo can send some
        from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker

        path, name = build_tiny_vl_reranker(workdir / "tiny-vl-reranker"), "tiny-random-vl-reranker"
    else:
        from kafka_scorer.checkpoints.tiny_models import build_tiny_reranker

        path, name = build_tiny_reranker(workdir / "tiny-reranker"), "tiny-random-reranker"
    scorer = Scorer(str(path), served_model_name=name, device=device, dtype=dtype, template=template)
    return DemoModel("reranker", scorer, random=True, template=template)


def rerank_jobs(model: DemoModel, count: int) -> list[DemoJob]:
    """`count` text jobs: labels by text or the preset's, the preset's instruction or another, MIS on,
    off and auto, `top_n` below and above the item count; the last is the bad-label job."""
    from kafka_scorer.cli.demo_parts import DemoJob

    images = model.scorer.describe().kind.reads_images
    jobs = [DemoJob(model, new_submission(rerank_job(n, images))) for n in range(max(count - 1, 0))]
    bad = Job(id="bad-job", query=QUERIES[0], items=[*DOCUMENTS[:2]], label_tokens=BAD_LABELS, top_n=1)
    jobs.append(DemoJob(model, new_submission(bad), expect_error=True))
    return jobs


def rerank_job(n: int, images: bool = False) -> Job:
    """Job `n` of the sample: a pure function of `n`, so a test can rebuild what the demo sent. With
    `images` (a model that reads them) the last item of every other job is a picture with a caption."""
    num_items = 3 + n % 3
    items: list[Any] = [DOCUMENTS[(n + k) % len(DOCUMENTS)] for k in range(num_items)]
    if images and n % 2 == 0:
        items[-1] = Content([ImagePart(ImageData(_picture(n))), TextPart("a photo")])
    return Job(
        id=f"rr-{n:02d}",
        query=QUERIES[n % len(QUERIES)],
        items=items,
        label_tokens=["yes", "no"] if n % 2 == 0 else None,
        instruction=INSTRUCTIONS[n % len(INSTRUCTIONS)],
        top_n=(2, 3, 10)[n % 3],
        apply_softmax=True,  # p(yes) among {yes, no}: the model card's relevance score
        multi_item=(True, False, None)[(n // 2) % 3],
    )


def _picture(n: int) -> bytes:
    """A small PNG of one colour, different for each job."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (48 + 8 * (n % 4), 40), (40 * n % 256, 200, 90)).save(out, "PNG")
    return out.getvalue()


def render_rankings(console: Any, jobs: list[DemoJob], max_rows: int) -> list[str]:
    """The rankings table; returns the provenance line(s) for the caller to print once, under it."""
    from rich.text import Text

    from kafka_scorer.cli.demo_parts import print_fitted, results_table

    ranking = "rank. #index  score  item"
    columns = [("job id", "left"), ("MIS", "center"), ("labels", "left"), ("instruction", "left")]
    columns += [("top_n/items", "right"), (ranking, "left"), ("latency ms", "right")]
    table = results_table("kafka-scorer demo rankings", columns, ranking, ITEM_WIDTH + 22)
    for job in jobs[:max_rows]:
        s = job.submission
        latency = f"{s.latency_s * 1000:.0f}" if s.latency_s is not None else "-"
        table.add_row(
            s.job_id,
            {True: "yes", False: "no", None: "auto"}[s.job.multi_item],
            ",".join(s.job.label_tokens) if s.job.label_tokens else "preset",
            "preset" if s.job.instruction is None else "custom",
            f"{s.job.top_n}/{len(s.job.inputs)}",
            Text(ranking_outcome(s.job, s.result, s.send_error)),  # item text is not rich markup
            latency,
        )
    if len(jobs) > max_rows:
        table.caption = f"first {max_rows} of {len(jobs)} jobs"
    print_fitted(console, table)
    return provenance_lines([j.submission.result for j in jobs])


def ranking_outcome(job: Job, result: Result | None, send_error: str | None) -> str:
    """The ranking cell: one line per ranked item, best first, or what became of the job instead."""
    if result is None:
        return "TIMED OUT" if send_error is None else f"NOT SENT: {send_error}"
    if result.error is not None:
        return f"ERROR {result.error.code.value}: {result.error.message}"
    if result.ranking is None:
        return "(no ranking: the job has no top_n)"
    return "\n".join(ranking_lines(job, result))
