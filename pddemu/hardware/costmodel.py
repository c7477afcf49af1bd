"""Roofline step times: how long a real instance would take for one prefill, decode or extend step.

An emulated instance runs the tiny model for real and then waits out the duration computed here
for the same step of the target model, so these methods are called once per step and are plain
arithmetic (a few microseconds). All token counts are MODELLED tokens. The formulas are written
out in docs/hardware.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pddemu.hardware.checks import fraction, positive_int
from pddemu.hardware.errors import InstanceError, StepError
from pddemu.hardware.profiles import ChipProfile, TargetModel

ACTIVATION_BYTES = 2
"""Bytes per activation element in the tensor-parallel all-reduces (BF16)."""

ALL_REDUCES_PER_LAYER = 2
"""Megatron-style tensor parallelism all-reduces once after attention and once after the MLP."""


@dataclass(frozen=True)
class InstanceHardware:
    """`chips` chips of one profile serving one model replica with tensor parallelism.

    The efficiencies are the achievable fractions of peak for a whole step (kernels, gaps,
    imbalance), not of the best kernel; `memory_utilization` is the share of memory the
    serving engine may use for weights plus KV (vLLM's `gpu_memory_utilization` defaults to
    the same 0.9), the rest being activations and workspace.
    """

    chip: ChipProfile
    chips: int = 8
    compute_efficiency: float = 0.5
    memory_efficiency: float = 0.7
    step_overhead_s: float = 0.005
    interconnect_efficiency: float = 0.7
    memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        owner = "instance hardware"
        if not isinstance(self.chip, ChipProfile):
            raise InstanceError(f"{owner}: chip must be a ChipProfile, got {self.chip!r}")
        positive_int(owner, "chips", self.chips, InstanceError)
        for name in (
            "compute_efficiency",
            "memory_efficiency",
            "interconnect_efficiency",
            "memory_utilization",
        ):
            value = fraction(owner, name, getattr(self, name), InstanceError)
            object.__setattr__(self, name, value)
        overhead = self.step_overhead_s
        if isinstance(overhead, bool) or not isinstance(overhead, int | float):
            raise InstanceError(f"{owner}: step_overhead_s must be a number, got {overhead!r}")
        if not math.isfinite(overhead) or overhead < 0:
            raise InstanceError(
                f"{owner}: step_overhead_s must be finite and not negative, got {overhead!r}"
            )
        object.__setattr__(self, "step_overhead_s", float(overhead))

    @property
    def achievable_flops(self) -> float:
        """FLOP/s the whole instance sustains in a compute-bound step."""
        return self.chip.peak_flops * self.chips * self.compute_efficiency

    @property
    def achievable_memory_bw(self) -> float:
        """Bytes/s the whole instance reads from or writes to memory in a memory-bound step."""
        return self.chip.memory_bw * self.chips * self.memory_efficiency

    @property
    def achievable_interconnect_bw(self) -> float:
        """Bytes/s one chip sends to its peers (every chip sends in parallel)."""
        return self.chip.interconnect_bw * self.interconnect_efficiency

    @property
    def achievable_host_bw(self) -> float:
        """Bytes/s the whole instance moves from host memory to its chips (every chip over its
        own host link, in parallel, at the links' efficiency)."""
        return self.chip.host_bw * self.chips * self.interconnect_efficiency

    @property
    def usable_memory_bytes(self) -> float:
        """Memory of all chips the engine may fill with weights and KV."""
        return self.chip.memory_bytes * self.chips * self.memory_utilization

    @property
    def price_per_hour(self) -> float:
        return self.chip.price_per_hour * self.chips


class StepTime(NamedTuple):
    """The terms of one step's roofline, in modelled seconds; the step takes `total_s`."""

    compute_s: float
    memory_s: float
    interconnect_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.interconnect_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """Which resource limits the step: "compute", "memory" or "interconnect"."""
        terms = {
            "compute": self.compute_s,
            "memory": self.memory_s,
            "interconnect": self.interconnect_s,
        }
        return max(terms, key=terms.__getitem__)


def _count(what: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StepError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True)
class CostModel:
    """Step durations of `target` on `instance`.

    A forward step processes, for each request in it, `new` tokens on top of `context` tokens
    already in the KV. It reads the weights its tokens touch (a mixture of experts: the
    always-active weights and the experts the step's tokens pick, `TargetModel.weight_bytes_read`)
    and every request's KV. Compute, memory traffic and tensor-parallel communication are assumed
    to overlap, so the step takes the largest of the three plus a fixed per-step overhead.

    Prefill runs in chunks of at most `prefill_chunk_tokens`; with `pad_chunks` every chunk is
    costed as a full slot, as an engine with static step shapes runs it, so a small tail chunk
    wastes most of its slot.
    """

    instance: InstanceHardware
    target: TargetModel
    prefill_chunk_tokens: int = 8192
    pad_chunks: bool = True
    _linear_flops_per_token: float = field(init=False, repr=False)
    _attention_flops_per_pair: float = field(init=False, repr=False)
    _comm_bytes_per_token: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.instance, InstanceHardware):
            raise InstanceError(f"instance must be an InstanceHardware, got {self.instance!r}")
        if not isinstance(self.target, TargetModel):
            raise InstanceError(f"target must be a TargetModel, got {self.target!r}")
        positive_int("cost model", "prefill_chunk_tokens", self.prefill_chunk_tokens, InstanceError)
        if not isinstance(self.pad_chunks, bool):
            raise InstanceError(f"cost model: pad_chunks must be a bool, got {self.pad_chunks!r}")
        if self.kv_capacity_tokens() < 1:
            raise InstanceError(
                f"{self.target.name}'s weights ({self.target.weight_bytes / 1e9:.1f} GB) leave no "
                f"room for KV in {self.instance.chips} x {self.instance.chip.name} "
                f"({self.instance.usable_memory_bytes / 1e9:.1f} GB usable): add chips"
            )
        target, chips = self.target, self.instance.chips
        ring_share = 2 * (chips - 1) / chips
        object.__setattr__(self, "_linear_flops_per_token", 2 * target.active_params)
        object.__setattr__(
            self, "_attention_flops_per_pair", 4 * target.n_layers * target.hidden_size
        )
        object.__setattr__(
            self,
            "_comm_bytes_per_token",
            ALL_REDUCES_PER_LAYER
            * target.n_layers
            * target.hidden_size
            * ACTIVATION_BYTES
            * ring_share,
        )

    @property
    def price_per_hour(self) -> float:
        """Price of the whole instance per hour (chips x the chip's price)."""
        return self.instance.price_per_hour

    def kv_capacity_tokens(self) -> int:
        """Modelled tokens of KV the instance can hold beside the weights."""
        free = self.instance.usable_memory_bytes - self.target.weight_bytes
        return max(0, math.floor(free / self.target.kv_bytes_per_token))

    def chunks_for(self, new_tokens: int, context: int) -> list[tuple[int, int]]:
        """Split one request's prefill of `new_tokens` after `context` into chunks, in order."""
        _count("new_tokens", new_tokens, 1)
        _count("context", context, 0)
        size = self.prefill_chunk_tokens
        return [
            (min(size, new_tokens - done), context + done) for done in range(0, new_tokens, size)
        ]

    def explain(self, chunks: Sequence[tuple[int, int]]) -> StepTime:
        """Roofline terms of one forward step over `(new tokens, context)` chunks, unpadded."""
        if not chunks:
            raise StepError("a step needs at least one (new tokens, context) chunk")
        tokens = pairs = context_read = 0
        for chunk in chunks:
            new, context = self._chunk(chunk)
            tokens += new
            pairs += new * context + new * (new + 1) // 2
            context_read += context
        return self._terms(tokens, pairs, context_read)

    def forward_step(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Seconds for one step over `(new tokens, context)` chunks as given (no padding).

        This is the mixed step: an instance decoding a batch while extending one request runs
        `[(1, c1), ..., (1, cn), (k, c)]` in one forward pass.
        """
        return self.explain(chunks).total_s

    def prefill_step(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Seconds for one prefill step over chunks batched across requests.

        Each chunk is `(new tokens, context tokens before the chunk)` with at most
        `prefill_chunk_tokens` new tokens; with `pad_chunks` each costs a full slot.
        """
        if not chunks:
            raise StepError("a prefill step needs at least one chunk")
        size = self.prefill_chunk_tokens
        slots = []
        for chunk in chunks:
            new, context = self._chunk(chunk)
            if new > size:
                raise StepError(
                    f"a prefill chunk holds at most {size} new tokens, got {new}: "
                    "split it with chunks_for()"
                )
            slots.append((size if self.pad_chunks else new, context))
        return self.explain(slots).total_s

    def decode_step(self, contexts: Sequence[int]) -> float:
        """Seconds for one decode step of a continuous batch: one new token per request."""
        if not contexts:
            raise StepError("a decode step needs at least one request")
        total = 0
        for context in contexts:
            total += _count("a decode context", context, 0)
        batch = len(contexts)
        return self._terms(batch, total + batch, total).total_s

    def extend_step(self, k: int, context: int) -> float:
        """Seconds to run `k` given tokens in one forward pass on top of `context` tokens.

        What MD runs for an Extend-Decode handoff: the eager tokens' KV recomputed at once.
        """
        _count("extend tokens k", k, 1)
        _count("extend context", context, 0)
        return self._terms(k, k * context + k * (k + 1) // 2, context).total_s

    def kv_copy(self, tokens: int) -> float:
        """Seconds to place `tokens` tokens of KV received over the network (in host memory)
        into the instance's KV cache: the bytes over the chips' host links, plus one step's
        fixed overhead (launching the copy and scattering it into the cache's pages). What MD
        spends on a KV-delta handoff after the transfer; it runs beside the decode steps (copy
        engines), delaying only the request it is for."""
        _count("copied tokens", tokens, 1)
        size = tokens * self.target.kv_bytes_per_token
        return self.instance.step_overhead_s + size / self.instance.achievable_host_bw

    def _chunk(self, chunk: tuple[int, int]) -> tuple[int, int]:
        try:
            new, context = chunk
        except (TypeError, ValueError):
            raise StepError(f"a chunk is a (new tokens, context) pair, got {chunk!r}") from None
        return _count("a chunk's new tokens", new, 1), _count("a chunk's context", context, 0)

    def _terms(self, tokens: int, pairs: int, context_read: int) -> StepTime:
        """The roofline of a step of `tokens` new tokens with `pairs` attention (query, key)
        pairs that reads `context_read` tokens of existing KV."""
        instance, target = self.instance, self.target
        flops = self._linear_flops_per_token * tokens + self._attention_flops_per_pair * pairs
        memory = target.weight_bytes_read(tokens) + target.kv_bytes_per_token * (
            context_read + tokens
        )
        communication = self._comm_bytes_per_token * tokens
        return StepTime(
            compute_s=flops / instance.achievable_flops,
            memory_s=memory / instance.achievable_memory_bw,
            interconnect_s=communication / instance.achievable_interconnect_bw,
            overhead_s=instance.step_overhead_s,
        )
