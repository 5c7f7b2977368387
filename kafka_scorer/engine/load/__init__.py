"""The load stage: a checkpoint read once into a `LoadedModel` (family, head, layers, revision),
deterministic mode's layers, and start-up (`start_up.py`): the warm-up before ready, its fallbacks and
the description, which take narrow capabilities and return what they chose."""
