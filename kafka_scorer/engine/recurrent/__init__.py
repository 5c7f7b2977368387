"""Layers that carry state along the sequence (recurrence, causal convolution), kept apart per sequence.

The engine packs many sequences into one flat stream (`engine/pack/batch.py`); attention layers keep them
apart through the attention metadata, but a layer whose output at a token depends on a state built from
every earlier token (Gated DeltaNet's short convolution and delta-rule recurrence, Mamba's scan) would
run straight across sequence boundaries and leak one job's tokens into the next job's scores.

- `detection.py` finds such layers at load time: the ones the engine can run exactly (Gated DeltaNet of
  Qwen3.5 and Qwen3-Next) are wrapped, any other refuses the model with a typed error;
- `runs.py` turns a batch's layout into the runs each such layer computes: every sequence's leading run
  (a pair, or an MIS query) from zero state, or from a cached head's state (the prefix cache), then
  each MIS item from its query's end state;
- `gated_delta.py` is the wrapped Gated DeltaNet layer that computes those runs;
- `projections.py` reads each family's input projections into one shape.
"""
