"""Exceptions of the hardware model: one base class so callers can catch any bad hardware input."""

from __future__ import annotations


class HardwareError(ValueError):
    """Bad input to the hardware model (a profile, an instance, a step)."""


class ProfileError(HardwareError):
    """A chip or target-model profile is unknown, incomplete or has an invalid field."""


class InstanceError(HardwareError):
    """An instance configuration is invalid or cannot hold the target model."""


class StepError(HardwareError):
    """A step was described with invalid token counts (negative, empty batch, oversized chunk)."""
