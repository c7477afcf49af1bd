"""From the config to what an instance needs to size its work: the cost model of its hardware,
and the config's modelled quantities turned into genuine ones (token scale)."""

from __future__ import annotations

from pddemu.config import Config
from pddemu.hardware import CostModel, InstanceHardware, load_chip, load_target


def cost_model(config: Config, system: str, role: str) -> CostModel:
    """The step-duration model of `role`'s instances in `system`."""
    hardware = config.hardware_for(system, role)
    instance = InstanceHardware(
        chip=load_chip(hardware.chip),
        chips=hardware.chips,
        compute_efficiency=hardware.compute_efficiency,
        memory_efficiency=hardware.memory_efficiency,
        step_overhead_s=hardware.step_overhead_s,
    )
    return CostModel(
        instance, load_target(config.target), config.prefill.chunk_tokens, config.prefill.pad_chunks
    )
