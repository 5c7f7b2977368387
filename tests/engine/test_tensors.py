from __future__ import annotations

import msgspec
import pytest
import torch

from kafka_scorer.engine.pack.tensors import from_wire, to_wire
from kafka_scorer.wire.protocol import Result, decode_result, encode_result


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_round_trip_through_json_and_msgpack(dtype):
    tensor = torch.randn(3, 5).to(dtype)
    wire = to_wire(tensor)
    assert wire.shape == [3, 5] and len(wire.data) == 15 * tensor.element_size()
    for fmt in ("json", "msgpack"):
        result = Result(id="x", scores=[[0.5]] * 3, pooled_hidden_states=wire)
        decoded = decode_result(encode_result(result, fmt))
        assert torch.equal(from_wire(decoded.pooled_hidden_states), tensor)


def test_bytes_are_little_endian_row_major():
    wire = to_wire(torch.tensor([[1.0, 2.0]], dtype=torch.float32))
    assert wire.data == b"\x00\x00\x80\x3f\x00\x00\x00\x40"
    assert b'"data":"AACAPwAAAEA="' in msgspec.json.encode(wire)
