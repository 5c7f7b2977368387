"""Token buckets and the padding that takes a forward to one (`engine/pack/buckets.py`).

Checked against their stated rules, by generated stream lengths: a bucket is the smallest that holds
the stream, padding sequences end on FlexAttention block boundaries, and a padded batch has the same
scoring rows and the same block index for its real tokens as the unpadded one.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scorer.engine.attention.flex import BLOCK, kv_blocks
from kafka_scorer.engine.pack.buckets import GraphBuckets, padding_lengths


def test_buckets_double_to_1024_then_step_by_1024_up_to_the_largest():
    assert GraphBuckets.up_to(8192).sizes == (128, 256, 512, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192)
    assert GraphBuckets.up_to(700).sizes == (128, 256, 512, 768)
    assert GraphBuckets.up_to(0).sizes == ()
    assert GraphBuckets.up_to(0).bucket_for(1) is None


@given(st.integers(1, 20000), st.integers(1, 9000))
def test_the_bucket_is_the_smallest_that_holds_the_stream(largest, tokens):
    buckets = GraphBuckets.up_to(largest)
    assert all(size % BLOCK == 0 for size in buckets.sizes)
    assert list(buckets.sizes) == sorted(set(buckets.sizes))
    bucket = buckets.bucket_for(tokens)
    if bucket is None:
        assert tokens > buckets.sizes[-1]
    else:
        assert bucket >= tokens and not any(tokens <= size < bucket for size in buckets.sizes)


@given(st.integers(0, 9000), st.integers(0, 3000))
def test_padding_fills_to_the_bucket_in_block_aligned_sequences(tokens, extra):
    bucket = -(-(tokens + extra) // BLOCK) * BLOCK
    lengths = padding_lengths(tokens, bucket)
    assert sum(lengths) == bucket - tokens and all(0 < n <= BLOCK for n in lengths)
    end = tokens
    for n in lengths:  # each padding sequence lies within one block and ends where the block does
        assert end // BLOCK == (end + n - 1) // BLOCK
        end += n
        assert end % BLOCK == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(1, 90), min_size=1, max_size=6), min_size=1, max_size=5))
def test_a_padded_batch_keeps_its_rows_and_its_real_blocks(items_per_job):
    import torch

    from kafka_scorer.engine.pack.batch import build_forward_batch
    from kafka_scorer.engine.prepare.prepared import PreparedJob
    from kafka_scorer.wire.protocol import Job

    def prepared(n: int, lens: list[int]) -> PreparedJob:
        query, items = [5 + n] * (7 + n), [[6] * k for k in lens]
        return PreparedJob(
            str(n), Job(query=query, items=items), query, items, True, [3], len(query) + sum(lens)
        )

    jobs = [prepared(n, lens) for n, lens in enumerate(items_per_job)]
    plain = build_forward_batch(jobs, device=torch.device("cpu"), attention_backend="flex")
    buckets = GraphBuckets.up_to(4096)
    padded = build_forward_batch(
        jobs, device=torch.device("cpu"), attention_backend="flex", pad_to=buckets.bucket_for
    )
    assert padded.num_tokens == buckets.bucket_for(plain.num_tokens)
    assert torch.equal(padded.score_index, plain.score_index) and padded.job_rows == plain.job_rows
    assert torch.equal(padded.input_ids[: plain.num_tokens], plain.input_ids)
    real_blocks = -(-plain.num_tokens // BLOCK)
    counts, indices = kv_blocks(padded.layout)
    want_counts, want_indices = kv_blocks(plain.layout)
    # the real tokens' blocks list the same key blocks; a padding block lists only itself
    for qb in range(real_blocks):
        assert set(indices[qb, : counts[qb]].tolist()) == set(want_indices[qb, : want_counts[qb]].tolist())
    for qb in range(real_blocks, padded.num_tokens // BLOCK):
        assert indices[qb, : counts[qb]].tolist() == [qb]
