"""What only a GPU shows: each test compares the CUDA path with an independent reference.

References: the dense SDPA backend with an explicit mask (attention), the plain `log_softmax` + gather
formula (label kernel), and the same checkpoint scored on the CPU (packing and the device thread).
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch

from kafka_scorer.wire.protocol import Job

pytestmark = pytest.mark.cuda


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


def test_compiled_flex_matches_dense_over_many_blocks(cuda_scorer_for) -> None:
    flex = cuda_scorer_for("flex")
    dense = cuda_scorer_for("dense")
    jobs = _jobs(random.Random(0), 12, flex.loaded.input_vocab_size, long=True)
    assert _max_diff(flex.score_jobs(jobs), dense.score_jobs(jobs)) <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_autotuned_label_kernel_matches_log_softmax(dtype: torch.dtype) -> None:
    from kafka_scorer.engine.kernels.label_scores import label_logprobs

    generator = torch.Generator(device="cuda").manual_seed(0)
    rows, vocab, hidden = 1000, 32_000, 512
    h = torch.randn(rows, hidden, device="cuda", generator=generator).to(dtype)
    w = (torch.randn(vocab, hidden, device="cuda", generator=generator) / hidden**0.5).to(dtype)
    ids = torch.randint(0, vocab, (rows, 3), device="cuda", generator=generator)
    got = label_logprobs(h, w, None, ids, backend="triton")
    reference = torch.log_softmax(h.float() @ w.float().T, dim=-1).gather(1, ids)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(got, reference, atol=tolerance, rtol=0), (got - reference).abs().max().item()


def test_pinned_packing_and_device_thread_over_many_batches(cuda_scorer_for, tiny_models) -> None:
    """The worker's two threads (pack with pinned host buffers, forward on the device thread) over many
    batches of varied shapes give the CPU's scores."""
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.worker.batcher import Batcher

    gpu = cuda_scorer_for("cascade")
    cpu = Scorer(str(tiny_models.get("qwen3", "causal")), dtype="float32", device="cpu")
    jobs = _jobs(random.Random(1), 120, gpu.loaded.input_vocab_size, long=False)
    done: dict[str, object] = {}

    async def run() -> None:
        batcher = Batcher(
            gpu,
            lambda batch: done.update({r.id: r for r in batch.results}),
            max_batch_tokens=2048,
            max_batch_wait_ms=1,
        )
        task = asyncio.create_task(batcher.run())
        for job in jobs:
            batcher.add(gpu.prepare(job, job.id), job.id)
            await asyncio.sleep(0)
        batcher.drain()
        while len(done) < len(jobs):
            await asyncio.sleep(0.01)
        task.cancel()
        batcher.close()

    asyncio.run(asyncio.wait_for(run(), 300))
    got = [done[job.id] for job in jobs]
    assert _max_diff(got, cpu.score_jobs(jobs)) <= 1e-4


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_second_gpu_is_used_for_everything(cuda_scorer_for) -> None:
    """`device=cuda:1`: weights, activations and the Triton launches all on GPU 1, scores as on GPU 0."""
    first = cuda_scorer_for("cascade", device="cuda:0")
    second = cuda_scorer_for("cascade", device="cuda:1")
    assert next(second.loaded.model.parameters()).device == torch.device("cuda:1")
    jobs = _jobs(random.Random(2), 6, second.loaded.input_vocab_size, long=False)
    assert _max_diff(second.score_jobs(jobs), first.score_jobs(jobs)) <= 1e-4


def test_flex_recompiles_are_bounded_across_varied_batches(cuda_scorer_for) -> None:
    """Dynamic shapes: 50 batches of different sizes must not compile 50 graphs."""
    from torch._dynamo.utils import counters

    flex = cuda_scorer_for("flex")
    rng = random.Random(3)
    flex.score_jobs(_jobs(rng, 2, flex.loaded.input_vocab_size, long=False))  # first compile
    before = counters["stats"]["unique_graphs"]
    for _ in range(50):
        flex.score_jobs(_jobs(rng, rng.randint(1, 4), flex.loaded.input_vocab_size, long=False))
    assert counters["stats"]["unique_graphs"] - before <= 4
