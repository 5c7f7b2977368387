"""Run a served Scorer another way for a while: another attention backend, or other decoder layers.

The bench compares contenders side by side on one Scorer (the same weights, jobs and process), so a
ratio measures the one thing that differs: MIS attention backends, the fused decoder against
transformers' own layers, compiled regions against the same layers eager. Which of these a loaded model
can run, and how to swap one in and out, is the engine's knowledge; this is the one place that holds it,
so the bench needs no attribute of the Scorer's model (it set `scorer.loaded.body` before).
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from torch import nn

from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.models.decoder_layer import Regions

if TYPE_CHECKING:
    from kafka_scorer.engine.models.loaded import LoadedModel


class Switchable(Protocol):
    """What a variant switches on a Scorer: its attention backend and its model's body (the Scorer
    satisfies it; naming the class here would import the seam from below it)."""

    attention_backend: str
    loaded: LoadedModel


class Layers(enum.Enum):
    SERVED = "served"
    """What the Scorer serves (the fused decoder where the family has one, else transformers' layers)."""
    TRANSFORMERS = "transformers"
    """transformers' own decoder layers, sharing the fused layers' weights: what fusing buys."""
    EAGER = "eager"
    """The fused layers with their regions uncompiled: what compiling them buys."""


def layer_choices(scorer: Switchable) -> tuple[Layers, ...]:
    """The layer variants this Scorer's model can run; SERVED always, the others where they differ."""
    body = scorer.loaded.body
    if not isinstance(body, FusedDecoder):
        return (Layers.SERVED,)
    return (Layers.SERVED, Layers.TRANSFORMERS) + ((Layers.EAGER,) if body.regions.compiled else ())


@dataclass(frozen=True)
class Variant:
    """One way to run `scorer`: entered around each batch (`with variant.active(): scorer.run_batch(...)`)."""

    scorer: Switchable
    backend: str | None
    body: nn.Module | None

    @contextmanager
    def active(self) -> Iterator[None]:
        scorer = self.scorer
        previous = scorer.attention_backend, scorer.loaded.body
        if self.backend is not None:
            scorer.attention_backend = self.backend
        if self.body is not None:
            scorer.loaded.body = self.body
        try:
            yield
        finally:
            scorer.attention_backend, scorer.loaded.body = previous


def variant(scorer: Switchable, backend: str | None = None, layers: Layers = Layers.SERVED) -> Variant:
    """`scorer` run with `backend` (None: its own) and `layers`; a ValueError if the model lacks them."""
    if layers not in layer_choices(scorer):
        raise ValueError(f"this model cannot run {layers.value} layers (it runs {layer_choices(scorer)})")
    return Variant(scorer, backend, _body(scorer, layers))


def _body(scorer: Switchable, layers: Layers) -> nn.Module | None:
    if layers is Layers.TRANSFORMERS:
        base = scorer.loaded.model.base_model
        assert isinstance(base, nn.Module)
        return base
    if layers is Layers.EAGER:  # a shallow copy: the weights stay shared, only the regions differ
        served = scorer.loaded.body
        assert isinstance(served, FusedDecoder)
        body = copy.copy(served)
        body.regions = Regions.eager(served.shape)
        return body
    return None
