"""Two datacenters in network namespaces, joined by a shaped WAN link.

    host ──veth── [a] ──WAN (shaped)── [b]
                   │
            intra-DC path (veth, or shaped)
                   │
                 [a2]

`a` is DC A's main host (where a controller's traffic enters), `a2` a second host of DC A
behind the intra-DC path (stands for RDMA between machines of one datacenter), `b` is DC B.
Every namespace has one address, on its loopback, in 198.18.0.0/15; `a` forwards between its
three links. The host reaches the run's addresses only over the run's own veth.

The WAN (and a shaped intra-DC path) is either a pair of TUN interfaces served by the
userspace shaper process, or a veth pair with sch_netem on both ends (kernel backend).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute, netns

from netem import control, kernel, nsutil
from netem.addressing import Addresses
from netem.clock import SharedClock
from netem.crosstraffic import CrossTraffic, CrossTrafficError, CrossTrafficSpec
from netem.registry import (
    HOST_LINK_PREFIX,
    Registry,
    RunError,
    RunRecord,
    namespace_name,
    process_start,
)
from netem.schedule import Schedule
from netem.spec import LinkSpec, LossModel, changes_from_dict, changes_to_dict
from netem.tcp import TcpTuning, route_metrics
from netem.tun import DEFAULT_TUN_DEVICE

BACKENDS = ("auto", "kernel", "userspace")
TUN_TX_QUEUE = 32768  # packets the kernel may queue for the shaper before dropping
RTNH_F_ONLINK = 4  # a gateway reachable on the link without a route to it
SHAPER_START_TIMEOUT_S = 20.0
# Per-namespace TCP buffers: the kernel's default 6 MB receive limit is below the bandwidth-
# delay product of 1 Gbit/s over a 40 ms round trip (5 MB) plus queueing.
TCP_MEMORY = "4096 131072 67108864"


class TopologyError(RuntimeError):
    """The topology could not be built or changed."""


@dataclass(frozen=True)
class LinkConfig:
    """A link's two directions. `a2b` is traffic from the a side (DC A) to the b side."""

    a2b: LinkSpec
    b2a: LinkSpec

    @classmethod
    def symmetric(cls, spec: LinkSpec) -> LinkConfig:
        return cls(spec, spec)

    @property
    def shaped(self) -> bool:
        return any(
            s.rate_bps is not None or s.delay_s > 0 or s.jitter_s > 0 or s.loss.kind != "none"
            for s in (self.a2b, self.b2a)
        )


@dataclass(frozen=True)
class Endpoint:
    netns: str
    addr: str


@dataclass
class Network:
    """A run: build with `up()` (or `with Network(...) as net:`), remove with `down()`.

    With a `schedule`, the links it touches are served by the userspace shaper; its time 0 is
    when the run is up, or, with `schedule_from_up=False`, whatever `start_schedule` says
    (pddemu starts it with each replay).
    """

    wan: LinkConfig
    intra: LinkConfig | None = None
    name: str = field(default_factory=lambda: "r" + secrets.token_hex(4))
    backend: str = "auto"
    tun_device: str = DEFAULT_TUN_DEVICE
    seed: int = 0
    registry: Registry = field(default_factory=Registry)
    tcp: TcpTuning | None = None  # on the routes that cross the WAN (netem.tcp)
    schedule: Schedule | None = None
    schedule_from_up: bool = True
    cross_traffic: CrossTrafficSpec | None = None  # started when the run is up
    # the userspace shaper at real-time priority where allowed (netem.shaper): its releases keep
    # their times however busy the host is with the processes it carries traffic for
    realtime_shaper: bool = False
    # the shaper records what each direction delivered per interval this wide (netem.delivery;
    # `deliveries()`): for measurement runs, it grows with the run
    record_interval_s: float | None = None
    # the shaper counts each direction's TCP flows with data, and its drops, per window this
    # wide (netem.flow_count; `flow_counts()`): a judged run's, it grows with the run
    flow_window_s: float | None = None
    # A clock page (netem.clock) in the run's directory, which the shaper follows: the links'
    # rates, delays and schedules are then in the clock's time, not the wall's.
    clock: bool = False

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise TopologyError(
                f"unknown backend {self.backend!r}: use one of {', '.join(BACKENDS)}"
            )
        self.wan.a2b.validate()
        self.wan.b2a.validate()
        if self.wan.a2b.mtu != self.wan.b2a.mtu:
            raise TopologyError("both directions of the WAN must have the same mtu")
        if self.schedule is not None:
            self.schedule.validate()
            if "intra" in self.schedule.links() and self.intra is None:
                self.intra = LinkConfig.symmetric(LinkSpec())  # served by the shaper to switch
        self.record: RunRecord | None = None
        self._tun_links: set[str] = set()
        self.shaper: subprocess.Popen | None = None
        self.backend_reason = ""
        self._guardian: subprocess.Popen | None = None
        self._guardian_pipe: int | None = None
        self._cross: CrossTraffic | None = None
        self.cross_traffic_report: dict[str, Any] | None = None
        self.clock_path: Path | None = None

    # -- life cycle ---------------------------------------------------------------------

    def __enter__(self) -> Network:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Network:
        self.record = self.registry.claim(self.name)
        try:
            self._start_guardian()
            self._build()
            if self.cross_traffic is not None:
                self._cross = CrossTraffic(self, self.cross_traffic)
                self._cross.start()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Remove everything this run made. Safe to call more than once."""
        cross, self._cross = self._cross, None
        if cross is not None:
            try:
                self.cross_traffic_report = cross.stop()
            except CrossTrafficError:
                pass  # the run's cleanup stops whatever is left in its namespaces
        if self.shaper and self.shaper.poll() is None:
            self.shaper.terminate()
            try:
                self.shaper.wait(5)
            except subprocess.TimeoutExpired:
                self.shaper.kill()
                self.shaper.wait()
        if self.record is not None:
            self.registry.cleanup(self.name)
            self.record = None
        self._release_guardian()

    # -- addresses ----------------------------------------------------------------------

    @property
    def addresses(self) -> Addresses:
        if self.record is None:
            raise TopologyError(f"run {self.name} is not up")
        return Addresses.for_slot(self.record.slot)

    @property
    def a(self) -> Endpoint:
        return Endpoint(namespace_name(self.name, "a"), self.addresses.a)

    @property
    def a2(self) -> Endpoint:
        return Endpoint(namespace_name(self.name, "a2"), self.addresses.a2)

    @property
    def b(self) -> Endpoint:
        return Endpoint(namespace_name(self.name, "b"), self.addresses.b)

    def ready_message(self) -> dict[str, Any]:
        """The one JSON line `netem up` prints when the run is usable."""
        return {
            "ready": True,
            "name": self.name,
            "backend": self.record.backend if self.record else self.backend,
            "a": vars(self.a),
            "b": vars(self.b),
            "a2": vars(self.a2),
            "host": {"addr": self.addresses.host},
            "pid": os.getpid(),
            **(
                {"cross_traffic": {"a": self.addresses.cross_a, "b": self.addresses.cross_b}}
                if self.cross_traffic is not None
                else {}
            ),
        }

    # -- live changes -------------------------------------------------------------------

    def set_link(
        self, link: str = "wan", direction: str = "both", **changes: Any
    ) -> dict[str, LinkSpec]:
        """Change a link while traffic flows: fields of LinkSpec (rate_bps, delay_s, ...)."""
        return apply_change(self.registry, self.name, link, direction, changes)

    def set_link_state(self, link: str = "wan", up: bool = True, direction: str = "both") -> None:
        """Take a link down (everything on it is lost) or bring it back."""
        apply_state(self.registry, self.name, link, direction, up)

    def retime_tcp(self, rate: float) -> None:
        """Set the TCP parameters of the routes across the WAN for a clock running at `rate`
        (the path's seconds per wall second): connections take them at their next send. Safe
        from any thread, also beside a running event loop."""
        if self.tcp is None:
            raise TopologyError(f"run {self.name} has no TCP parameters to set")
        metrics = self.tcp.metrics(rate)
        for ns, dst in self.wan_routes():
            # Entered by this thread, not with IPRoute(netns=...): that forks a helper, which
            # would share the caller's signal wake-up fd (an event loop's) and, when stopped,
            # look to the loop like a SIGTERM.
            with nsutil.inside(ns), IPRoute() as ipr:
                (route,) = [r for r in ipr.get_routes(table=254) if _dst(r) == dst]
                oif = route.get_attr("RTA_OIF")
                (device,) = ipr.get_links(oif)
                ipr.route(
                    "replace",
                    dst=dst,
                    oif=oif,
                    gateway=route.get_attr("RTA_GATEWAY"),
                    prefsrc=route.get_attr("RTA_PREFSRC"),
                    flags=route["flags"],
                    # the device's MTU as the route's own: without it, a connection's send
                    # soon after a replace is sized by the old route, whose MTU then reads 68
                    # (TCP_INFO's pmtu), and leaves in segments of TCP's least size (36 bytes
                    # of data): a routing message of 8 KB took 233 packets, 15 ms longer
                    metrics={**metrics, "mtu": device.get_attr("IFLA_MTU")},
                )

    def wan_routes(self) -> list[tuple[str, str]]:
        """(namespace, destination) of every route whose traffic crosses the WAN: the
        emulator's and cross-traffic's (DC A's route to cross_b; DC B's A block holds cross_a),
        so other tenants' flows run the same TCP as the emulator's."""
        addr = self.addresses
        return [
            (self.a.netns, f"{addr.b}/32"),
            (self.a.netns, f"{addr.cross_b}/32"),
            (self.a2.netns, f"{addr.b}/32"),
            (self.b.netns, addr.a_block),
        ]

    def tcp_metrics(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The metrics the WAN routes carry now, by (namespace, destination)."""
        found = {}
        for ns, dst in self.wan_routes():
            with IPRoute(netns=ns, flags=0) as ipr:
                for route in ipr.get_routes(table=254):
                    if _dst(route) == dst:
                        found[(ns, dst)] = route_metrics(route)
        return found

    def start_schedule(self, start: float, schedule: Schedule | None = None) -> None:
        """Follow the run's schedule (or `schedule`, which may only touch the links the run's
        own schedule touches) from `start`, possibly ahead, in the shaper's time: the clock page's
        when the network has one, else a time.monotonic() instant."""
        schedule = schedule or self.schedule
        if schedule is None:
            raise TopologyError(f"run {self.name} has no schedule to start")
        record = self._require_record()
        if not record.control:
            raise TopologyError(f"run {self.name} has no userspace shaper to follow a schedule")
        control.request(
            record.control, {"op": "schedule", "schedule": schedule.to_dict(), "start": start}
        )

    def stop_schedule(self) -> None:
        """Stop following the schedule: every link returns to what it was before it began."""
        record = self._require_record()
        if record.control:
            control.request(record.control, {"op": "unschedule"})

    def restart_draws(self) -> None:
        """The shaper's loss and jitter draws from their start (`seed`'s), as on the run's
        first packet: each of several replays in turn on this network meets the same weather.
        The kernel backend's netem draws its own, unseeded (nothing to restart)."""
        record = self._require_record()
        if record.control:
            control.request(record.control, {"op": "restart_draws", "seed": self.seed})

    def release_lag(self) -> dict[str, Any] | None:
        """How late the shaper let packets go, in its clock's time (None: no shaper)."""
        record = self._require_record()
        if not record.control:
            return None
        return control.request(record.control, {"op": "stats"})["release_lag"]

    def deliveries(self) -> dict[str, Any]:
        """The shaper's delivery records by link and direction (`netem.delivery`); the run
        must have been made with `record_interval_s`."""
        record = self._require_record()
        if not record.control or self.record_interval_s is None:
            raise TopologyError(f"run {self.name} records no deliveries")
        return control.request(record.control, {"op": "stats"})["delivery"]

    def flow_counts(self) -> dict[str, Any]:
        """The shaper's flow counts by link and direction (`netem.flow_count`); the run must
        have been made with `flow_window_s`."""
        record = self._require_record()
        if not record.control or self.flow_window_s is None:
            raise TopologyError(f"run {self.name} counts no flows")
        return control.request(record.control, {"op": "stats"})["flows"]

    def flows_since(self, since: Mapping[str, int], link: str = "wan") -> dict[str, Any]:
        """`link`'s flow counts by direction from each direction's window in `since` on (0
        for one not named), the windows before forgotten (the shaper's `flows` op,
        `netem.flow_count.FlowCount.since`): a long run's reader follows them at a cost per
        round bounded by the windows since its last; the run must have been made with
        `flow_window_s`."""
        record = self._require_record()
        if not record.control or self.flow_window_s is None:
            raise TopologyError(f"run {self.name} counts no flows")
        request = {"op": "flows", "link": link, "since": dict(since)}
        return control.request(record.control, request)["flows"]

    def stats(self) -> dict[str, Any]:
        record = self._require_record()
        if record.control:
            return control.request(record.control, {"op": "stats"})["links"]
        return {name: {"spec": spec} for name, spec in record.links.items()}

    def _require_record(self) -> RunRecord:
        if self.record is None:
            raise TopologyError(f"run {self.name} is not up")
        return self.record

    # -- building -------------------------------------------------------------------------

    def _resolve_backend(self) -> str:
        if self.backend == "userspace":
            return "userspace"
        if self.clock:
            if self.backend == "kernel":
                raise TopologyError("the kernel backend cannot follow a clock: use userspace")
            self.backend_reason = "a clock needs the userspace shaper (sch_netem runs in wall time)"
            return "userspace"
        links = [self.wan] + ([self.intra] if self.intra is not None else [])
        if self.schedule is not None:
            if self.backend == "kernel":
                raise TopologyError(
                    "the kernel backend cannot follow a schedule: use --backend userspace"
                )
            self.backend_reason = "a schedule needs the userspace shaper"
            return "userspace"
        if any(spec.rate_bps == 0 for config in links for spec in (config.a2b, config.b2a)):
            if self.backend == "kernel":
                raise TopologyError("the kernel backend cannot stall a link (rate 0)")
            self.backend_reason = "a stalled link (rate 0) needs the userspace shaper"
            return "userspace"
        qdiscs = tuple(
            {spec.qdisc for config in links for spec in (config.a2b, config.b2a) if config.shaped}
        )
        available, why = kernel.probe(namespace_name(self.name, "probe"), qdiscs)
        if available:
            return "kernel"
        if self.backend == "kernel":
            raise TopologyError(f"kernel backend unavailable: {why}")
        self.backend_reason = why
        return "userspace"

    def _build(self) -> None:
        record = self._require_record()
        backend = self._resolve_backend()
        hosts = ("a", "a2", "b")
        record.backend = backend
        record.namespaces = [namespace_name(self.name, h) for h in hosts]
        intra_shaped = self.intra is not None and (
            self.intra.shaped or (self.schedule is not None and "intra" in self.schedule.links())
        )
        record.links = {"wan": self._link_record(self.wan, shaper=backend == "userspace")}
        if self.intra is not None:
            record.links["intra"] = self._link_record(
                self.intra, shaper=intra_shaped and backend == "userspace"
            )
        self.registry.save(record)  # before creating anything, so a crash can be cleaned up
        for ns in record.namespaces:
            netns.create(ns)
            self._prepare_namespace(ns, forward=ns == self.a.netns)
        addr = self.addresses
        host_link = f"{HOST_LINK_PREFIX}{record.slot}"
        with IPRoute() as ipr:
            ipr.link(
                "add",
                ifname=host_link,
                kind="veth",
                peer={"ifname": "host", "net_ns_fd": self.a.netns},
            )
        record.host_link = host_link  # only now: cleanup must never remove a link it did not make
        self.registry.save(record)

        shaped_links = []
        if backend == "userspace":
            shaped_links.append(self._tun_link("wan", self.a.netns, self.b.netns, self.wan))
        else:
            self._veth_link("wan", self.a.netns, self.b.netns)
        if intra_shaped and backend == "userspace":
            shaped_links.append(self._tun_link("intra", self.a.netns, self.a2.netns, self.intra))
        else:
            self._veth_link("intra", self.a.netns, self.a2.netns)
        self._tun_links = {link["name"] for link in shaped_links}
        if self.clock:
            self.clock_path = self.registry.run_dir(self.name) / "clock"
            SharedClock.create(self.clock_path).close()
        if shaped_links:
            self._start_shaper(shaped_links)
        if backend == "kernel":
            for ns, spec in ((self.a.netns, self.wan.a2b), (self.b.netns, self.wan.b2a)):
                kernel.apply_netem(ns, "wan", spec)
            if intra_shaped:
                for ns, spec in ((self.a.netns, self.intra.a2b), (self.a2.netns, self.intra.b2a)):
                    kernel.apply_netem(ns, "intra", spec)

        mtu = self.wan.a2b.mtu
        intra_mtu = self.intra.a2b.mtu if self.intra else LinkSpec().mtu
        self._configure(
            self.a.netns,
            addr.a,
            {
                "wan": (mtu, [(f"{addr.b}/32", None), (f"{addr.cross_b}/32", None)]),
                "intra": (intra_mtu, [(f"{addr.a2}/32", None)]),
                "host": (LinkSpec().mtu, [(f"{addr.host}/32", None)]),
            },
        )
        self._configure(
            self.a2.netns,
            addr.a2,
            {
                "intra": (
                    intra_mtu,
                    [(f"{addr.a}/32", None), (f"{addr.b}/32", addr.a), (f"{addr.host}/32", addr.a)],
                ),
            },
        )
        self._configure(self.b.netns, addr.b, {"wan": (mtu, [(addr.a_block, None)])})
        for ns, cross in ((self.a.netns, addr.cross_a), (self.b.netns, addr.cross_b)):
            with IPRoute(netns=ns, flags=0) as ipr:  # cross-traffic's endpoints (other tenants)
                lo = ipr.link_lookup(ifname="lo")[0]
                ipr.addr("add", index=lo, address=cross, prefixlen=32)
        if self.tcp is not None:
            self.retime_tcp(1.0)
        with IPRoute() as ipr:
            index = ipr.link_lookup(ifname=record.host_link)[0]
            ipr.link("set", index=index, state="up")
            ipr.addr("add", index=index, address=addr.host, prefixlen=32)
            ipr.route("add", dst=f"{addr.a}/32", oif=index, prefsrc=addr.host)
            for dst in (addr.a2, addr.b):
                ipr.route(
                    "add",
                    dst=f"{dst}/32",
                    gateway=addr.a,
                    oif=index,
                    prefsrc=addr.host,
                    flags=RTNH_F_ONLINK,
                )
        self.registry.save(record)

    @staticmethod
    def _link_record(config: LinkConfig, shaper: bool) -> dict[str, Any]:
        """What `netem set`/`link` need: both specs, and whether the shaper serves the link."""
        return {"a2b": config.a2b.to_dict(), "b2a": config.b2a.to_dict(), "shaper": shaper}

    def _prepare_namespace(self, ns: str, forward: bool) -> None:
        settings = {
            "net.ipv4.ip_forward": "1" if forward else "0",
            "net.ipv4.conf.all.rp_filter": "0",
            "net.ipv4.conf.default.rp_filter": "0",
            "net.ipv6.conf.all.disable_ipv6": "1",
            "net.ipv6.conf.default.disable_ipv6": "1",
            "net.ipv4.tcp_rmem": TCP_MEMORY,
            "net.ipv4.tcp_wmem": TCP_MEMORY,
            "net.ipv4.tcp_no_metrics_save": "1",
            **(self.tcp.sysctls() if self.tcp is not None else {}),
        }
        for key, value in settings.items():
            nsutil.write_sysctl(ns, key, value)
        with IPRoute(netns=ns, flags=0) as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")

    def _veth_link(self, ifname: str, ns_a: str, ns_b: str) -> None:
        with IPRoute(netns=ns_a, flags=0) as ipr:
            ipr.link("add", ifname=ifname, kind="veth", peer={"ifname": ifname, "net_ns_fd": ns_b})

    def _tun_link(self, name: str, ns_a: str, ns_b: str, config: LinkConfig) -> dict[str, Any]:
        return {
            "name": name,
            "a": {"netns": str(nsutil.netns_path(ns_a)), "ifname": name},
            "b": {"netns": str(nsutil.netns_path(ns_b)), "ifname": name},
            "a2b": config.a2b.to_dict(),
            "b2a": config.b2a.to_dict(),
            "seed": self.seed,
        }

    def _start_shaper(self, links: list[dict[str, Any]]) -> None:
        record = self._require_record()
        record.control = str(self.registry.run_dir(self.name) / "shaper.sock")
        config = {
            "links": links,
            "control": record.control,
            "tun_device": self.tun_device,
            "schedule": self.schedule.to_dict()
            if self.schedule is not None and self.schedule_from_up
            else None,
            "clock": str(self.clock_path) if self.clock_path else None,
            "die_with_parent": threading.current_thread() is threading.main_thread(),
            "realtime": self.realtime_shaper,
            "record_interval_s": self.record_interval_s,
            "flow_window_s": self.flow_window_s,
        }
        self.shaper = subprocess.Popen(
            [sys.executable, "-m", "netem.shaper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        record.shaper_pid = self.shaper.pid
        record.shaper_start = process_start(self.shaper.pid)
        self.registry.save(record)
        assert self.shaper.stdin and self.shaper.stdout
        self.shaper.stdin.write(json.dumps(config) + "\n")
        self.shaper.stdin.close()
        line = _readline_with_timeout(self.shaper, SHAPER_START_TIMEOUT_S)
        try:
            answer = json.loads(line) if line else {"error": "the shaper exited without a word"}
        except ValueError:
            answer = {"error": f"the shaper said {line!r}"}
        if not answer.get("ready"):
            raise TopologyError(f"userspace shaper did not start: {answer.get('error')}")

    def _configure(
        self, ns: str, address: str, links: dict[str, tuple[int, list[tuple[str, str | None]]]]
    ) -> None:
        """Address on loopback, links up, and routes `dst via gateway` (None: on-link)."""
        with IPRoute(netns=ns, flags=0) as ipr:
            ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=address, prefixlen=32)
            for ifname, (mtu, routes) in links.items():
                found = ipr.link_lookup(ifname=ifname)
                if not found:
                    raise TopologyError(f"interface {ifname} missing in {ns}")
                index = found[0]
                queue = {"txqlen": TUN_TX_QUEUE} if ifname in self._tun_links else {}
                ipr.link("set", index=index, state="up", mtu=mtu, **queue)
                for dst, gateway in routes:
                    if gateway is None:
                        ipr.route("add", dst=dst, oif=index, prefsrc=address)
                    else:
                        ipr.route(
                            "add",
                            dst=dst,
                            gateway=gateway,
                            oif=index,
                            prefsrc=address,
                            flags=RTNH_F_ONLINK,
                        )

    # -- guardian -------------------------------------------------------------------------

    def _start_guardian(self) -> None:
        """A detached process that cleans the run up if this process dies without doing so."""
        read_end, write_end = os.pipe()
        owner = [str(os.getpid()), str(process_start(os.getpid()))]
        self._guardian = subprocess.Popen(
            [sys.executable, "-m", "netem.guardian", self.name, str(self.registry.root), *owner],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        os.close(read_end)
        self._guardian_pipe = write_end

    def _release_guardian(self) -> None:
        if self._guardian_pipe is not None:
            os.write(self._guardian_pipe, b"done\n")
            os.close(self._guardian_pipe)
            self._guardian_pipe = None
        if self._guardian is not None:
            try:
                self._guardian.wait(5)
            except subprocess.TimeoutExpired:
                self._guardian.kill()
            self._guardian = None


def _dst(route: Any) -> str:
    return f"{route.get_attr('RTA_DST')}/{route['dst_len']}"


def _readline_with_timeout(process: subprocess.Popen, timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.2)
        if ready:
            return process.stdout.readline()
        if process.poll() is not None:
            return ""
    raise TopologyError(f"userspace shaper gave no answer within {timeout:.0f} s")


def _run_record(registry: Registry, name: str) -> RunRecord:
    record = registry.load(name)
    if record is None:
        raise RunError(f"no run named {name!r} (see `netem ls`)")
    return record


def _directions(direction: str) -> list[str]:
    if direction == "both":
        return ["a2b", "b2a"]
    if direction not in ("a2b", "b2a"):
        raise TopologyError(f"direction must be a2b, b2a or both, not {direction!r}")
    return [direction]


def _link_entry(record: RunRecord, link: str) -> dict[str, Any]:
    if link not in record.links:
        raise TopologyError(
            f"run {record.name} has no link {link!r}; it has {', '.join(record.links)}"
        )
    return record.links[link]


def _kernel_spec(entry: dict[str, Any], direction: str) -> LinkSpec:
    """The netem qdisc for a direction: its spec, losing everything while the link is down."""
    spec = LinkSpec.from_dict(entry[direction])
    if direction in entry.get("down", []):
        spec = spec.with_changes(loss=LossModel("bernoulli", 1.0))
    return spec


def apply_change(
    registry: Registry, name: str, link: str, direction: str, changes: dict[str, Any]
) -> dict[str, LinkSpec]:
    """Live change of a run's link, from any process (the CLI's `netem set` uses it too)."""
    with registry.locked(name):
        record = _run_record(registry, name)
        entry = _link_entry(record, link)
        changes = changes_from_dict(changes)
        old = {d: _kernel_spec(entry, d) for d in _directions(direction)}
        new = {
            d: LinkSpec.from_dict(entry[d]).with_changes(**changes) for d in _directions(direction)
        }
        for d, spec in new.items():
            entry[d] = spec.to_dict()
        if _is_shaped(record, link):
            control.request(
                record.control,
                {
                    "op": "set",
                    "link": link,
                    "direction": direction,
                    "changes": changes_to_dict(changes),
                },
            )
        elif record.backend == "kernel":
            for d in new:
                kernel.apply_netem(
                    _sender_namespace(record, link, d),
                    link,
                    _kernel_spec(entry, d),
                    replace=True,
                    previous=old[d],
                )
        else:
            raise TopologyError(
                f"link {link!r} of run {name} is an unshaped veth; give it a spec at `up`"
            )
        registry.save(record)
        return new


def apply_state(registry: Registry, name: str, link: str, direction: str, up: bool) -> None:
    """Take a link's direction(s) down (everything sent is lost) or bring them back up.

    Userspace: the shaper's gate drops arrivals and everything queued. Kernel: netem drops every
    new packet (routes stay, as with a cut fibre) until `up`, and keeps doing so across `set`;
    packets already inside netem's queue still leave.
    """
    with registry.locked(name):
        record = _run_record(registry, name)
        entry = _link_entry(record, link)
        if _is_shaped(record, link):
            control.request(
                record.control, {"op": "updown", "link": link, "direction": direction, "up": up}
            )
        elif record.backend == "kernel":
            down = set(entry.get("down", []))
            down = down - set(_directions(direction)) if up else down | set(_directions(direction))
            entry["down"] = sorted(down)
            for d in _directions(direction):
                kernel.apply_netem(
                    _sender_namespace(record, link, d), link, _kernel_spec(entry, d), replace=True
                )
        else:
            raise TopologyError(
                f"link {link!r} of run {name} is an unshaped veth and cannot be switched"
            )
        registry.save(record)


def _is_shaped(record: RunRecord, link: str) -> bool:
    """Whether the userspace shaper serves this link (decided when the run was built)."""
    return bool(record.links[link].get("shaper"))


def _sender_namespace(record: RunRecord, link: str, direction: str) -> str:
    far = "b" if link == "wan" else "a2"
    host = "a" if direction == "a2b" else far
    return namespace_name(record.name, host)
