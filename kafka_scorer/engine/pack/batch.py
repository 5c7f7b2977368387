"""ForwardBatch: several prepared jobs packed into one flat token stream, built on the CPU.

Layout of the stream, sequence after sequence, no padding (but a CUDA graph's tail, `pad_to`):
- a packed (MIS) sequence: `query | item 0 | item 1 | ...`; jobs whose query token ids are identical
  share one sequence (their items are concatenated job after job, and split back by row ranges);
- a plain pair: `query + item` (or `item + query`) as a sequence with no items;
- an encoder pair (SPEC §8): the tokenizer's pair encoding, with its token type ids and the family's
  position ids, scored at its first token (or pooled over all its tokens); attention is bidirectional
  inside the pair.
What differs between the two (positions, a lone pair's row, causal or not, token types, pooling) is the
kind's `StreamShape` (`stream_shape.py`): the packing here is one code path for both.
Every index the forward needs — where sequences start, their prefix and item lengths, the flat
position of each item's scoring token — is computed here from lengths known at tokenization time,
so nothing on the device scans `input_ids` or syncs to find a boundary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kafka_scorer.engine.attention.cached import PrefixedMetadata
from kafka_scorer.engine.attention.layout import AttentionLayout
from kafka_scorer.engine.attention.registry import AttentionMetadata, prepare_attention
from kafka_scorer.engine.pack.buckets import padding_lengths
from kafka_scorer.engine.pack.stream_shape import CAUSAL_STREAM, StreamShape
from kafka_scorer.engine.prepare.prepared import PreparedJob


@dataclass
class ForwardBatch:
    jobs: list[PreparedJob]
    input_ids: torch.Tensor
    """[T] token ids of the whole stream (CPU; pinned when the model runs on CUDA)."""
    positions: torch.Tensor
    """[T] position ids; item tokens restart at len(query) (SPEC §5)."""
    attention: AttentionMetadata | PrefixedMetadata
    """The attention backend's metadata (CPU; pinned on CUDA), built here on the packing thread and moved
    to the device once, by the runner; a batch that reads cached prefixes has the prefix cache's
    (`engine/pack/prefix_batch.py`)."""
    score_index: torch.Tensor
    """[R] flat index of each scoring row, rows in job order then item order."""
    job_rows: list[tuple[int, int]]
    """Row range [start, end) of each job."""
    label_ids: torch.Tensor
    """[R, L] each row's label ids, padded with 0 (CausalLM; L = 0 for classification)."""
    label_mask: torch.Tensor
    """[R, L] True where `label_ids` is a real label."""
    softmax_rows: torch.Tensor
    """[R] True for rows of jobs whose activation is softmax (`apply_softmax`)."""
    sigmoid_rows: torch.Tensor
    """[R] True for rows of classification jobs with `activation: sigmoid`."""
    hidden_rows: torch.Tensor
    """Rows whose pooled hidden states are returned (only jobs that asked)."""
    token_types: torch.Tensor | None = None
    """[T] token type ids of encoder pairs whose tokenizer gives them (BERT); None otherwise."""
    token_rows: torch.Tensor | None = None
    """[T] the row (pair) of each token, for encoders that pool by the mean of the pair's tokens."""

    @property
    def layout(self) -> AttentionLayout:
        return self.attention.layout

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    @property
    def any_logprob_rows(self) -> bool:
        return any(job.activation != "softmax" for job in self.jobs)

    @property
    def any_softmax_rows(self) -> bool:
        return any(job.activation == "softmax" for job in self.jobs)


@dataclass
class _Sequence:
    prefix: list[int]
    members: list[tuple[int, list[list[int]]]]
    """(job index, that job's items) in the order they are laid out after the prefix."""
    types: list[int] | None = None
    """Token type ids of an encoder pair (the whole sequence)."""
    cuts: tuple[int, ...] = ()
    """Where the prefix may be cut for the prefix cache (`AttentionLayout.cuts`)."""


def _cuts(job: PreparedJob, length: int) -> tuple[int, ...]:
    """The job's prefix marks inside a leading run of `length` tokens, in the stream's coordinates
    (a cached piece's run starts after its cached tokens)."""
    cached = getattr(job, "cached", 0)  # `prefix_batch.CachedPiece`, whose module imports this one
    return tuple(sorted({m - cached for m in job.prefix_marks if 0 < m - cached < length}))


def _group_sequences(jobs: Sequence[PreparedJob]) -> list[_Sequence]:
    sequences: list[_Sequence] = []
    shared: dict[tuple[int, ...], _Sequence] = {}
    for index, job in enumerate(jobs):
        if job.packed:
            seq = shared.get(job.query_key)
            if seq is None:
                cuts = _cuts(job, len(job.query))
                seq = shared[job.query_key] = _Sequence(prefix=job.query, members=[], cuts=cuts)
                sequences.append(seq)
            seq.members.append((index, job.items))
        else:
            types: Sequence[list[int] | None] = job.token_types or [None] * len(job.items)
            sequences.extend(
                _Sequence(prefix=pair, members=[(index, [])], types=pair_types, cuts=_cuts(job, len(pair)))
                for pair, pair_types in zip(job.items, types)
            )
    return sequences


def build_forward_batch(
    jobs: Sequence[PreparedJob],
    *,
    device: torch.device,
    attention_backend: str = "dense",
    sliding_window: int | None = None,
    shape: StreamShape = CAUSAL_STREAM,
    pad_to: Callable[[int], int | None] | None = None,
) -> ForwardBatch:
    """`shape`: how each sequence is laid out (a decoder's by default). `pad_to` maps the stream's token
    count to the count to pad it to (a CUDA graph's bucket, `engine/graphs/`), or None to leave it as it
    is; padding adds sequences, never rows. Only the engine's own decoder has graphs, so an encoder's
    kind never pads (its token types and mean-pooling rows cover its pairs only)."""
    ids: list[int] = []
    types: list[int] = []
    positions: list[int] = []
    seq_starts: list[int] = []
    seq_lens: list[int] = []
    prefix_lens: list[int] = []
    item_lens: list[tuple[int, ...]] = []
    cuts: list[tuple[int, ...]] = []
    scoring: list[list[int]] = [[] for _ in jobs]

    for seq in _group_sequences(jobs):
        start = len(ids)
        prefix_len = len(seq.prefix)
        ids.extend(seq.prefix)
        positions.extend(shape.position_ids(seq.prefix))
        types.extend(seq.types or ())
        lens: list[int] = []
        for job_index, items in seq.members:
            for item in items:
                ids.extend(item)
                positions.extend(range(prefix_len, prefix_len + len(item)))
                lens.append(len(item))
                # An empty item scores at the query's last token, exactly like the pair `query + ""`.
                scoring[job_index].append(len(ids) - 1 if item else start + prefix_len - 1)
            if not items:
                # A lone pair's row is the shape's: a decoder's last token, an encoder's first ([CLS] / <s>).
                scoring[job_index].append(shape.pair_row(start, prefix_len))
        seq_starts.append(start)
        seq_lens.append(len(ids) - start)
        prefix_lens.append(prefix_len)
        item_lens.append(tuple(lens))
        cuts.append(seq.cuts)
    target = pad_to(len(ids)) if pad_to is not None else None
    for length in padding_lengths(len(ids), target) if target else ():
        seq_starts.append(len(ids))
        seq_lens.append(length)
        prefix_lens.append(length)
        item_lens.append(())
        cuts.append(())
        ids.extend([0] * length)
        positions.extend(range(length))

    job_rows: list[tuple[int, int]] = []
    flat_scoring: list[int] = []
    for rows in scoring:
        job_rows.append((len(flat_scoring), len(flat_scoring) + len(rows)))
        flat_scoring.extend(rows)

    max_labels = max((len(job.label_ids) for job in jobs), default=0)
    label_ids: list[list[int]] = []
    label_mask: list[list[bool]] = []
    softmax_rows: list[bool] = []
    sigmoid_rows: list[bool] = []
    hidden_rows: list[int] = []
    for job, (row_start, row_end) in zip(jobs, job_rows):
        count = row_end - row_start
        padded = job.label_ids + [0] * (max_labels - len(job.label_ids))
        mask = [True] * len(job.label_ids) + [False] * (max_labels - len(job.label_ids))
        label_ids.extend([padded] * count)
        label_mask.extend([mask] * count)
        softmax_rows.extend([job.activation == "softmax"] * count)
        sigmoid_rows.extend([job.activation == "sigmoid"] * count)
        if job.job.return_pooled_hidden_states:
            hidden_rows.extend(range(row_start, row_end))

    pin = device.type == "cuda"

    def host(values: Sequence[object], dtype: torch.dtype, *shape: int) -> torch.Tensor:
        tensor = torch.tensor(values, dtype=dtype)
        if shape:
            tensor = tensor.reshape(*shape)
        return tensor.pin_memory() if pin else tensor

    row_count = len(flat_scoring)
    layout = AttentionLayout(
        seq_starts=seq_starts,
        seq_lens=seq_lens,
        prefix_lens=prefix_lens,
        item_lens=item_lens,
        sliding_window=sliding_window,
        causal=shape.causal,
        cuts=cuts,
    )
    return ForwardBatch(
        jobs=list(jobs),
        input_ids=host(ids, torch.long),
        positions=host(positions, torch.long),
        attention=prepare_attention(layout, attention_backend, pin),
        score_index=host(flat_scoring, torch.long),
        job_rows=job_rows,
        label_ids=host(label_ids, torch.long, row_count, max_labels),
        label_mask=host(label_mask, torch.bool, row_count, max_labels),
        softmax_rows=host(softmax_rows, torch.bool),
        sigmoid_rows=host(sigmoid_rows, torch.bool),
        hidden_rows=host(hidden_rows, torch.long),
        token_types=host(types, torch.long) if shape.takes_token_types else None,
        token_rows=_token_rows(seq_lens, host) if shape.mean_pooling else None,
    )


def _token_rows(seq_lens: list[int], host: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Encoder batches hold one pair per sequence, in row order, so sequence i is row i."""
    rows = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens, dtype=torch.long))
    return host(rows.tolist(), torch.long)
