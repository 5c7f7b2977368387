"""Run a served engine another way for a while: another attention backend, or other decoder layers.

The bench compares contenders side by side on one engine (the same weights, jobs and process), so a
ratio measures the one thing that differs: MIS attention backends, the fused decoder against
transformers' own layers, compiled regions against the same layers eager. Which of these a loaded model
can run, and how to swap one in and out, is the engine's knowledge; this is the one place that holds it,
so the bench needs no attribute of the engine's model (it set `scorer.loaded.body` before). A variant
is a value read from the loaded model; the engine enters it (`ScoringEngine.running`) and keeps its own
attention backend itself, so nothing here writes the engine's attributes.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.models.decoder_layer import Regions

if TYPE_CHECKING:
    from kafka_scorer.engine.models.loaded import LoadedModel


class Layers(enum.Enum):
    SERVED = "served"
    """What the engine serves (the fused decoder where the family has one, else transformers' layers)."""
    TRANSFORMERS = "transformers"
    """transformers' own decoder layers, sharing the fused layers' weights: what fusing buys."""
    EAGER = "eager"
    """The fused layers with their regions uncompiled: what compiling them buys."""


def layer_choices(loaded: LoadedModel) -> tuple[Layers, ...]:
    """The layer variants this model can run; SERVED always, the others where they differ."""
    body = loaded.body
    if not isinstance(body, FusedDecoder):
        return (Layers.SERVED,)
    return (Layers.SERVED, Layers.TRANSFORMERS) + ((Layers.EAGER,) if body.regions.compiled else ())


@dataclass(frozen=True)
class Variant:
    """One way to run the engine, entered around each batch:
    `with scorer.engine.running(variant): scorer.engine.run_batch(...)`."""

    backend: str | None
    """The attention backend its forwards are built with; None: the engine's own."""
    body: nn.Module | None
    """The decoder body its forwards run; None: the served one."""

    @contextmanager
    def body_in(self, loaded: LoadedModel) -> Iterator[None]:
        """`loaded` runs this variant's body inside, its served body again after."""
        served = loaded.body
        if self.body is not None:
            loaded.body = self.body
        try:
            yield
        finally:
            loaded.body = served


def variant(loaded: LoadedModel, backend: str | None = None, layers: Layers = Layers.SERVED) -> Variant:
    """`loaded` run with `backend` (None: the engine's own) and `layers`; a ValueError if it lacks them."""
    if layers not in layer_choices(loaded):
        raise ValueError(f"this model cannot run {layers.value} layers (it runs {layer_choices(loaded)})")
    return Variant(backend, _body(loaded, layers))


def _body(loaded: LoadedModel, layers: Layers) -> nn.Module | None:
    if layers is Layers.TRANSFORMERS:
        base = loaded.model.base_model
        assert isinstance(base, nn.Module)
        return base
    if layers is Layers.EAGER:  # a shallow copy: the weights stay shared, only the regions differ
        served = loaded.body
        assert isinstance(served, FusedDecoder)
        body = copy.copy(served)
        body.regions = Regions.eager(served.shape)
        return body
    return None
