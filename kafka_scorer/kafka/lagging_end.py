"""A log end below the group's committed offset right after a leader failover is a lagging mark, not a
new log.

A new leader's high-water mark can trail the old leader's for a moment (it advances once the followers
fetch from it). The reset watch (log_reset.py) then sees the log end move back,
or a leader change, and the partition is positioned from the group's committed offset, which must lie
within the log: one above the lagging mark was distrusted as an older log's, and the worker read the
whole partition again from the earliest offset (issue 45: 68 duplicates after one failover, 63 of them
outside any in-flight window). So a committed offset above the reported end is first given a moment
for the end to catch up with it: reached, it stands; a log that really restarted never reaches it, and
is positioned as before.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka.errors import KafkaError

CATCH_UP_S = 1.5  # a failover's lag is well under a second here; within consumer.py's 5 s with its 3 s settle
_RETRY_S = 0.1


async def end_reaches(consumer: Any, tp: Any, offset: int, wait_s: float = CATCH_UP_S) -> bool:
    """True once the broker's log end of `tp` (ListOffsets, latest) is at least `offset`, within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            end = (await consumer.end_offsets([tp])).get(tp)
        except KafkaError:  # a leader still moving: asked again until the deadline
            end = None
        if end is not None and end >= offset:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_RETRY_S)
