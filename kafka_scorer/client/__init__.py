"""An asyncio client of the scoring service: `ScoringClient` and the errors it raises.

    async with ScoringClient(bootstrap_servers="kafka:9092") as client:
        result = await client.score("Is this review positive?", ["Great food."], label_tokens=["yes", "no"])

Importable without torch or the engine: what a web service or a batch script needs, nothing more.
See docs/client.md.
"""

from kafka_scorer.client.errors import (
    BrokerUnreachable,
    ClientClosed,
    InvalidJob,
    InvalidSetting,
    JobFailed,
    NotSent,
    NotStarted,
    ScoringError,
    ScoringTimeout,
    TopicMissing,
)
from kafka_scorer.client.scoring_client import ScoringClient

__all__ = [
    "BrokerUnreachable",
    "ClientClosed",
    "InvalidJob",
    "InvalidSetting",
    "JobFailed",
    "NotSent",
    "NotStarted",
    "ScoringClient",
    "ScoringError",
    "ScoringTimeout",
    "TopicMissing",
]
