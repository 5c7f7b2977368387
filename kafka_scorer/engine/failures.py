"""What a failed forward pass means: the end of the process, or an answer for the jobs in it.

Most exceptions raised while scoring a batch belong to the batch (a shape the model rejects, a bug on one
odd input): the engine runs the batch again in halves until the one job that breaks it stands alone, and
only that job is answered `internal` (`ScoringEngine.run_packed`). Exceptions become results here, in
`failed_results`, and nowhere else.

Some errors poison the process instead. A CUDA fault (illegal address, device-side assert, launch
failure, ECC error) leaves the CUDA context unusable: every later kernel fails too, or computes on
corrupted memory. Such an error is fatal: the worker stops without committing what it did not answer, so
the orchestrator restarts a clean process and the next reader redoes the work. Running out of device
memory is fatal only when one job, alone and after the cache was freed, still does not fit: the inputs are
bounded by settings, so that is a device too small for them, not a bad record.

No torch import: errors are told apart by type name and message, so the worker can import this cheaply.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kafka_scorer.errors import FatalError
from kafka_scorer.wire.protocol import ErrorCode, Result, error_result

log = logging.getLogger(__name__)

# Lower-case fragments of the messages CUDA and its libraries give for a context that is now unusable.
_POISONED = (
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "uncorrectable ecc error",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
    "cuda error: unknown error",
)


class FatalDeviceError(FatalError):
    """The device, or this process's hold on it, can no longer be trusted: the worker must stop."""


def is_fatal(exc: BaseException) -> bool:
    """True for errors after which nothing this process computes can be trusted."""
    if isinstance(exc, FatalDeviceError):
        return True
    text = str(exc).lower()
    return any(fragment in text for fragment in _POISONED)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (and its CPU cousin), without importing torch."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def failed_results(job_ids: Sequence[str], exc: BaseException, model: str = "") -> list[Result]:
    """One `internal` result per job, naming the exception: the one place exceptions become answers."""
    message = f"forward pass failed: {type(exc).__name__}: {exc}"
    return [error_result(job_id, ErrorCode.INTERNAL, message, model=model) for job_id in job_ids]
