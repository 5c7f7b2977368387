"""RecurrentRuns: the spans of a packed stream that a stateful layer computes, each from its own start.

A stateful layer (`recurrent/gated_delta.py`) must see each packed sequence as if it ran alone. Its
work is split into runs:
- every sequence's leading run (a plain pair, or an MIS query) starts from zero state, with nothing
  before it in its convolution window;
- every MIS item starts from its query's end: the query's last `window` tokens fill the item's
  convolution window and the query's final recurrent state is the item's initial state, so the item
  sees exactly what it would see following the query alone, and nothing of the items before it.
Runs of similar length are stacked into padded groups (at most `MAX_ROWS` rows, so the per-row state a
group holds stays bounded), leading runs first: an item's group needs its query's state. Everything is
computed here from lengths, on the CPU, like the attention metadata (`engine/pack/batch.py`).

Through the prefix cache (`RunPrefixes`, `engine/pack/prefix_batch.py`), a sequence cut after a cached head
starts from that head's state instead: its leading run from the head's final recurrent state, its
convolution window the head's last inputs (kept in the entry, appended past the stream's zero row), and
its items' windows reach back into the head's when the cut query is shorter than the window. A
sequence that computes a head (a fill, or an extension of a shorter head) hands its final state and
its last `window` inputs to the head's entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from kafka_scorer.engine.attention.layout import AttentionLayout, bucket_by_length, host, to_device

RUNS_KWARG = "scorer_recurrent_runs"
"""The forward kwarg that carries a batch's runs to the stateful layers (beside the attention metadata)."""

MAX_ROWS = 64
"""Rows of one padded group: a row holds a [heads, key_dim, value_dim] float32 state while it runs."""


@dataclass(frozen=True)
class RunGroup:
    """Runs stacked as rows of one padded call; padding slots read the stream's zero row."""

    index: torch.Tensor
    """[B, L] the stream token of each slot; padding slots hold the zero row's index (the token count)."""
    window: torch.Tensor
    """[B, W] the tokens before each run that its convolution sees (its query's last W, for an item),
    left-padded with the zero row."""
    valid: torch.Tensor
    """[B, L] True at real tokens."""
    slots: torch.Tensor
    """[N] the flat slot (row · L + column) of each real token, row-major."""
    tokens: torch.Tensor
    """[N] the stream token at each of `slots`."""
    state_from: torch.Tensor | None
    """[B] each row's initial state in the forward's state table (items); None: all start from zero."""
    keep_rows: torch.Tensor | None
    """[S] rows whose final state later runs start from (queries with items); None: none kept."""
    keep_slots: torch.Tensor | None
    """[S] where in the state table each of `keep_rows` goes."""
    source_from: torch.Tensor | None = None
    """[B] each row's initial state in the forward's table of cached heads' states (sequences cut
    after a cached head); None: not such rows."""
    store_rows: torch.Tensor | None = None
    """[S] rows whose final state a prefix entry keeps (heads computed now)."""
    store_entries: tuple[int, ...] = ()
    """The entry (index in `RecurrentRuns.entries`) each of `store_rows` goes to."""
    store_window: torch.Tensor | None = None
    """[S, W] the inputs of each stored row's last `window` positions (what a later cut convolves after)."""


class StateEntry(Protocol):
    """A prefix cache entry as the stateful layers see it (`engine/pack/prefix_cache.PrefixEntry`)."""

    def state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def store_state(self, slot: int, state: torch.Tensor, window: torch.Tensor) -> None: ...


@dataclass(frozen=True)
class RunPrefixes:
    """A forward through the prefix cache, as its stateful layers see it."""

    entries: tuple[StateEntry, ...]
    """The forward's prefix entries (`PrefixedMetadata.entries`)."""
    starts: dict[int, int] = field(default_factory=dict)
    """Stream start of a sequence cut after a cached head -> that head's entry index."""
    stores: dict[int, int] = field(default_factory=dict)
    """Stream start of a sequence that computes a head -> the entry its final state goes to."""


@dataclass(frozen=True)
class RecurrentRuns:
    groups: list[RunGroup]
    """Leading runs' groups first, then items' groups."""
    kept_states: int
    """Rows of the state table: one per query whose items start from its state."""
    tokens: int
    """Tokens of the stream; the zero row that padding reads is appended at this index."""
    entries: tuple[StateEntry, ...] = ()
    """The forward's prefix entries (a tuple: moving the runs to the device leaves them as they are)."""
    sources: tuple[int, ...] = ()
    """Entries whose states cut sequences start from: their windows follow the zero row in this order,
    and their states form the table `RunGroup.source_from` indexes."""

    def to(self, device: torch.device) -> RecurrentRuns:
        return to_device(self, device)


@dataclass(frozen=True)
class _Run:
    start: int
    length: int
    context: tuple[int, ...] = ()
    """Stream tokens before the run that its convolution window sees (an item's query tail)."""
    parent: int | None = None
    """State-table slot the run starts from; None: zero state."""
    keep: int | None = None
    """State-table slot its final state goes to; None: not kept."""
    source: int | None = None
    """Row of the cached heads' state table the run starts from (a cut sequence's leading run)."""
    store: int | None = None
    """Entry index its final state and last window go to (a head computed now)."""


def build_runs(
    layout: AttentionLayout,
    window: int,
    pin: bool = False,
    max_rows: int = MAX_ROWS,
    prefixes: RunPrefixes | None = None,
) -> RecurrentRuns:
    """The runs of `layout`'s stream for layers whose convolution sees `window` earlier tokens."""
    prefixes = prefixes or RunPrefixes(())
    tokens = layout.total_tokens
    sources = tuple(dict.fromkeys(prefixes.starts.values()))
    # the cached heads' windows follow the zero row (index `tokens`), `window` rows each
    cached_window = {entry: tokens + 1 + n * window for n, entry in enumerate(sources)}
    runs: tuple[list[_Run], list[_Run], list[_Run]] = ([], [], [])  # from zero, from a head, items
    kept = 0
    for start, prefix_len, item_lens in zip(layout.seq_starts, layout.prefix_lens, layout.item_lens):
        item_runs = _item_spans(start + prefix_len, item_lens)
        if prefix_len == 0:  # an empty query: each item is a sequence of its own
            runs[0].extend(_Run(s, n) for s, n in item_runs)
            continue
        entry = prefixes.starts.get(start)
        before = (
            [tokens] * window
            if entry is None
            else list(range(cached_window[entry], cached_window[entry] + window))
        )
        keep = kept if item_runs else None
        kept += keep is not None
        source = None if entry is None else sources.index(entry)
        store = prefixes.stores.get(start)
        runs[entry is not None].append(
            _Run(start, prefix_len, tuple(before), keep=keep, source=source, store=store)
        )
        tail = tuple([*before, *range(start, start + prefix_len)][-window:]) if window else ()
        runs[2].extend(_Run(s, n, context=tail, parent=keep) for s, n in item_runs)
    groups = [_group(rows, tokens, window, pin) for part in runs for rows in _stack(part, max_rows)]
    return RecurrentRuns(groups, kept, tokens, prefixes.entries, sources)


def _item_spans(first: int, item_lens: tuple[int, ...]) -> list[tuple[int, int]]:
    """(start, length) of each non-empty item laid out from `first` (an empty item scores at its
    query's last token, which its query's run computes)."""
    spans = []
    for length in item_lens:
        if length:
            spans.append((first, length))
        first += length
    return spans


def _stack(runs: list[_Run], max_rows: int) -> list[list[_Run]]:
    """Runs of similar length together (padding each group to its longest costs little), at most
    `max_rows` a group."""
    by_start = {run.start: run for run in runs}
    groups: list[list[_Run]] = []
    for bucket in bucket_by_length([(run.start, run.length) for run in runs]):
        rows = [by_start[start] for start, _ in bucket]
        groups.extend(rows[i : i + max_rows] for i in range(0, len(rows), max_rows))
    return groups


def _group(rows: list[_Run], zero: int, window: int, pin: bool) -> RunGroup:
    longest = max(run.length for run in rows)
    index = torch.full((len(rows), longest), zero, dtype=torch.long)
    valid = torch.zeros((len(rows), longest), dtype=torch.bool)
    for row, run in enumerate(rows):
        index[row, : run.length] = torch.arange(run.start, run.start + run.length)
        valid[row, : run.length] = True
    contexts = [[zero] * (window - len(run.context)) + list(run.context)[-window:] for run in rows]
    slots = valid.flatten().nonzero().flatten()
    kept = [(row, run.keep) for row, run in enumerate(rows) if run.keep is not None]
    stored = [(row, run) for row, run in enumerate(rows) if run.store is not None]
    parents = [run.parent for run in rows]
    sources = [run.source for run in rows]
    # A group is all leading runs from zero, all from a cached head, or all items (a query's state):
    # `build_runs` stacks the three apart.
    assert len({parent is None for parent in parents}) == 1 and len({s is None for s in sources}) == 1

    def tensor(values: list) -> torch.Tensor:
        return host(torch.tensor(values, dtype=torch.long), pin)

    return RunGroup(
        index=host(index, pin),
        window=host(torch.tensor(contexts, dtype=torch.long).reshape(len(rows), window), pin),
        valid=host(valid, pin),
        slots=host(slots, pin),
        tokens=host(index.flatten()[slots], pin),
        state_from=tensor(parents) if parents[0] is not None else None,
        keep_rows=tensor([row for row, _ in kept]) if kept else None,
        keep_slots=tensor([slot for _, slot in kept]) if kept else None,
        source_from=tensor(sources) if sources[0] is not None else None,
        store_rows=tensor([row for row, _ in stored]) if stored else None,
        store_entries=tuple(run.store for _, run in stored if run.store is not None),
        store_window=tensor([_last_inputs(run, contexts[row], window) for row, run in stored]).reshape(
            len(stored), window
        )
        if stored
        else None,
    )


def _last_inputs(run: _Run, context: list[int], window: int) -> list[int]:
    """The convolution inputs at a run's last `window` positions (its window before it, then its own)."""
    return [*context, *range(run.start, run.start + run.length)][len(context) + run.length - window :]
