"""The warm-up tunes and compiles the Triton label kernels at every row bucket and label tile a forward
can bring (engine/load/warm_up.py `_ready_label_kernels`), so no autotune or compile lands on a live batch;
scores stay the reference's, and a kernel that fails there hands the labels to torch with one line.
Run under triton's interpreter (`_interpreted_label_warm_up.py`), which launches the same kernels on
CPU tensors; what tuning costs on a GPU is for `./dev gpu-check`."""

from __future__ import annotations

from pathlib import Path

from tests.engine.kernel_tests.interpreter import run_interpreted
from tests.engine.reference import reference_scores
from tests.engine.test_causal_scores import ITEMS, QUERY, assert_close


def test_the_warm_up_tunes_every_row_bucket_and_label_tile_and_scores_stay_the_reference(
    tiny_models, tmp_path: Path
) -> None:
    path = tiny_models.get()
    labels = [5, 9, 11]
    job = {"path": str(path), "query": QUERY, "items": ITEMS, "labels": labels}  # apply_softmax: false
    saw = run_interpreted("_interpreted_label_warm_up.py", job, tmp_path)

    # a budget of 64 tokens: at most 64 scoring rows per forward; max_labels_per_job=4
    assert {1, 2, 4, 8, 16, 32, 64} <= set(saw["launches"]["lse"])
    assert max(saw["launches"]["lse"]) <= 64
    assert {1, 2, 4} <= set(saw["launches"]["dots"])
    assert saw["backend"] == "triton"
    assert saw["error"] is None
    assert_close(saw["scores"], reference_scores(path, QUERY, ITEMS, labels, False))

    assert saw["failed_backend"] == "torch"
    warned = [
        line
        for line in saw["failed_lines"]
        if "the Triton label kernels failed at the model's shapes" in line
    ]
    assert len(warned) == 1 and "out of resources: shared memory" in warned[0]
    assert not any("label kernels tuned" in line for line in saw["failed_lines"])
