"""The `images` workload: a product search over photos with a vision-language reranker (SPEC §11).

Jobs in the rerank shape: a text query against documents that are a photo with a short caption
(random pictures of seeded, varied sizes; the model's processor scales each into its pixel range), a
few text-only documents among them. A random Qwen3-VL reranker of the bench's size
(`checkpoints/tiny_vision.py`), CPU float32, the `qwen3-vl-reranker` template. Three contenders score
the same jobs, engine alone (no Kafka), the fastest of `repeats` runs kept:

- `transformers`: what a user writes by hand: each (query, document) pair's prompt rendered, its
  images through the checkpoint's slow image processor, `Qwen3VLForConditionalGeneration` on that one
  pair, the labels read from the last token's logits. The reference every other row must match.
- `pairs`: this engine with `multi_item: false` (every pair whole, many jobs' pairs in one forward).
- `mis`: this engine with MIS (the query's prompt once per job, each document after it with its
  own pair's M-RoPE positions).

The vision-feature cache is off in both engine runs (every image is encoded each time, as by the
reference); `feature_cache` reports a second MIS run with it on, the images seen again.
"""

from __future__ import annotations

import inspect
import io
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from kafka_scorer.engine.api import Scorer, slow_image_processor_class
from kafka_scorer.wire.protocol import Job
from kafka_scorer_bench.summary import max_abs_diff


@dataclass(frozen=True)
class ImageShape:
    jobs: int = 4
    docs_per_job: int = 8
    text_docs: int = 2
    """Documents per job that are a caption alone."""
    edge_min: int = 64
    edge_max: int = 320
    max_image_tokens: int = 64
    hidden_size: int = 256
    num_layers: int = 4


QUICK_SHAPE = ImageShape(jobs=2, docs_per_job=3, text_docs=1, edge_min=24, edge_max=80, max_image_tokens=16,
                         hidden_size=64, num_layers=2)  # fmt: skip
"""Seconds, for the tests."""

_SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
)
_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."
"""The Qwen3-VL-Reranker model card's prompt, written out here: the reference builds it by hand."""
_WORDS = ["red", "blue", "running", "shoe", "leather", "bag", "trail", "summer", "dress", "black", "watch"]


def build_image_jobs(shape: ImageShape, *, seed: int = 0) -> list[Job]:
    """Rerank-shaped jobs with photo documents; same shape and seed -> the same jobs, byte for byte."""
    from PIL import Image

    rng = random.Random(f"images:{seed}")

    def photo() -> bytes:
        width, height = (
            rng.randint(shape.edge_min, shape.edge_max),
            rng.randint(shape.edge_min, shape.edge_max),
        )
        pixels = bytes(rng.getrandbits(8) for _ in range(width * height * 3))
        out = io.BytesIO()
        Image.frombytes("RGB", (width, height), pixels).save(out, "PNG")
        return out.getvalue()

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(n))

    jobs = []
    for number in range(shape.jobs):
        documents: list[Any] = [words(6) for _ in range(shape.text_docs)]
        for _ in range(shape.docs_per_job - shape.text_docs):
            parts = [{"type": "image", "image": photo()}, {"type": "text", "text": words(3)}]
            documents.append({"content": parts})
        jobs.append(Job(id=f"images-{number}", query=words(4), documents=documents))
    return jobs


class TransformersPairs:
    """The hand-written reference: one pair at a time through transformers (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

        self.model: Any = Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path)
        self.processor: Any = slow_image_processor_class().from_pretrained(path)
        self.labels = [self.tokenizer.convert_tokens_to_ids(t) for t in ("yes", "no")]
        self.marks_image_tokens = "mm_token_type_ids" in inspect.signature(self.model.forward).parameters

    def score(self, job: Job) -> list[list[float]]:
        documents = job.documents if job.documents is not msgspec.UNSET else []
        return [self._pair(str(job.query), document) for document in documents]

    @torch.inference_mode()
    def _pair(self, query: str, document: Any) -> list[float]:
        from PIL import Image

        text, images = document, []
        if isinstance(document, dict):
            text = ""
            for part in document["content"]:
                if part["type"] == "image":
                    images.append(Image.open(io.BytesIO(part["image"])))
                    text += "<|vision_start|><|image_pad|><|vision_end|>"
                else:
                    text += part["text"]
        prompt = _SYSTEM + f"<|im_start|>user\n<Instruct>: {_INSTRUCTION}<Query>:{query}\n<Document>:{text}"
        prompt += "<|im_end|>\n<|im_start|>assistant\n"
        inputs: dict[str, Any] = {}
        if images:
            out = self.processor(images=images, return_tensors="pt")
            count = int(out["image_grid_thw"].prod()) // self.processor.merge_size**2
            prompt = prompt.replace("<|image_pad|>", "<|image_pad|>" * count)
            inputs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        encoded = self.tokenizer(prompt, return_tensors="pt")
        inputs.update(encoded)
        if images and self.marks_image_tokens:  # newer transformers compute M-RoPE from a type mask
            inputs["mm_token_type_ids"] = (encoded["input_ids"] == self.model.config.image_token_id).long()
        logits = self.model(**inputs).logits[0, -1].float()
        return torch.log_softmax(logits, -1)[self.labels].exp().tolist()


def _timed(score, jobs: list[Job], repeats: int) -> tuple[float, list]:
    best, rows = float("inf"), []
    for _ in range(repeats):
        started = time.perf_counter()
        rows = score(jobs)
        best = min(best, time.perf_counter() - started)
    return best, rows


def run_images_bench(
    *, quick: bool = False, seed: int = 0, repeats: int = 2, max_batch_tokens: int = 8192, log=print
) -> dict[str, Any]:
    from kafka_scorer.checkpoints.tiny_vision import build_tiny_vl_reranker

    shape = QUICK_SHAPE if quick else ImageShape()
    jobs = build_image_jobs(shape, seed=seed)
    items = sum(len(job.inputs) for job in jobs)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vl_reranker(
            Path(tmp) / "vl", seed=seed, hidden_size=shape.hidden_size, num_layers=shape.num_layers,
            max_image_tokens=shape.max_image_tokens,
        )  # fmt: skip
        options: dict[str, Any] = {"dtype": "float32", "device": "cpu", "template": "qwen3-vl-reranker"}
        scorer = Scorer(str(path), max_batch_tokens=max_batch_tokens, embedding_cache_mb=0, **options)
        cached = Scorer(str(path), max_batch_tokens=max_batch_tokens, **options)
        reference = TransformersPairs(path)
        log(f"images: {len(jobs)} jobs, {items} documents")
        report: dict[str, Any] = {"shape": asdict(shape), "jobs": len(jobs), "items": items, "contenders": {}}
        seconds, want = _timed(lambda js: [reference.score(j) for j in js], jobs, repeats)
        report["contenders"]["transformers"] = {"seconds": seconds, "items_per_s": items / seconds}
        for name, engine, multi_item in (
            ("pairs", scorer, False),
            ("mis", scorer, None),
            ("feature_cache", cached, None),
        ):
            batch = [msgspec.structs.replace(job, multi_item=multi_item) for job in jobs]
            seconds, results = _timed(engine.score_jobs, batch, repeats)
            report["contenders"][name] = {
                "seconds": seconds,
                "items_per_s": items / seconds,
                "prompt_tokens": sum(r.prompt_tokens for r in results),
                "max_abs_diff": max_abs_diff([r.scores for r in results], want),
            }  # fmt: skip
    engines = [report["contenders"][name] for name in ("pairs", "mis", "feature_cache")]
    report["ok"] = all(entry["max_abs_diff"] <= 1e-4 for entry in engines)
    return report


def format_images_report(report: dict[str, Any]) -> str:
    lines = [f"images: {report['jobs']} jobs, {report['items']} documents (CPU float32)"]
    lines.append(f"{'contender':<14} {'items/s':>9} {'seconds':>8} {'tokens':>8} {'max |diff|':>11}")
    for name, entry in report["contenders"].items():
        tokens = entry.get("prompt_tokens", "")
        diff = f"{entry['max_abs_diff']:.2e}" if "max_abs_diff" in entry else "reference"
        lines.append(
            f"{name:<14} {entry['items_per_s']:>9.1f} {entry['seconds']:>8.2f} {tokens!s:>8} {diff:>11}"
        )
    return "\n".join(lines)
