"""A command that serves on the CPU keeps triton out of its process.

transformers' model modules import `torch._dynamo`, and `torch._dynamo.utils` imports triton at import
time only to learn whether it is installed (`torch.utils._triton.has_triton_package`). Where triton is
installed (the test extras put it on every Linux machine), a CPU worker thus loads triton's native
bindings without ever using them, and at exit their nanobind layer reports ~30 "leaked" objects on
stderr, after "worker stopped cleanly". Nothing on the CPU path needs triton: the label kernel takes its
torch path off CUDA (engine/kernels/label_scores.py) and flex attention is compiled only on CUDA. So a
command about to load a model onto the CPU marks triton as absent first (`sys.modules["triton"] = None`
makes `import triton` raise ImportError and `importlib.util.find_spec` answer None), and torch takes its
no-triton paths. Only for commands (their own process), never for the library: a test process may want
triton's interpreter for the kernel tests.
"""

from __future__ import annotations

import sys


def keep_triton_out_on_cpu(device: str) -> bool:
    """Mark triton absent when `device` resolves to the CPU, nothing imported it yet and its interpreter
    is not asked for; True if so."""
    from kafka_scorer.engine.kernels.runs_on import interpreter_asked

    if "triton" in sys.modules or interpreter_asked():
        return False
    from kafka_scorer.engine.load.transformers_parts import resolve_device

    try:
        on_cpu = resolve_device(device).type == "cpu"
    except Exception:  # a bad device setting: the model load reports it, in its own words
        return False
    if on_cpu:
        sys.modules["triton"] = None  # type: ignore[assignment]  # None in sys.modules is Python's documented way to make an import fail
    return on_cpu
