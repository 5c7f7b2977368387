"""A Gated DeltaNet layer run over a packed stream, each sequence (and MIS item) from its own start.

transformers' layer convolves and recurs over its whole input; over a packed stream that carries one
sequence's convolution window and recurrent state into the next (its torch path ignores the
`cu_seq_lens_q` that its fla kernels would honour). This wrapper keeps the checkpoint's layer and its
weights, computes the per-token parts (projections, β, decay, gated norm, output projection) over the
whole stream, and the two stateful parts over `RecurrentRuns`' padded groups:
- the causal depthwise convolution over each run's tokens, after the `window` tokens its run sees
  before it (zeros for a leading run, the query's last tokens for an MIS item);
- the chunked gated delta rule, transformers' own function from the layer's modeling module (fla's
  kernel where transformers picked it), from zero state or the query's final state.
Padding slots are zeroed after the convolution, so their keys and β are 0 and their decay is 1: the
final state a query hands its items is the one its real tokens built. Called without runs (a plain
single-sequence call, as the load-time probes make), the wrapped layer runs as transformers wrote it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kafka_scorer.engine.attention.registry import METADATA_KWARG
from kafka_scorer.engine.layers.parts import number, submodule, tensor
from kafka_scorer.engine.recurrent.projections import GatedDeltaInputs, Projections
from kafka_scorer.engine.recurrent.runs import RUNS_KWARG, RecurrentRuns, RunGroup

DeltaRule = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def delta_rule_of(layer: nn.Module) -> DeltaRule | None:
    """The chunked gated delta rule the layer's own modeling module calls (torch, or fla's kernel)."""
    return getattr(sys.modules.get(type(layer).__module__), "torch_chunk_gated_delta_rule", None)


class PackedGatedDeltaNet(nn.Module):
    """transformers' Gated DeltaNet layer (`inner`), run per run of `RecurrentRuns` when given them."""

    def __init__(
        self, inner: nn.Module, projections: Projections, delta_rule: DeltaRule, slot: int = 0
    ) -> None:
        super().__init__()
        self.inner = inner
        self.slot = slot
        """Its place among the model's Gated DeltaNet layers: its state in a prefix cache entry."""
        self.projections = projections
        self.delta_rule = delta_rule
        self.window = int(number(inner, "conv_kernel_size")) - 1
        from transformers.activations import ACT2FN

        self.activation = ACT2FN[inner.activation]

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: object | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        runs = kwargs.get(RUNS_KWARG)
        if runs is None:
            if kwargs.get(METADATA_KWARG) is not None:
                raise RuntimeError(
                    f"a packed forward reached a Gated DeltaNet layer without `{RUNS_KWARG}`: its sequences "
                    "would share one recurrent state"
                )
            if (
                cache is not None
            ):  # transformers >= 5.2x names it `cache`; older ones `cache_params` (in kwargs)
                kwargs["cache"] = cache
            return self.inner(hidden_states, attention_mask=attention_mask, **kwargs)
        if cache is not None or hidden_states.shape[0] != 1:
            raise RuntimeError("a packed forward is one stream ([1, T, D]) with no cache")
        assert isinstance(runs, RecurrentRuns)
        return self._packed(hidden_states[0], runs)[None]

    def _packed(self, hidden: torch.Tensor, runs: RecurrentRuns) -> torch.Tensor:
        inner = self.inner
        inputs = self.projections(inner, hidden)
        beta = inputs.b.sigmoid()
        a_log, dt_bias = tensor(inner, "A_log"), tensor(inner, "dt_bias")
        decay = -a_log.float().exp() * F.softplus(inputs.a.float() + dt_bias)
        # One zero row past the stream: what padding slots and missing window tokens read; then the
        # cached heads' last inputs, which the sequences cut after them convolve after.
        cached = [runs.entries[entry].state(self.slot) for entry in runs.sources]
        mixed, beta, decay = (_with_zero_row(x) for x in (inputs.mixed, beta, decay))
        if cached:
            mixed = torch.cat([mixed, *(window.to(mixed.dtype) for _, window in cached)])
        heads = torch.stack([state for state, _ in cached]) if cached else None
        core = hidden.new_zeros(hidden.shape[0], inputs.z.shape[1], int(number(inner, "head_v_dim")))
        states: torch.Tensor | None = None
        for group in runs.groups:
            initial = _initial(group, states, heads)
            out, final = self._run_group(group, mixed, beta, decay, initial)
            core.index_copy_(0, group.tokens, out.flatten(0, 1).index_select(0, group.slots))
            if group.keep_rows is not None and group.keep_slots is not None and final is not None:
                if states is None:
                    states = final.new_zeros((runs.kept_states, *final.shape[1:]))
                states.index_copy_(0, group.keep_slots, final.index_select(0, group.keep_rows))
            if group.store_rows is not None and final is not None:
                self._store(runs, group, final, mixed)
        return self._output(core, inputs)

    def _store(self, runs: RecurrentRuns, group: RunGroup, final: torch.Tensor, mixed: torch.Tensor) -> None:
        """Heads computed now keep this layer's final state and last convolution inputs."""
        assert group.store_rows is not None and group.store_window is not None
        for n, entry in enumerate(group.store_entries):
            state = final[group.store_rows[n]]
            runs.entries[entry].store_state(self.slot, state, mixed[group.store_window[n]])

    def _run_group(
        self,
        group: RunGroup,
        mixed: torch.Tensor,
        beta: torch.Tensor,
        decay: torch.Tensor,
        initial: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[B, L, value_heads, value_head_dim] outputs and [B, heads, key_dim, value_dim] final states."""
        inner = self.inner
        convolved = self._convolve(mixed[torch.cat([group.window, group.index], dim=1)])
        convolved = convolved * group.valid[..., None].to(convolved.dtype)
        rows, length = group.index.shape
        key_dim, value_dim = int(number(inner, "key_dim")), int(number(inner, "value_dim"))
        head_k_dim, head_v_dim = int(number(inner, "head_k_dim")), int(number(inner, "head_v_dim"))
        query, key, value = torch.split(convolved, [key_dim, key_dim, value_dim], dim=-1)
        return self.delta_rule(
            query.reshape(rows, length, -1, head_k_dim),
            key.reshape(rows, length, -1, head_k_dim),
            value.reshape(rows, length, -1, head_v_dim),
            g=decay[group.index],
            beta=beta[group.index],
            initial_state=initial,
            output_final_state=group.keep_rows is not None or group.store_rows is not None,
            use_qk_l2norm_in_kernel=True,
            chunk_size=chunk_size(length),
        )

    def _convolve(self, windowed: torch.Tensor) -> torch.Tensor:
        """[B, W + L, C] (each run after its window) -> [B, L, C]: the causal depthwise convolution
        and its activation, every output from its own K inputs, with no padding."""
        conv = conv1d(self.inner)
        out = F.conv1d(
            windowed.transpose(1, 2).to(conv.weight.dtype), conv.weight, conv.bias, groups=windowed.shape[-1]
        )
        return self.activation(out).to(windowed.dtype).transpose(1, 2)

    def _output(self, core: torch.Tensor, inputs: GatedDeltaInputs) -> torch.Tensor:
        """The gated norm and output projection, per token as the layer computes them."""
        inner = self.inner
        heads_dim = int(number(inner, "head_v_dim"))
        normed = submodule(inner, "norm")(core.reshape(-1, heads_dim), inputs.z.reshape(-1, heads_dim))
        return submodule(inner, "out_proj")(normed.reshape(core.shape[0], -1))


def conv1d(layer: nn.Module) -> nn.Conv1d:
    """The layer's short causal convolution (`conv1d`, depthwise)."""
    conv = layer.conv1d
    if not isinstance(conv, nn.Conv1d):
        raise AttributeError(f"{type(layer).__name__}.conv1d is a {type(conv).__name__}, not a Conv1d")
    return conv


def _initial(group: RunGroup, states: torch.Tensor | None, heads: torch.Tensor | None) -> torch.Tensor | None:
    """The rows' initial states: their query's (items), their cached head's (cut sequences), or None
    (zero state)."""
    if group.state_from is not None:
        assert states is not None, "items run after their queries' group"
        return states.index_select(0, group.state_from)
    if group.source_from is not None:
        assert heads is not None, "a cut sequence's head is in the forward's entries"
        return heads.index_select(0, group.source_from)
    return None


CHUNK = 64
"""transformers' chunk of the delta rule: runs longer than this are cut into chunks of this size."""


def chunk_size(length: int) -> int:
    """The delta rule's chunk for runs at most `length` long. A run that fits one chunk gets one chunk of
    the next power of two, not of 64: the rule pads every run to whole chunks and loops over a chunk's
    rows, so MIS items and short pairs (16-32 tokens, a few for the bench's many-items) spent most of it
    on padding. The arithmetic on the real tokens is the same (padding adds exact zeros; measured
    bit-equal on the CPU); longer runs keep transformers' 64, whose chunk boundaries shape their sums.
    A kernel that takes no chunk size (fla's) never sees it: transformers passes on only the arguments
    its implementation names."""
    return CHUNK if length > CHUNK else max(4, 1 << (length - 1).bit_length())


def _with_zero_row(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, x.new_zeros((1, *x.shape[1:]))])
