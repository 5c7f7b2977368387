"""Hostile records, generated from a seed: what a producer with write rights could put on a request topic.

Each record comes with what the contract (docs/message-schema.md) says must happen to it: the error codes
allowed for its answer (None: it is a valid job and must be scored), whether a dead-letter copy is due,
and the id the answer must carry where the contract fixes one. Every record gets a unique key, which
the worker echoes on its answer and keeps on a dead-letter copy, so answers are matched to records by
key, whatever id the worker could or could not read.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from kafka_scorer.wire.protocol import Job, encode_job
from tests.integration.jobs import MODEL_VOCAB
from tests.integration.kafka_helpers import Out

JSON, MSGPACK = b"application/json", b"application/msgpack"
UNDECODABLE = frozenset({"invalid_message"})
SCHEMA = frozenset({"invalid_request"})
# Deep nesting decodes as a document (invalid_request) or not at all (invalid_message): either is typed.
DEEP = frozenset({"invalid_message", "invalid_request"})
# A cap on header sizes answers too_long or invalid_request (docs/message-schema.md names the limit).
OVERSIZED_HEADER = frozenset({"invalid_request", "too_long"})
BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xed\xa0\x80", b"\xf0\x28\x8c\xbc", b"\xc0\xaf"]


@dataclass(frozen=True)
class Expect:
    """What the answer to one hostile record must be.

    `codes`: the error codes allowed ({None} for a job that must be scored); `dead_letter`: True or
    False where the contract fixes it, None for "exactly when the answer is invalid_message"; `job_id`:
    the answer's id where the contract fixes it; `job`: the job to score, for the valid ones."""

    kind: str
    codes: frozenset[str | None]
    dead_letter: bool | None = None
    job_id: str | None = None
    job: Job | None = None
    warned: bool = False  # the answer must carry a warning (an unusable reply_topic header)


@dataclass(frozen=True)
class Hostile:
    record: Out
    expect: Expect
    correlation: bytes | None

    @property
    def match(self) -> bytes:
        """What the answer is matched by: the key, unique to each record and echoed on the answer."""
        assert self.record.key is not None
        return self.record.key


def _mp_str(raw: bytes) -> bytes:
    return (
        b"\xd9" + struct.pack(">B", len(raw)) + raw
        if len(raw) < 256
        else b"\xda" + struct.pack(">H", len(raw)) + raw
    )


def _bad_text(rng: random.Random) -> bytes:
    return b"ok " * rng.randint(0, 3) + rng.choice(BAD_UTF8) + b" tail" * rng.randint(0, 2)


def _valid_job(rng: random.Random, job_id: str) -> Job:
    query = [rng.randrange(4, 380) for _ in range(rng.randint(2, 5))]
    items = [[rng.randrange(4, 380) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
    return Job(id=job_id, query=query, items=items, label_token_ids=rng.sample(range(MODEL_VOCAB), 2))


def _undecodable_bytes(rng: random.Random) -> bytes:
    """Random bytes that are neither a JSON document nor one MessagePack value (regenerated until so)."""
    while True:
        raw = rng.randbytes(rng.randint(1, 64))
        if not _decodes(msgspec.msgpack.decode, raw) and not _decodes(msgspec.json.decode, raw):
            return raw


def _decodes(decode: Callable[[bytes], object], raw: bytes) -> bool:
    try:
        decode(raw)
    except Exception:  # msgspec raises DecodeError, and UnicodeDecodeError for bad UTF-8 in a string
        return False
    return True


# Each kind: (rng, id) -> (value, extra headers, expectation, carries the correlation header)
Kind = Callable[[random.Random, str], tuple[bytes | None, list[tuple[str, bytes]], Expect, bool]]


def utf8_in_json(rng: random.Random, i: str) -> tuple:
    field = rng.choice(["query", "id", "item"])
    text = b'"' + _bad_text(rng) + b'"'
    job_id = text if field == "id" else f'"{i}"'.encode()
    query = text if field == "query" else b'"What is it?"'
    item = text if field == "item" else b'"a fox"'
    value = b'{"id":%s,"query":%s,"items":[%s],"label_token_ids":[1,2]}' % (job_id, query, item)
    headers = [("content-type", JSON)] if rng.random() < 0.5 else []
    return value, headers, Expect("invalid UTF-8 in JSON", UNDECODABLE, True, i), True


def utf8_in_msgpack(rng: random.Random, i: str) -> tuple:
    if rng.random() < 0.2:
        value = b"\x81\xa5query\xa2\xff\xfe"  # the record of issue 12, byte for byte
    else:
        value = (
            b"\x84\xa2id"
            + _mp_str(i.encode())
            + b"\xa5query"
            + _mp_str(_bad_text(rng))
            + b"\xa5items\x91\xa3fox\xaflabel_token_ids\x91\x01"
        )
    headers = [("content-type", MSGPACK)] if rng.random() < 0.5 else []
    return value, headers, Expect("invalid UTF-8 in MessagePack", UNDECODABLE, True, i), True


def deep_nesting(rng: random.Random, i: str) -> tuple:
    depth = rng.choice([200, 2_000, 10_000, 50_000])
    if rng.random() < 0.5:
        nested = b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth + b"1" + b"}" * depth
        value = b'{"id":"%s","query":%s,"items":[],"label_token_ids":[1]}' % (i.encode(), nested)
        headers = [("content-type", JSON)]
    else:
        value = b"\x84\xa2id" + _mp_str(i.encode()) + b"\xa5query" + b"\x91" * depth + b"\x90"
        value += b"\xa5items\x90\xaflabel_token_ids\x91\x01"
        headers = [("content-type", MSGPACK)]
    return value, headers, Expect(f"nested {depth} deep", DEEP, None, i), True


def mislabelled(rng: random.Random, i: str) -> tuple:
    job = encode_job(_valid_job(rng, i), "json")
    case = rng.randrange(4)
    if case == 0:
        value, label = job, MSGPACK  # a JSON body labelled MessagePack
    elif case == 1:
        value, label = encode_job(_valid_job(rng, i), "msgpack"), JSON  # and the other way round
    elif case == 2:
        value, label = b"%d garbage" % rng.randrange(100), JSON  # a number, then trailing garbage
    else:
        value, label = _undecodable_bytes(rng), rng.choice([JSON, MSGPACK])
    return value, [("content-type", label)], Expect(f"mislabelled ({case})", UNDECODABLE, True, i), True


def random_bytes(rng: random.Random, i: str) -> tuple:
    value = b"" if rng.random() < 0.15 else _undecodable_bytes(rng)
    return value, [], Expect("random bytes", UNDECODABLE, True, i), True


def tombstone(rng: random.Random, i: str) -> tuple:
    # Keyed: a record with neither key nor value cannot be produced (aiokafka refuses it).
    return None, [], Expect("tombstone", UNDECODABLE, True, i), True


def schema_breaking(rng: random.Random, i: str) -> tuple:
    """Well-formed documents that break the schema or the model's rules: typed invalid_request."""
    base = {"id": i, "query": [5, 6, 7], "items": [[8, 9]], "label_token_ids": [1, 2]}
    broken = rng.choice(
        [
            {"query": 5},
            {"query": [1.5]},
            {"query": [True, 1]},
            {"items": "x"},
            {"items": [[8], "text"]},
            {"query": "text", "items": [[8, 9]]},
            {"label_token_ids": [-1]},
            {"label_token_ids": [10**30]},
            {"query": [10**30]},
            {"items": [[-3]]},
            {"label_token_ids": [1, MODEL_VOCAB + 5]},
            {"bogus": 1},
            {"apply_softmax": "yes"},
            {"multi_item": 3},
        ]
    )
    huge = any(10**30 in (v if isinstance(v, list) else [v]) for v in broken.values())
    fmt = "json" if huge else rng.choice(["json", "msgpack"])  # MessagePack has no ints past 64 bits
    doc = {**base, **broken}
    if fmt == "msgpack" and rng.random() < 0.3:
        doc["query"] = msgspec.msgpack.Ext(5, b"ext")  # an extension type where a list belongs
    value = msgspec.json.encode(doc) if fmt == "json" else msgspec.msgpack.encode(doc)
    headers = [("content-type", JSON if fmt == "json" else MSGPACK)]
    return value, headers, Expect(f"schema: {broken}", SCHEMA, False, i), True


def huge_correlation(rng: random.Random, i: str) -> tuple:
    job = _valid_job(rng, i)
    size = rng.choice([300_000, 1 << 20])
    huge = bytes(rng.randrange(33, 127) for _ in range(64)) * (size // 64)
    headers = [("content-type", JSON), ("correlation_id", huge), ("correlation_id", b"second")]
    return encode_job(job, "json"), headers, Expect("1 MB correlation id", OVERSIZED_HEADER, False), False


def odd_headers(rng: random.Random, i: str) -> tuple:
    """A valid job under headers that are not UTF-8, duplicated or unusable: scored all the same."""
    job = _valid_job(rng, i)
    fmt = rng.choice(["json", "msgpack"])
    case = rng.randrange(4)
    warned = False
    if case == 0:
        headers = [("content-type", rng.choice(BAD_UTF8) + b"json")]  # unreadable: the format is sniffed
    elif case == 1:
        headers = [("reply_topic", rng.choice(BAD_UTF8))]
        warned = True
    elif case == 2:
        headers = [("reply_topic", rng.choice([b"no such topic!", b"..", b"x" * 300]))]
        warned = True
    else:
        headers = [("content-type", (JSON if fmt == "json" else MSGPACK)), ("CONTENT-TYPE", b"\xff")]
        headers += [("trace", rng.randbytes(16)), ("trace", b"")]
    return (
        encode_job(job, fmt),
        headers,
        Expect(f"headers ({case})", frozenset({None}), False, i, job, warned),
        True,
    )


def binary_correlation(rng: random.Random, i: str) -> tuple:
    """A Spring-style binary correlation id on a job without an id: the id is its hex (schema doc)."""
    job = msgspec.structs.replace(_valid_job(rng, i), id=None)
    corr = rng.choice(BAD_UTF8) + rng.randbytes(15)
    headers = [("content-type", JSON), ("kafka_correlationId", corr)]
    return (
        encode_job(job, "json"),
        headers,
        Expect("binary correlation id", frozenset({None}), False, corr.hex(), job),
        False,
    )


KINDS: list[Kind] = [
    utf8_in_json,
    utf8_in_msgpack,
    deep_nesting,
    mislabelled,
    random_bytes,
    tombstone,
    schema_breaking,
    huge_correlation,
    odd_headers,
    binary_correlation,
]


def hostile_records(n: int, seed: int, topic: str, prefix: str = "hostile") -> list[Hostile]:
    """`n` hostile records, every kind in turn (so each appears), details drawn from `seed`."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        i = f"{prefix}-{k}"
        value, headers, expect, correlated = KINDS[k % len(KINDS)](rng, i)
        correlation = i.encode() if correlated else None
        if correlation is not None:
            headers = [*headers, ("correlation_id", correlation)]
        key = f"{prefix}-key-{k}".encode()
        out.append(Hostile(Out(topic, value, key=key, headers=headers), expect, correlation))
    return out
