"""What serves instead when the warm-up's batches fail at the model's shapes.

Two choices made for speed compile code at the first forward, and compiling can fail where running
eagerly would not: the fused decoder's compiled regions (inductor needs a working C++ compiler on the
CPU, and Triton's toolchain on CUDA; a process without them gets an `InvalidCxxCompiler` from every
forward) and an attention backend chosen automatically (FlexAttention, deterministic mode's span
kernel). Without a fallback every job would be answered with an internal error for as long as the
worker runs. Each has an exact fallback: the same regions run eagerly (the same arithmetic, without
inductor's fusion), and the portable attention backend (`FALLBACKS`).

The search tries each fallback alone before both together, so a failure of one never costs the other's
speed (a broken compiler must not also take FlexAttention away, nor a FlexAttention that rejects the
model's head layout the compiled layers). A backend the operator named is kept: the caller warns that
the warm-up failed. The decoder's regions always fall back, whoever chose them: compiled or eager is
a speed setting, never a different score.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_scorer.engine.deterministic import BACKEND, SPANS_BACKEND
from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.models.decoder_layer import Regions

if TYPE_CHECKING:
    from kafka_scorer.engine.scorer import Scorer

log = logging.getLogger(__name__)

FALLBACKS = {"flex": "cascade", SPANS_BACKEND: BACKEND}
"""A backend chosen automatically that fails the warm-up -> the portable one that serves instead: for
FlexAttention the cascade, for deterministic mode's span kernel on CUDA the tiles (both exact)."""


@dataclass(frozen=True)
class Fallback:
    """One change that may get the warm-up's batches through, and how to take it back."""

    apply: Callable[[], None]
    undo: Callable[[], None]
    line: str
    """What changed, with a `%s` for the failure that made it: the one line the operator reads."""


def fallbacks(scorer: Scorer) -> list[Fallback]:
    """The fallbacks that apply to `scorer` as it is now: its compiled regions, its automatic backend."""
    return [f for f in (_eager_regions(scorer), _portable_attention(scorer)) if f is not None]


def recover(scorer: Scorer, failed: str, failure: Callable[[], str | None]) -> str | None:
    """After the warm-up failed with `failed`: each fallback alone, then all together, until
    `failure()` (the warm-up's batches again) passes. Returns None once one serves, else the last
    failure, with every fallback left applied (the most portable setup, as the caller serves anyway)."""
    options = fallbacks(scorer)
    trials = [[option] for option in options] + ([options] if len(options) > 1 else [])
    for trial in trials:
        for option in trial:
            option.apply()
        still = failure()
        if still is None or trial is trials[-1]:
            for option in trial:
                log.warning(option.line, failed)
            return still
        for option in reversed(trial):
            option.undo()
    return failed


def _eager_regions(scorer: Scorer) -> Fallback | None:
    body = scorer.loaded.body
    if not isinstance(body, FusedDecoder) or not body.regions.compiled:
        return None
    compiled = body.regions

    def apply() -> None:
        body.regions = Regions.eager(body.shape)

    def undo() -> None:
        body.regions = compiled

    return Fallback(
        apply,
        undo,
        "the fused decoder's compiled layers failed at the model's shapes (%s); running them eagerly: "
        "the same layers, slower (torch.compile needs a working C/C++ compiler; "
        "KAFKA_SCORER_DECODER_FORWARD=fused skips the compile)",
    )


def _portable_attention(scorer: Scorer) -> Fallback | None:
    chosen = scorer.attention_backend
    portable = FALLBACKS.get(chosen)
    if not scorer.auto_backend or portable is None:
        return None

    def apply() -> None:
        scorer.attention_backend = portable

    def undo() -> None:
        scorer.attention_backend = chosen

    line = f"attention backend {chosen!r} failed at the model's shapes (%s); using {portable!r}"
    return Fallback(apply, undo, line)
