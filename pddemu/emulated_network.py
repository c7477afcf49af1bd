"""The emulated network of a scenario: its scale model, the netem links it asks for, the TCP
parameters of the routes across the WAN, and what runs on them during a replay (the timeline's
link events, cross-traffic).

The network runs on the run's clock page (`netem.clock`): the shaper, the schedule and the
cross-traffic time everything in modelled time, so links are given in modelled units, their
rates scaled by the byte scale only. However the clock is dilated, a transfer takes its
modelled time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from netem.crosstraffic import CrossTraffic, CrossTrafficSpec, TimedChange, load_cross_schedule
from netem.spec import LinkSpec, LossModel
from netem.tcp import TcpTuning
from netem.topology import LinkConfig, Network
from pddemu.config import Config
from pddemu.hardware import load_target
from pddemu.model import ModelConfig
from pddemu.scale import ScaleModel
from pddemu.timeline import Timeline

LINUX_RTO_MIN_S = 0.2  # the kernel's floor of the retransmission timeout (TCP_RTO_MIN)
MIN_FLOW_WINDOW_S = 0.001  # a WAN with no delay and no queue still counts its flows
TCP_HEADERS = 52  # IPv4, TCP and its timestamps option: what a segment carries besides data


def scale_model(config: Config) -> ScaleModel:
    """Tokens and bytes scaled; time not (time_scale 1): the links run on the run's clock."""
    return ScaleModel(
        genuine_kv_bytes_per_token=ModelConfig(**config.model).kv_bytes_per_token,
        target_kv_bytes_per_token=load_target(config.target).kv_bytes_per_token,
        token_scale=config.scale.token_scale,
        time_scale=1.0,
    )


def queue_seconds(config: Config) -> float | None:
    """The WAN bottleneck's queue limit in modelled time at its rate: `[wan] queue_ms`, by
    default one round trip (a bandwidth-delay product); None when the WAN is unshaped."""
    wan = config.wan
    if wan.rate_bps is None:
        return None
    return wan.queue_ms / 1e3 if wan.queue_ms is not None else 2 * wan.delay_s


def queue_bytes(config: Config, scale: ScaleModel) -> int | None:
    """The WAN bottleneck's queue limit (`queue_seconds`) in genuine bytes."""
    wan = config.wan
    queue_s = queue_seconds(config)
    if wan.rate_bps is None or queue_s is None:
        return None
    mtu = LinkSpec().mtu
    return max(mtu, math.ceil(wan.rate_bps * scale.byte_scale * queue_s / 8))


def path_packets(config: Config, scale: ScaleModel) -> float | None:
    """The emulated WAN's path in MTU-sized packets: its queue limit plus the bandwidth-delay
    product of the round trip, what the flows that share it may have in flight together (None
    when the WAN is unshaped)."""
    wan = config.wan
    if wan.rate_bps is None:
        return None
    mtu = LinkSpec().mtu
    queue = (queue_bytes(config, scale) or mtu) / mtu
    return wan.rate_bps * scale.byte_scale * 2 * wan.delay_s / 8 / mtu + queue


def flow_window(config: Config) -> float | None:
    """The window the shaper counts the WAN's flows in (`netem.flow_count`): one round trip
    with the queue full (modelled s), within which every flow with data in flight sends; None
    when the WAN is unshaped."""
    queue_s = queue_seconds(config)
    if queue_s is None:
        return None
    return max(2 * config.wan.delay_s + queue_s, MIN_FLOW_WINDOW_S)


def tcp_tuning(config: Config, scale: ScaleModel) -> TcpTuning:
    """TCP on the emulated WAN as on the modelled path (what each parameter does, and what it
    was measured to change: `netem.tcp`, docs/netem.md): the kernel's 200 ms RTO floor in
    modelled time; no delayed ACKs (their 40 ms timer runs in wall time); a first window that
    the bottleneck's queue takes at once (it leaves unpaced; an idle connection starts again
    from it, after an idle time that follows the RTO, so in modelled time too) and a receive
    window that lets the path and its queue fill from the first round trip; and the congestion
    control of `[wan] tcp_congestion`, whatever the host's default."""
    wan = config.wan
    mtu = LinkSpec().mtu
    burst = path = None
    packets = path_packets(config, scale)
    if packets is not None:
        queue = (queue_bytes(config, scale) or mtu) / mtu  # packets
        burst = max(1, math.floor(queue))  # what the queue takes at once: it comes unpaced
        path = max(burst, math.ceil(packets))
    return TcpTuning(
        rto_min_s=LINUX_RTO_MIN_S,
        quickack=True,
        initcwnd=burst,
        initrwnd=path,
        congestion=wan.tcp_congestion,
    )


def wan_link(config: Config, scale: ScaleModel) -> LinkSpec:
    """The emulated WAN: the modelled one scaled in rate (bytes and time) and delay (time),
    with its queueing discipline and loss model as they are."""
    wan = config.wan
    rate, delay, jitter = scale.emulated_link(wan.rate_bps or 1e12, wan.delay_s, wan.jitter_s)
    return LinkSpec(
        rate_bps=rate if wan.rate_bps else None,
        qdisc=wan.qdisc,
        delay_s=delay,
        jitter_s=jitter,
        jitter_dist=wan.jitter_dist,
        loss=wan.loss_model,
        limit_bytes=queue_bytes(config, scale),
    ).validate()


def intra_link(config: Config, scale: ScaleModel) -> LinkConfig | None:
    intra = config.intra
    if intra.rate_bps is None and intra.delay_s == 0 and intra.jitter_s == 0 and not intra.loss:
        return None
    rate, delay, jitter = scale.emulated_link(intra.rate_bps or 1e12, intra.delay_s, intra.jitter_s)
    loss = LossModel("bernoulli", intra.loss) if intra.loss else LossModel()
    return LinkConfig.symmetric(
        LinkSpec(
            rate_bps=rate if intra.rate_bps else None,
            delay_s=delay,
            jitter_s=jitter,
            jitter_dist=intra.jitter_dist,
            loss=loss,
        ).validate()
    )


def timeline_of(config: Config) -> Timeline:
    return Timeline.load(config.wan.schedule, config.faults.schedule)


def network_for(config: Config, scale: ScaleModel, clock: bool = True, **kwargs: Any) -> Network:
    """The scenario's network (not yet up), with TCP tuned to the modelled path, on a clock
    page (`clock`; without one, in real time: wall seconds are modelled ones). A timeline's
    link events are its schedule, started with each replay (`replay_conditions`), so the
    links they touch go through the shaper, which counts the WAN's flows per window
    (`flow_window`) for the run's judgement (`pddemu.metrics.wan_flows`). Its random draws
    (loss, jitter) are seeded by `[workload] seed` unless `kwargs` say otherwise."""
    kwargs.setdefault("seed", config.workload.seed)
    kwargs.setdefault("flow_window_s", flow_window(config))
    return Network(
        LinkConfig.symmetric(wan_link(config, scale)),
        intra=intra_link(config, scale),
        schedule=timeline_of(config).link_schedule(scale),
        schedule_from_up=False,
        clock=clock,
        tcp=tcp_tuning(config, scale),
        **kwargs,
    )


def cross_traffic_spec(config: Config, scale: ScaleModel) -> CrossTrafficSpec | None:
    """`[wan.cross_traffic]` on the emulated link: modelled bytes become genuine ones (the byte
    scale); times stay modelled seconds, read on the run's clock page like the links'
    (`scale_model` has time scale 1); utilisation is the same at any scale."""
    cross = config.wan.cross_traffic
    if cross is None:
        return None
    schedule: tuple[TimedChange, ...] = ()
    if cross.schedule:
        schedule = tuple(
            replace(
                change,
                flow_bytes=max(1, round(change.flow_bytes * scale.byte_scale))
                if change.flow_bytes is not None
                else None,
            )
            for change in load_cross_schedule(cross.schedule)
        )
    return CrossTrafficSpec(
        utilisation=cross.utilisation,
        sizes=cross.sizes,
        mean_bytes=max(1, round(cross.mean_size_bytes * scale.byte_scale)),
        pareto_shape=cross.pareto_shape,
        arrivals=cross.arrivals,
        direction=cross.direction,
        max_flows=cross.max_flows,
        schedule=schedule,
        seed=config.workload.seed,
    ).validate()


class ReplayConditions:
    """What runs on the WAN during one replay besides the replay itself: the timeline's link
    events and the cross-traffic. Made ready first (a generator process takes a moment to
    start), begun at the replay's time 0, ended with the replay; then the links are as before
    and `cross_traffic` holds the summary of what the other tenants got."""

    def __init__(self, network: Network, config: Config, scale: ScaleModel) -> None:
        self.network = network
        self.scale = scale
        spec = cross_traffic_spec(config, scale)
        self.cross = CrossTraffic(network, spec) if spec is not None else None
        self.begun = False
        self.cross_traffic: dict[str, Any] | None = None

    def prepare(self) -> None:
        if self.cross is not None:
            self.cross.prepare()

    def begin(self, start: float) -> None:
        """Time 0 of the timeline and of the cross-traffic: `start`, on the network's clock."""
        self.begun = True
        if self.network.schedule is not None:
            self.network.start_schedule(start)
        if self.cross is not None:
            self.cross.begin(start)

    def end(self) -> None:
        try:
            if self.cross is not None:
                if self.begun:
                    self.cross_traffic = cross_traffic_summary(self.cross.stop(), self.scale)
                else:
                    self.cross.kill()
        finally:
            if self.begun and self.network.schedule is not None and self.network.record:
                self.network.stop_schedule()


@contextmanager
def replay_conditions(
    network: Network, config: Config, scale: ScaleModel
) -> Iterator[ReplayConditions]:
    """Conditions made ready; the caller begins them at its replay's time 0."""
    conditions = ReplayConditions(network, config, scale)
    try:
        conditions.prepare()
        yield conditions
    finally:
        conditions.end()


def cross_traffic_summary(report: dict[str, Any], scale: ScaleModel) -> dict[str, Any]:
    """The generator's report in the summary's terms: modelled seconds and bytes beside the
    genuine bytes on the emulated link, and the mean utilisation over the loaded directions."""
    directions = report["directions"]
    loaded = [d for d in directions.values() if d["target_utilisation"] > 0 or d["flows"]]
    genuine = sum(d["bytes"] for d in directions.values())
    return {
        "duration_s": scale.wall_to_modelled(report["duration_s"]),
        "target_utilisation": _mean([d["target_utilisation"] for d in loaded]),
        "utilisation": _mean([d["utilisation"] for d in loaded]),
        "bytes": scale.modelled_bytes(genuine),
        "bytes_genuine": genuine,
        "flows": sum(d["flows"] for d in directions.values()),
        "flows_skipped": sum(d["flows_skipped"] for d in directions.values()),
        "directions": {
            name: {
                "target_utilisation": d["target_utilisation"],
                "utilisation": d["utilisation"],
                "bytes": scale.modelled_bytes(d["bytes"]),
                "bytes_genuine": d["bytes"],
                "flows": d["flows"],
                "flows_completed": d["flows_completed"],
                "flows_skipped": d["flows_skipped"],
            }
            for name, d in directions.items()
        },
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
