"""The package files one job runs through, in the order first entered: `python -m devtools.job_path`.

What a newcomer reads to follow a job: its record decoded at the worker's edge, the job prepared,
packed, run and its reply encoded (`worker/envelope.py` and `ScoringEngine`), on a tiny random model of
the kind named (causal, classification). The worker's queues and Kafka's I/O are left out: they are the
same for every job and kind (docs/architecture.md lists them). One warm call first, so imports and
first-call set-up are not counted; then a profiler notes each file a call enters.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import kafka_scorer

PACKAGE = Path(kafka_scorer.__file__).parent


@dataclass
class _Record:
    """A consumed record as the worker's edge reads it."""

    value: bytes
    headers: list[tuple[str, bytes | None]] = field(
        default_factory=lambda: [("content-type", b"application/json")]
    )
    key: bytes | None = b"k"
    topic: str = "jobs"
    partition: int = 0
    offset: int = 0
    timestamp: int = 1_700_000_000_000


def job_path(kind: str) -> list[str]:
    from kafka_scorer.checkpoints.tiny_models import build_tiny_model
    from kafka_scorer.engine.scorer import Scorer
    from kafka_scorer.worker.envelope import Inbound, RecordCodec

    directory = build_tiny_model(tempfile.mkdtemp(prefix="job-path-"), "qwen3", kind)
    engine = Scorer(str(directory), dtype="float32", device="cpu").engine
    codec = RecordCodec("replies", lambda topic: f"{topic}.dlq", 1 << 20, engine.served.name)
    job: dict[str, object] = {"id": "j", "query": "which one", "items": ["a", "bb", "ccc"]}
    if kind == "causal":
        job["label_token_ids"] = [5, 6]
    record = _Record(json.dumps(job).encode())

    def one() -> None:
        inbound = codec.decode_record(record)
        assert isinstance(inbound, Inbound), inbound
        prepared = engine.prepare(inbound.job, inbound.job_id)
        (result,) = engine.run_packed(engine.pack([prepared]))
        assert result.error is None, result.error
        codec.encode_record(result, inbound.origin)

    one()
    entered: list[str] = []

    def note(frame, event: str, arg: object) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(str(PACKAGE)) and name not in entered:
            entered.append(name)

    sys.setprofile(note)
    threading.setprofile(note)
    try:
        one()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return [str(Path(name).relative_to(PACKAGE)) for name in entered]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("causal", "classification"), default="causal")
    files = job_path(parser.parse_args().kind)
    print("\n".join(files))
    print(f"{len(files)} files")


if __name__ == "__main__":
    main()
