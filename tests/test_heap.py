"""The loaded model's objects are frozen out of the collector's sight (kafka_scorer/heap.py)."""

from __future__ import annotations

import gc

from kafka_scorer.heap import freeze_loaded_heap


def test_freeze_moves_live_objects_out_of_collections_and_collects_garbage_first() -> None:
    class Cycle:
        pass

    garbage = Cycle()
    garbage.me = garbage  # a reference cycle: only the collector can free it
    alive = [object() for _ in range(1000)]
    collected_before = gc.get_stats()[2]["collected"]
    del garbage
    try:
        freeze_loaded_heap()
        assert gc.get_freeze_count() >= len(alive)
        assert gc.get_stats()[2]["collected"] > collected_before  # the cycle went before the freeze
    finally:
        gc.unfreeze()
