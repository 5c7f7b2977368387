"""What only a GPU shows, each test compared with an independent reference, and run on the CPU too.

References: the dense SDPA backend with an explicit mask (attention), the plain `log_softmax` + gather
formula (label kernel), and the same checkpoint scored on the CPU (packing and the device thread).
Each test takes the device as a parameter (`devices.py`): the `cpu` variant runs the same calls with
fewer jobs in CI, so the tier cannot drift from the code it tests; the `cuda` variant is the GPU check.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES, on_cuda


def _jobs(rng: random.Random, count: int, vocab: int, long: bool) -> list[Job]:
    """Token-id jobs whose packed sequences span many 128-token blocks (long) or vary widely (not)."""
    jobs = []
    for index in range(count):
        query_len = rng.randint(150, 400) if long else rng.randint(1, 60)
        items = [
            [rng.randrange(vocab) for _ in range(rng.randint(0 if not long else 40, 300 if long else 90))]
            for _ in range(rng.randint(1, 8))
        ]
        jobs.append(
            Job(
                id=str(index),
                query=[rng.randrange(vocab) for _ in range(query_len)],
                items=items,
                label_token_ids=[rng.randrange(vocab) for _ in range(rng.randint(1, 4))],
                multi_item=True,
            )
        )
    return jobs


def _max_diff(a, b) -> float:
    worst = 0.0
    for ra, rb in zip(a, b, strict=True):
        assert ra.error is None and rb.error is None, (ra.error, rb.error)
        for row_a, row_b in zip(ra.scores, rb.scores, strict=True):
            worst = max(worst, *(abs(x - y) for x, y in zip(row_a, row_b, strict=True)))
    return worst


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_flex_matches_dense_over_many_blocks(scorer_for, device: str) -> None:
    """Compiled on CUDA; on the CPU flex runs its eager kernel through the same metadata and calls."""
    flex = scorer_for("flex", device)
    dense = scorer_for("dense", device)
    jobs = _jobs(
        random.Random(0), 12 if on_cuda(device) else 2, flex.describe().loaded.input_vocab_size, long=True
    )
    assert _max_diff(flex.score_jobs(jobs), dense.score_jobs(jobs)) <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_autotuned_label_kernel_matches_log_softmax(dtype: torch.dtype, device: str) -> None:
    """The Triton kernel on CUDA; on the CPU the streamed torch path behind the same call (the kernel
    itself is checked on the CPU under the Triton interpreter, tests/engine/kernel_tests)."""
    from kafka_scorer.engine.kernels.label_scores import label_logprobs

    generator = torch.Generator(device=device).manual_seed(0)
    rows, vocab, hidden = (1000, 32_000, 512) if on_cuda(device) else (64, 3_000, 64)
    h = torch.randn(rows, hidden, device=device, generator=generator).to(dtype)
    w = (torch.randn(vocab, hidden, device=device, generator=generator) / hidden**0.5).to(dtype)
    ids = torch.randint(0, vocab, (rows, 3), device=device, generator=generator)
    got = label_logprobs(h, w, None, ids, backend="triton" if on_cuda(device) else "torch")
    reference = torch.log_softmax(h.float() @ w.float().T, dim=-1).gather(1, ids)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, reference, atol=tolerance, rtol=0), (got - reference).abs().max().item()


def _ticket(scorer, job: Job):
    """A ticket as the worker's intake queues it: prepared, its tokens counted, enqueued now."""
    from aiokafka import TopicPartition

    from kafka_scorer.kafka.offsets import Watermark
    from kafka_scorer.worker.envelope import Origin
    from kafka_scorer.worker.ticket import Ticket

    origin = Origin("jobs", 0, int(job.id), None, "results", "json", None)
    ticket = Ticket(TopicPartition("jobs", 0), origin, job.id, Watermark(), time.monotonic(), None)
    ticket.prepared = scorer.engine.prepare(job, job.id)
    ticket.tokens = ticket.prepared.num_tokens
    ticket.enqueued_at = time.monotonic()
    return ticket


@pytest.mark.parametrize("device", DEVICES)
def test_pinned_packing_and_device_thread_over_many_batches(scorer_for, tiny_models, device: str) -> None:
    """The worker's two threads (pack with pinned host buffers on CUDA, forward on the device thread)
    over many batches of varied shapes give the CPU's scores, computed one call at a time."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.worker.batcher import Batcher

    scorer = scorer_for("cascade", device)
    reference = Scorer(str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu")
    count = 120 if on_cuda(device) else 24
    jobs = _jobs(random.Random(1), count, scorer.describe().loaded.input_vocab_size, long=False)
    done: dict[str, object] = {}

    async def run() -> None:
        batcher = Batcher(
            scorer.engine,
            lambda batch: done.update({t.job_id: t.result for t in batch.tickets}),
            max_batch_tokens=2048 if on_cuda(device) else 512,
            max_batch_wait_ms=1,
        )
        task = asyncio.create_task(batcher.run())
        try:
            for job in jobs:
                batcher.add(_ticket(scorer, job))
                await asyncio.sleep(0)
            batcher.drain()
            while len(done) < len(jobs):
                assert not task.done(), task.exception()
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            batcher.close()

    asyncio.run(asyncio.wait_for(run(), 300))
    got = [done[job.id] for job in jobs]
    assert _max_diff(got, reference.score_jobs(jobs)) <= 1e-4


SECOND_DEVICE = [
    pytest.param(("cpu", "cpu"), id="cpu"),
    pytest.param(
        ("cuda:0", "cuda:1"),
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
        ],
    ),
]


@pytest.mark.parametrize("devices", SECOND_DEVICE)
def test_second_gpu_is_used_for_everything(scorer_for, devices: tuple[str, str]) -> None:
    """`device=cuda:1`: weights, activations and the Triton launches all on GPU 1, scores as on GPU 0
    (on the CPU: an explicit device string reaches the weights the same way)."""
    first_device, second_device = devices
    first = scorer_for("cascade", first_device)
    second = scorer_for("cascade", second_device)
    assert next(second.describe().loaded.model.parameters()).device == torch.device(second_device)
    jobs = _jobs(random.Random(2), 6, second.describe().loaded.input_vocab_size, long=False)
    assert _max_diff(second.score_jobs(jobs), first.score_jobs(jobs)) <= 1e-4


@pytest.mark.parametrize("device", DEVICES)
def test_flex_recompiles_are_bounded_across_varied_batches(scorer_for, device: str) -> None:
    """Dynamic shapes: 50 batches of different sizes must not compile 50 graphs (on the CPU flex runs
    eagerly, so nothing compiles: the variant keeps the varied batches running through flex)."""
    from torch._dynamo.utils import counters

    flex = scorer_for("flex", device)
    rng = random.Random(3)
    flex.score_jobs(_jobs(rng, 2, flex.describe().loaded.input_vocab_size, long=False))  # first compile
    before = counters["stats"]["unique_graphs"]
    for _ in range(50 if on_cuda(device) else 8):
        flex.score_jobs(_jobs(rng, rng.randint(1, 4), flex.describe().loaded.input_vocab_size, long=False))
    assert counters["stats"]["unique_graphs"] - before <= 4
