"""The emulated network of a scenario: its scale model and the netem links it asks for."""

from __future__ import annotations

from netem.spec import LinkSpec
from netem.topology import LinkConfig
from pddemu.config import Config
from pddemu.hardware import load_target
from pddemu.model import ModelConfig
from pddemu.scale import ScaleModel


def scale_model(config: Config) -> ScaleModel:
    return ScaleModel(
        genuine_kv_bytes_per_token=ModelConfig(**config.model).kv_bytes_per_token,
        target_kv_bytes_per_token=load_target(config.target).kv_bytes_per_token,
        token_scale=config.scale.token_scale,
        time_scale=config.scale.time_scale,
    )


def wan_link(config: Config, scale: ScaleModel) -> LinkSpec:
    """The emulated WAN: the modelled one scaled in rate (bytes and time) and delay (time)."""
    wan = config.wan
    rate, delay, jitter = scale.emulated_link(wan.rate_bps or 1e12, wan.delay_s, wan.jitter_s)
    loss = {"kind": "bernoulli", "p": wan.loss} if wan.loss else {"kind": "none"}
    return LinkSpec.from_dict(
        {
            "rate_bps": rate if wan.rate_bps else None,
            "delay_s": delay,
            "jitter_s": jitter,
            "jitter_dist": wan.jitter_dist,
            "loss": loss,
        }
    )


def intra_link(config: Config, scale: ScaleModel) -> LinkConfig | None:
    intra = config.intra
    if intra.rate_bps is None and intra.delay_s == 0 and intra.jitter_s == 0:
        return None
    rate, delay, jitter = scale.emulated_link(intra.rate_bps or 1e12, intra.delay_s, intra.jitter_s)
    return LinkConfig.symmetric(
        LinkSpec(rate_bps=rate if intra.rate_bps else None, delay_s=delay, jitter_s=jitter)
    )
