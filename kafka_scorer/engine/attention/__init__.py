"""Attention over a packed batch: plain causal pairs and MIS sequences, several jobs per forward.

The batch is one flat token stream. Rule (SPEC §5): a prefix token sees the prefix causally; an item
token sees the whole prefix and the earlier tokens of its own item. A plain pair is a sequence with no
items. An encoder batch (`causal=False`, SPEC §8) has plain pairs only, and each pair's tokens see all
of that pair's tokens and nothing of any other pair.

One file per step of a batch's path:
- `layout.py`: `AttentionLayout`, the lengths of the batch's sequences, known at tokenization time.
- `dense.py`, `cascade.py` (+ `pairs.py` for encoder batches), `flex.py`, `spans.py`: one backend each,
  with the typed metadata its attention reads (`DenseMetadata`, `CascadeMetadata` / `PairMetadata`,
  `FlexMetadata`, `SpanMetadata`). The metadata is built from the layout on the packing thread
  (`engine/pack/batch.py`), moved to the device once per batch by the runner (`.to(device)`), and read by
  every layer as plain fields.
- `tiled.py` (CUDA) and `segmented.py` (CPU): deterministic mode's, each computing a token's attention
  from its own run alone (`engine/load/deterministic.py`).
- `registry.py`: the backend registry and `scorer_attention`, the function transformers' decoder and
  encoder layers call (RoPE already applied); it finds the batch's metadata in the forward's kwargs.
"""
