"""The fields a kind whose result is one score per document cannot honour, refused rather than ignored.

The late-interaction kind (one MaxSim score per item) and the listwise kind (one similarity per
document read beside the others) refuse the same fields and the same `rank_by`; one check serves both,
each naming its own reason.
"""

from __future__ import annotations

from kafka_scorer.engine.prepare.prepared import InputError
from kafka_scorer.wire.protocol import ErrorCode, Job


def refuse_for_one_column(job: Job, why: str, extra: list[tuple[str, bool]] | None = None) -> None:
    """`unsupported` for the first field sent that a one-column kind cannot use (`why` ends the message),
    `invalid_request` for a `rank_by` past its one column."""
    refused = [
        ("label_token_ids", job.label_token_ids is not None),
        ("label_tokens", job.label_tokens is not None),
        ("multi_item: true", job.multi_item is True),
        ("item_first: true", job.item_first),
        ("return_pooled_hidden_states: true", job.return_pooled_hidden_states),
        ("apply_softmax: true", job.apply_softmax),
        (f"activation: {job.activation!r}", job.activation not in (None, "none")),
        *(extra or []),
    ]
    for what, sent in refused:
        if sent:
            raise InputError(ErrorCode.UNSUPPORTED, f"{what}: not for {why}")
    if job.rank_by not in (None, 0):
        raise InputError(
            ErrorCode.INVALID_REQUEST, f"rank_by: {job.rank_by} but the job's scores have 1 column"
        )
