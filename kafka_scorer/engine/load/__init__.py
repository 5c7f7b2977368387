"""The load stage: a checkpoint read once into a `LoadedModel` (family, head, layers, revision),
which Scorer class serves it, deterministic mode's layers, the warm-up before ready."""
