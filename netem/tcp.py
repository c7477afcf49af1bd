"""TCP on an emulated path: the parameters of the routes over a link, and TCP_INFO counters.

An emulated link may run faster than the path it stands for (a time scale) or on a dilating
clock, but the kernel's TCP timers run in wall time: the 200 ms floor of the retransmission
timeout, the 40 ms delayed ACK, an idle connection's return to slow start. Route metrics
(set with pyroute2 on the routes over the link) put the first into the path's time and switch
the others off, and open the initial windows to the path's size, so that TCP's own clocks do
not distort what crosses the link:

- `rto_min_s` (RTAX_RTO_MIN, locked): the retransmission timeout's floor, in the path's time;
  the route gets it divided by the clock's rate (`metrics(rate)`), re-applied when the rate
  moves (`Network.retime_tcp`);
- `quickack` (RTAX_QUICKACK): ACK every segment at once (no delayed-ACK timer in wall time);
- `initcwnd`, `initrwnd` (RTAX_INITCWND, RTAX_INITRWND): initial windows, in segments;
- `congestion` (RTAX_CC_ALGO): the congestion control of connections over the link (the
  host's default otherwise, whatever it is);
- `slow_start_after_idle` (the namespaces' sysctl): whether an idle connection's window
  shrinks back, after an idle period measured in wall time.

What each changes was measured (docs/netem.md, `python -m pddemu.bench --only wan_tcp`).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

RTAX_RTO_MIN = 13  # its bit in RTAX_LOCK: a locked metric overrides the socket's own floor

# struct tcp_info (linux/tcp.h) up to tcpi_total_rto_time (Linux 6.7), field by field; older
# kernels return a prefix, and the fields they lack read as None.
_FIELDS = (
    *((f"_flags{i}", "B") for i in range(8)),
    *((name, "I") for name in (
        "rto", "ato", "snd_mss", "rcv_mss", "unacked", "sacked", "lost", "retrans", "fackets",
        "last_data_sent", "last_ack_sent", "last_data_recv", "last_ack_recv", "pmtu",
        "rcv_ssthresh", "rtt_us", "rttvar_us", "snd_ssthresh", "snd_cwnd", "advmss",
        "reordering", "rcv_rtt", "rcv_space", "total_retrans",
    )),
    *((name, "Q") for name in ("pacing_rate", "max_pacing_rate", "bytes_acked", "bytes_received")),
    *((name, "I") for name in (
        "segs_out", "segs_in", "notsent_bytes", "min_rtt_us", "data_segs_in", "data_segs_out",
    )),
    *((name, "Q") for name in ("delivery_rate", "busy_time", "rwnd_limited", "sndbuf_limited")),
    ("delivered", "I"),
    ("delivered_ce", "I"),
    ("bytes_sent", "Q"),
    ("bytes_retrans", "Q"),
    *((name, "I") for name in ("dsack_dups", "reord_seen", "rcv_ooopack", "snd_wnd", "rcv_wnd")),
    ("rehash", "I"),
    ("total_rto", "H"),
    ("total_rto_recoveries", "H"),
    ("total_rto_time", "I"),
)  # fmt: skip
_TCP_INFO = struct.Struct("=" + "".join(code for _, code in _FIELDS))
_ENDS = [
    struct.calcsize("=" + "".join(code for _, code in _FIELDS[: i + 1]))
    for i in range(len(_FIELDS))
]


@dataclass(frozen=True)
class TcpTuning:
    """TCP parameters for the routes over an emulated link (None or False: the kernel's)."""

    rto_min_s: float | None = None
    quickack: bool = False
    initcwnd: int | None = None
    initrwnd: int | None = None
    congestion: str | None = None
    slow_start_after_idle: bool = True

    def metrics(self, rate: float = 1.0) -> dict[str, Any]:
        """Route metrics (pyroute2 names) for a clock running `rate` times the path's time."""
        metrics: dict[str, Any] = {}
        lock = 0
        if self.rto_min_s is not None:
            metrics["rto_min"] = max(1, round(self.rto_min_s / rate * 1000))  # ms
            lock |= 1 << RTAX_RTO_MIN
        if lock:
            metrics["lock"] = lock
        if self.quickack:
            metrics["quickack"] = 1
        if self.initcwnd is not None:
            metrics["initcwnd"] = self.initcwnd
        if self.initrwnd is not None:
            metrics["initrwnd"] = self.initrwnd
        if self.congestion is not None:
            metrics["cc_algo"] = self.congestion
        return metrics

    def sysctls(self) -> dict[str, str]:
        """What the namespaces at the link's ends set."""
        return {"net.ipv4.tcp_slow_start_after_idle": "1" if self.slow_start_after_idle else "0"}


def route_metrics(route: Any) -> dict[str, Any]:
    """A route's metrics as pyroute2 names them ({'rto_min': 25, 'lock': 8192, ...})."""
    attrs = route.get_attr("RTA_METRICS")
    if not attrs:
        return {}
    return {name[len("RTAX_") :].lower(): value for name, value in attrs["attrs"]}


def tcp_info(sock: socket.socket) -> dict[str, Any]:
    """A connection's TCP_INFO counters by name (times in microseconds, rates in bytes/s)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    values = _TCP_INFO.unpack(raw + bytes(_TCP_INFO.size - len(raw)))
    return {
        name: value if end <= len(raw) else None
        for (name, _), value, end in zip(_FIELDS, values, _ENDS, strict=True)
        if not name.startswith("_")
    }


_OUT_OF_ORDER_END = _ENDS[[name for name, _ in _FIELDS].index("rcv_ooopack")]
OUT_OF_ORDER_OFFSET = _OUT_OF_ORDER_END - 4  # tcpi_rcv_ooopack, a u32, in struct tcp_info


def out_of_order_packets(sock: socket.socket) -> int | None:
    """Packets the connection has received out of order (tcpi_rcv_ooopack: behind a lost one,
    kept unreadable until it came again); None where the kernel does not count them."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _OUT_OF_ORDER_END)
    except OSError:  # not a TCP socket
        return None
    if len(raw) < _OUT_OF_ORDER_END:
        return None
    return struct.unpack_from("=I", raw, OUT_OF_ORDER_OFFSET)[0]


def transfer_counters(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What one transfer on a (possibly reused) connection cost: retransmitted segments and
    retransmission timeouts between two readings, the connection's minimum RTT (us) and its
    last delivery-rate sample (bytes/s), all in the wall time TCP measures."""

    def delta(name: str) -> int | None:
        if after.get(name) is None or before.get(name) is None:
            return None
        return int(after[name]) - int(before[name])

    return {
        "retransmits": delta("total_retrans"),
        "rto_events": delta("total_rto"),
        "min_rtt_us": after.get("min_rtt_us"),
        "delivery_rate_Bps": after.get("delivery_rate"),
        "bytes_sent": delta("bytes_sent"),
    }
