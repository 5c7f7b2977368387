"""The vision kind's warm-up jobs: one text pair and one image pair, made on the spot."""

from __future__ import annotations

import io

from kafka_scorer.wire.content import Content, ImageData, ImagePart, TextPart
from kafka_scorer.wire.protocol import Job


def warm_up_jobs(templated: bool) -> list[Job]:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    picture = Content([ImagePart(ImageData(out.getvalue())), TextPart("a red square")])
    labels = None if templated else [0, 1]
    return [
        Job(id="warm-up-text", query="warm-up", items=["text"], label_token_ids=labels),
        Job(id="warm-up-image", query="warm-up", items=[picture], label_token_ids=labels),
    ]
