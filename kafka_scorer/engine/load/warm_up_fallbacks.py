"""What serves instead when the warm-up's batches fail at the model's shapes.

Three choices made for speed compile code at the first forward, and compiling can fail where running
eagerly would not: the fused decoder's compiled regions (inductor needs a working C++ compiler on the
CPU, and Triton's on CUDA: an `InvalidCxxCompiler` from every forward), an attention backend chosen
automatically (FlexAttention, deterministic mode's span kernel), and the Triton label kernels on CUDA
(Triton builds its launchers with the host's C compiler, which a slim container image lacks). Without
a fallback every job would be answered with an internal error for as long as the worker runs. Each
has an exact fallback: the same regions run eagerly (the same arithmetic, without inductor's fusion),
the portable attention backend (`FALLBACKS`), and the label scores in torch's chunked log-sum-exp.

The search tries the fallbacks one at a time, then two, then all, and keeps the first set that lets
the warm-up's batches through, so a failure of one never costs another's speed (a FlexAttention that
rejects the model's head layout must not also take the compiled layers away). A backend the operator
named is kept: the caller warns that the warm-up failed. The layers and the label kernels always fall
back, whoever chose them: compiled or eager, Triton or torch is a speed setting, never another score.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kafka_scorer.engine.load.deterministic import BACKEND, SPANS_BACKEND
from kafka_scorer.engine.models.decoder import FusedDecoder
from kafka_scorer.engine.models.decoder_layer import Regions

if TYPE_CHECKING:
    from kafka_scorer.engine.load.start_up import StartUp

log = logging.getLogger(__name__)

FALLBACKS = {"flex": "cascade", SPANS_BACKEND: BACKEND}
"""A backend chosen automatically that fails the warm-up -> the portable one that serves instead: for
FlexAttention the cascade, for deterministic mode's span kernel on CUDA the tiles (both exact)."""


@dataclass
class Chosen:
    """The attention backend the warm-up serves with so far: the stage's own record, which a fallback
    changes and the stage returns (the engine keeps what it returns)."""

    backend: str


@dataclass(frozen=True)
class Fallback:
    """One change that may get the warm-up's batches through, and how to take it back."""

    apply: Callable[[], None]
    undo: Callable[[], None]
    line: str
    """What changed, with a `%s` for the failure that made it: the one line the operator reads."""


def fallbacks(parts: StartUp, chosen: Chosen) -> list[Fallback]:
    """The fallbacks that apply to the engine as it is now: its compiled regions, its automatic attention
    backend, its Triton label kernels."""
    found = (_eager_regions(parts), _portable_attention(parts, chosen), torch_label_scores(parts))
    return [f for f in found if f is not None]


def recover(parts: StartUp, chosen: Chosen, failed: str, failure: Callable[[], str | None]) -> str | None:
    """After the warm-up failed with `failed`: the fallbacks one at a time, then two at a time, then all,
    until `failure()` (the warm-up's batches again) passes. Returns None once a set serves, else the last
    failure, with every fallback left applied (the most portable setup, as the caller serves anyway).

    Each fallback's line quotes the failure it removed: the one the same set without it still had (a
    smaller set, so tried before), not the first failure, which may have been another part's."""
    options = fallbacks(parts, chosen)
    sizes = range(1, len(options) + 1)
    trials = [frozenset(chosen) for size in sizes for chosen in itertools.combinations(options, size)]
    seen: dict[frozenset[Fallback], str | None] = {frozenset(): failed}
    for trial in trials:
        for option in trial:
            option.apply()
        seen[trial] = still = failure()
        if still is None or trial is trials[-1]:
            for option in options:
                if option in trial:
                    log.warning(option.line, seen[trial - {option}])
            return still
        for option in trial:
            option.undo()
    return failed


def _eager_regions(parts: StartUp) -> Fallback | None:
    body = parts.loaded.body
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


def _portable_attention(parts: StartUp, chosen: Chosen) -> Fallback | None:
    automatic = chosen.backend
    portable = FALLBACKS.get(automatic)
    if not parts.auto_backend or portable is None:
        return None

    def apply() -> None:
        chosen.backend = portable

    def undo() -> None:
        chosen.backend = automatic

    line = f"attention backend {automatic!r} failed at the model's shapes (%s); using {portable!r}"
    return Fallback(apply, undo, line)


def torch_label_scores(parts: StartUp) -> Fallback | None:
    """The Triton label kernels -> torch's chunked log-sum-exp (None where they are not served): also the
    warm-up's answer when tuning them fails (`warm_up._ready_label_kernels`)."""
    runner = parts.runner
    if runner.label_kernels != "triton":
        return None
    chosen = runner.label_backend

    def apply() -> None:
        runner.label_backend = "torch"

    def undo() -> None:
        runner.label_backend = chosen

    return Fallback(
        apply,
        undo,
        "the Triton label kernels failed at the model's shapes (%s); scoring labels with torch's chunked "
        "log-sum-exp: the same scores, slower (Triton needs a working C compiler: install gcc, or set CC)",
    )
