"""A Qwen3-VL reranker's scores equal transformers one pair at a time (float32, 1e-4), for every way a
job can carry images, alone and batched with other jobs, packed (MIS) and pair by pair (SPEC §11)."""

from __future__ import annotations

import msgspec
import pytest

from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart
from kafka_scorer.wire.protocol import ErrorCode, Job
from tests.engine.vision.images import picture
from tests.engine.vision.reference import Reference, raw_prompt

TOLERANCE = 1e-4
RED, BLUE, WIDE = picture(50, 40, seed=1), picture(33, 70, seed=2), picture(120, 30, seed=3)


@pytest.fixture(scope="module")
def reference(tiny_vl) -> Reference:
    return Reference(tiny_vl)


@pytest.fixture(scope="module")
def scorer(vision_scorer):
    return vision_scorer(template="qwen3-vl-reranker")


@pytest.fixture(scope="module")
def labels(reference) -> list[int]:
    return [reference.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]


def content(*parts: str | bytes) -> Content:
    return Content([ImagePart(ImageData(p)) if isinstance(p, bytes) else TextPart(p) for p in parts])


def parts_of(value: str | Content) -> list:
    if isinstance(value, str):
        return [value]
    return [p.image.data if isinstance(p, ImagePart) else p.text for p in value.content]


def expected(reference: Reference, job: Job, labels: list[int]) -> list[list[float]]:
    rows = []
    for item in job.inputs:
        item = (
            item
            if not isinstance(item, dict)
            else content(*[p.get("image") or p["text"] for p in item["content"]])
        )
        text, images = reference.prompt(parts_of(job.query), parts_of(item))
        rows.append(reference.scores(text, images, labels, job.apply_softmax))
    return rows


def assert_close(rows: list[list[float]] | None, want: list[list[float]]) -> None:
    assert rows is not None and len(rows) == len(want)
    for got, ref in zip(rows, want):
        assert got == pytest.approx(ref, abs=TOLERANCE)


JOBS = {
    "text->image": Job(id="t2i", query="a red square", items=[content(RED), content(BLUE), "plain text"]),
    "image->text": Job(
        id="i2t", query=content(RED), items=["a red square", "a blue sky"], apply_softmax=True
    ),
    "mixed": Job(id="mix", query=content("which one?", BLUE), items=[content("left", RED, "right"), "none"]),
    "several images": Job(
        id="many", query=content(RED, WIDE), items=[content(BLUE, RED, WIDE), content(WIDE)]
    ),
    "text only": Job(id="text", query="rivers", items=["mountains", "oceans"]),
}


@pytest.mark.parametrize("name", list(JOBS))
def test_one_job_equals_transformers_pair_by_pair(scorer, reference, labels, name: str) -> None:
    """MIS on (the default for two items or more) and off: the same scores, fewer tokens packed."""
    want = expected(reference, JOBS[name], labels)
    [packed] = scorer.score_jobs([JOBS[name]])
    [pairs] = scorer.score_jobs([msgspec.structs.replace(JOBS[name], multi_item=False)])
    for result in (packed, pairs):
        assert result.ok, result.error
        assert_close(result.scores, want)
        assert result.template is not None and result.template.name == "qwen3-vl-reranker"
    assert packed.prompt_tokens < pairs.prompt_tokens  # the query's prompt and images ran once


def test_an_image_query_is_computed_once_when_packed(scorer, reference, labels) -> None:
    """Every item sees the query's image; packed, its tokens are in the sequence once."""
    job = Job(id="q", query=content(WIDE, "find this"), items=["a", "b", "c"], multi_item=True)
    [packed] = scorer.score_jobs([job])
    [pairs] = scorer.score_jobs([msgspec.structs.replace(job, multi_item=False)])
    assert_close(packed.scores, expected(reference, job, labels))
    image_tokens = pairs.prompt_tokens - packed.prompt_tokens
    assert image_tokens > 2 * reference.tokenizer("find this", return_length=True)["length"][0]


def test_several_jobs_in_one_batch_and_cut_across_forwards(vision_scorer, reference, labels) -> None:
    """Every job of the table in one batch, once in one forward and once with a budget small enough
    to cut them into several (jobs split between their pairs, each piece with its own images)."""
    jobs = list(JOBS.values())
    want = [expected(reference, job, labels) for job in jobs]
    for budget in (0, 300):
        scorer = vision_scorer(template="qwen3-vl-reranker", max_batch_tokens=budget)
        for multi_item in (None, False):
            batch = [msgspec.structs.replace(job, multi_item=multi_item) for job in jobs]
            for job, result, rows in zip(batch, scorer.score_jobs(batch), want):
                assert result.ok and result.id == job.id, result.error
                assert_close(result.scores, rows)


def test_the_rerank_shape_with_image_documents(scorer, reference, labels) -> None:
    document = {"content": [{"type": "image", "image": RED}, {"type": "text", "text": "caption"}], "id": 7}
    job = Job(id="rr", query="red", documents=["blue", document], top_n=1, return_documents=True)
    [result] = scorer.score_jobs([job])
    rows = expected(reference, job, labels)
    relevance = [row[0] / sum(row) for row in rows]  # the model card's sigmoid(yes - no)
    best = max(range(2), key=lambda i: relevance[i])
    assert result.results is not None and [r.index for r in result.results] == [best]
    assert result.results[0].relevance_score == pytest.approx(relevance[best], abs=TOLERANCE)
    assert result.results[0].document == (document if best == 1 else {"text": "blue"})


def test_image_tokens_count_in_the_budget(scorer, reference) -> None:
    [text] = scorer.score_jobs([Job(id="a", query="q", items=["x"])])
    [image] = scorer.score_jobs([Job(id="b", query="q", items=[content("x", RED)])])
    processed = reference.processor(images=[reference.prompt([], [RED])[1][0]], return_tensors="pt")
    tokens = int(processed["image_grid_thw"].prod()) // 4
    assert image.prompt_tokens - text.prompt_tokens == tokens + 2  # + vision_start and vision_end


@pytest.mark.parametrize(
    ("job", "code", "words"),
    [
        (
            Job(id="m", query=content(RED), items=["a", "b"], multi_item=True, item_first=True),
            ErrorCode.INVALID_REQUEST,
            "item_first",
        ),
        (Job(id="t", query=[1, 2], items=[[3]]), ErrorCode.UNSUPPORTED, "token ids"),
        (Job(id="s", query="<|image_pad|>", items=["a"]), ErrorCode.INVALID_REQUEST, "stands for an image"),
        (
            Job(id="n", query=content(*[RED] * 3), items=[content(BLUE)]),
            ErrorCode.INVALID_REQUEST,
            "max_images",
        ),
    ],
)
def test_what_the_kind_does_not_do_is_a_typed_error(
    vision_scorer, job: Job, code: ErrorCode, words: str
) -> None:
    scorer = vision_scorer(template="qwen3-vl-reranker", max_images_per_job=3)
    [result] = scorer.score_jobs([job])
    assert result.error is not None and result.error.code is code and words in result.error.message


def test_a_pair_too_long_is_too_long_or_unsupported_when_asked_to_cut(vision_scorer) -> None:
    scorer = vision_scorer(template="qwen3-vl-reranker", max_pair_tokens=140)  # the prompt alone is ~127
    long = content(RED, WIDE, BLUE, RED, WIDE, BLUE)
    job = Job(id="long", query="q", items=["short", long])
    [plain] = scorer.score_jobs([job])
    assert plain.error is not None and plain.error.code is ErrorCode.TOO_LONG and plain.error.item == 1
    [cut] = scorer.score_jobs([Job(id="cut", query="q", items=[long], truncate=True)])
    assert cut.error is not None and cut.error.code is ErrorCode.UNSUPPORTED


def test_an_image_seen_again_reuses_its_vision_features(vision_scorer, reference, labels) -> None:
    """The feature cache (`embedding_cache_mb`): a second job with the same document images hits it for
    each of them, and its scores still equal transformers'."""
    scorer = vision_scorer(template="qwen3-vl-reranker", embedding_cache_mb=8)
    first = Job(id="first", query="red?", items=[content(RED), content("caption", BLUE)])
    second = Job(id="second", query="blue?", items=[content(BLUE), content(RED, WIDE)])
    before = scorer.describe().embedding_cache
    scorer.score_jobs([first])
    middle = scorer.describe().embedding_cache
    [result] = scorer.score_jobs([second])
    after = scorer.describe().embedding_cache
    assert before is not None and middle is not None and after is not None
    assert (middle.misses - before.misses, middle.hits - before.hits) == (2, 0)
    assert (after.hits - middle.hits, after.misses - middle.misses) == (2, 1)  # RED and BLUE; WIDE is new
    assert_close(result.scores, expected(reference, second, labels))
    assert scorer.engine.stats().embedding_cache is not None


def test_pooled_states_and_item_first_without_a_template(vision_scorer, reference, labels) -> None:
    """No template: the pair is query then item (`item_first`: item then query), label ids as sent;
    the pooled state is the last token's final-norm hidden state, packed or not."""
    import torch

    scorer = vision_scorer()
    for item_first, multi_item in ((False, None), (False, False), (True, None)):
        job = Job(
            id="raw", query=content("q ", RED), items=[content(BLUE, " a"), " b"], label_token_ids=labels,
            item_first=item_first, multi_item=multi_item, return_pooled_hidden_states=True,
        )  # fmt: skip
        [result] = scorer.score_jobs([job])
        assert result.ok and result.pooled_hidden_states is not None, result.error
        pooled = torch.frombuffer(bytearray(result.pooled_hidden_states.data), dtype=torch.float32)
        pooled = pooled.reshape(result.pooled_hidden_states.shape)
        for index, item in enumerate(job.inputs):
            first, second = (
                (parts_of(item), parts_of(job.query)) if item_first else (parts_of(job.query), parts_of(item))
            )
            text, images = raw_prompt(first + second)
            assert result.scores[index] == pytest.approx(
                reference.scores(text, images, labels), abs=TOLERANCE
            )
            assert pooled[index].tolist() == pytest.approx(
                _last_state(reference, text, images), abs=TOLERANCE
            )


def _last_state(reference: Reference, text: str, images: list) -> list[float]:
    """transformers' final-norm hidden state at the pair's last token (its text model's norm output)."""

    captured = {}
    hook = reference.model.model.language_model.norm.register_forward_hook(
        lambda module, args, out: captured.setdefault("state", out)
    )
    try:
        reference.scores(text, images, [0])
    finally:
        hook.remove()
    return captured["state"][0, -1].float().tolist()
