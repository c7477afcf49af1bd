"""The hardware model: chips, target models and the roofline giving each step's duration.

Public API: `ChipProfile`, `TargetModel`, `load_chip`, `load_target`, `load_chips`,
`load_targets`, `InstanceHardware`, `CostModel`, `StepTime`, and the `HardwareError` family.
"""

from __future__ import annotations

from pddemu.hardware.costmodel import CostModel, InstanceHardware, StepTime
from pddemu.hardware.errors import HardwareError, InstanceError, ProfileError, StepError
from pddemu.hardware.profiles import (
    ChipProfile,
    TargetModel,
    load_chip,
    load_chips,
    load_target,
    load_targets,
)

__all__ = [
    "ChipProfile",
    "CostModel",
    "HardwareError",
    "InstanceError",
    "InstanceHardware",
    "ProfileError",
    "StepError",
    "StepTime",
    "TargetModel",
    "load_chip",
    "load_chips",
    "load_target",
    "load_targets",
]
