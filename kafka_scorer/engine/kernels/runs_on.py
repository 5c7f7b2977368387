"""Whether a Triton kernel of this package can run for tensors on a device.

CUDA with triton installed, or the CPU under triton's interpreter (TRITON_INTERPRET=1 before triton's
import, as the kernel tests run them). A CPU command that keeps triton out of its process
(`cli/no_triton.py` sets `sys.modules["triton"] = None`) always gets False, without importing it. The
callers (the spans backends, deterministic mode's choices, the benches) take their torch paths where it
says no.
"""

from __future__ import annotations

import os
import sys

import torch


def triton_runs_on(device: torch.device) -> bool:
    if sys.modules.get("triton", ...) is None:
        return False
    if device.type != "cuda" and not interpreter_asked():
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_asked() -> bool:
    """Whether TRITON_INTERPRET asks for triton's CPU interpreter (triton reads it at its first import):
    set to anything but empty or 0."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
