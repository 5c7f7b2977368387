"""Records no well-behaved client can write: a header *name* that is not UTF-8 (the Kafka protocol says
header names are UTF-8 strings). A subprocess runs aiokafka's pure-Python record builder with a name
whose encode() returns raw bytes; aiokafka's consumer then raises UnicodeDecodeError on the whole poll
that meets its batch (kafka/unreadable.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

_RAW_HEADER_PRODUCER = r"""
import asyncio, json, sys
from aiokafka import AIOKafkaProducer

class RawName(str):
    def encode(self, *args, **kwargs):
        return b"\xff\xfename"

async def main(bootstrap, topic, values, bad, partition):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=500)
    await producer.start()
    futures = []
    for i, value in enumerate(values):
        headers = [(RawName("x"), b"v")] if i in bad else [("content-type", b"application/json")]
        key = b"raw-%d" % i
        sent = await producer.send(topic, value.encode(), key=key, partition=partition, headers=headers)
        futures.append(sent)
    await asyncio.gather(*futures)
    await producer.stop()

bootstrap, topic, values, bad, partition = sys.argv[1:]
asyncio.run(main(bootstrap, topic, json.loads(values), json.loads(bad), int(partition)))
"""


def produce_with_raw_header(
    bootstrap: str, topic: str, values: list[str], bad: list[int], partition: int = 0
) -> None:
    """`values` to one partition in one producer batch (keys `raw-<i>`); those at the indexes in `bad`
    carry the header name that is not UTF-8, the others `content-type: application/json`."""
    env = {**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"}
    args = [bootstrap, topic, json.dumps(values), json.dumps(bad), str(partition)]
    subprocess.run([sys.executable, "-c", _RAW_HEADER_PRODUCER, *args], env=env, check=True, timeout=60)
