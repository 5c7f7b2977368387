"""torch tensor <-> wire `Tensor` (SPEC §6: row-major, little-endian, in the model's dtype)."""

from __future__ import annotations

import sys

import torch

from kafka_scorer.wire.protocol import Tensor

_WIRE_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _WIRE_DTYPES.items()}


def to_wire(tensor: torch.Tensor) -> Tensor:
    """bfloat16 has no numpy dtype, so bytes are taken through a same-width integer view."""
    tensor = tensor.detach().to("cpu").contiguous()
    name = _WIRE_DTYPES.get(tensor.dtype)
    if name is None:
        tensor, name = tensor.float(), "float32"
    raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
    array = raw.numpy()
    if sys.byteorder != "little":
        array = array.byteswap()
    return Tensor(dtype=name, shape=list(tensor.shape), data=array.tobytes())  # type: ignore[arg-type]  # name is one of the wire's dtype literals (_WIRE_DTYPES' values)


def from_wire(wire: Tensor) -> torch.Tensor:
    dtype = _TORCH_DTYPES[wire.dtype]
    if not wire.data:
        return torch.empty(wire.shape, dtype=dtype)
    flat = torch.frombuffer(bytearray(wire.data), dtype=dtype)
    return flat.reshape(wire.shape)
