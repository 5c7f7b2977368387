"""The late-interaction kind on CUDA: pinned packing, the pair groups with a key mask over the query's
expansion tokens, MaxSim and the embedding cache on the device.

Reference: the same checkpoint and jobs on the CPU with the cache off (which the CPU suite checks against
sentence-transformers' MultiVectorEncoder, tests/engine/late_interaction/). Written without a GPU at
hand: run it with `./dev test -m cuda tests/cuda_tests` where one is.
"""

from __future__ import annotations

import pytest

from kafka_scorer.wire.protocol import Job
from tests.cuda_tests.devices import DEVICES
from tests.engine.passages import PASSAGES, QUERIES


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attend", [False, True])
def test_colbert_scores_on_the_device_equal_the_cpu(tmp_path, attend, device):
    from kafka_scorer.checkpoints.tiny_colbert import build_tiny_colbert
    from kafka_scorer.engine.scorer import Scorer

    path = str(build_tiny_colbert(tmp_path / "colbert", attend_to_expansion_tokens=attend))
    gpu = Scorer(path, dtype="float32", device=device, embedding_cache_mb=16)
    cpu = Scorer(path, dtype="float32", device="cpu", embedding_cache_mb=0)
    jobs = [Job(id=str(i), query=q, items=PASSAGES[i : i + 6]) for i, q in enumerate(QUERIES[:4])]
    for _ in range(2):  # the second round reads the cache on the GPU
        for got, expected in zip(gpu.score_jobs(jobs), cpu.score_jobs(jobs)):
            assert got.error is None
            assert [r[0] for r in got.scores] == pytest.approx([r[0] for r in expected.scores], abs=1e-4)
    assert gpu.describe().embedding_cache.hits > 0
