"""The kernel backend: sch_netem on a veth pair, configured over netlink with pyroute2.

pyroute2's own netem encoder lacks delay distribution tables, the Gilbert-Elliott loss model
and 64-bit delays and rates, so this module declares the full TCA_OPTIONS layout of netem
(struct tc_netem_qopt followed by attributes, as include/uapi/linux/pkt_sched.h has it) and
sends the message through pyroute2's socket; likewise for tbf, fq, fq_codel, prio and the u32
filters prio needs. The mapping from a LinkSpec to messages is a pure function, unit-tested;
the kernel call is integration-tested on hosts that have the qdiscs.

With the `fifo` discipline the tree is netem alone, rated by netem's own rate attribute: netem
then schedules each packet after the previous one, which is what keeps jittered packets in
order (a tbf or htb beside netem cannot undo netem's reordering). With another discipline the
rate moves to a tbf under netem and the discipline under the tbf, where the queue builds:

    1: netem (delay, jitter, loss; a fast rate only to keep jittered packets in order)
    └─ 2: tbf (the link's rate)
       └─ 3: fq | fq_codel | prio (bands 3:1-3:3 by u32 filters on the DSCP precedence;
             └─ 4: fq | fq_codel under band 3:3 for prio:fq, prio:fq_codel)

The queue is after the propagation delay here and before it in the userspace shaper; the
round trip and the queueing are the same.
"""

from __future__ import annotations

import errno
import gzip
import math
import os
import struct

from pyroute2 import IPRoute, netns
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELQDISC, RTM_NEWQDISC, RTM_NEWTFILTER, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import time2tick

from netem.distributions import NETEM_DIST_SCALE, unit_table
from netem.qdisc import BANDS
from netem.qdisc.codel import DEFAULT_INTERVAL_S, DEFAULT_TARGET_S
from netem.spec import LinkSpec

U32_MAX = 2**32 - 1
DIST_TABLE_SIZE = 4096
FIFO_RATE_BPS = 100e9  # rate given to netem to keep FIFO order when the link itself is unlimited


class NetemOptions(nla):
    """TCA_OPTIONS of sch_netem: struct tc_netem_qopt, then TCA_NETEM_* attributes."""

    fields = (
        ("latency", "I"),
        ("limit", "I"),
        ("loss", "I"),
        ("gap", "I"),
        ("duplicate", "I"),
        ("jitter", "I"),
    )
    nla_map = (
        ("TCA_NETEM_UNSPEC", "none"),
        ("TCA_NETEM_CORR", "hex"),
        ("TCA_NETEM_DELAY_DIST", "cdata"),
        ("TCA_NETEM_REORDER", "hex"),
        ("TCA_NETEM_CORRUPT", "hex"),
        ("TCA_NETEM_LOSS", "netem_loss"),
        ("TCA_NETEM_RATE", "netem_rate"),
        ("TCA_NETEM_ECN", "uint32"),
        ("TCA_NETEM_RATE64", "uint64"),
        ("TCA_NETEM_PAD", "hex"),
        ("TCA_NETEM_LATENCY64", "int64"),
        ("TCA_NETEM_JITTER64", "int64"),
    )

    class netem_loss(nla):
        nla_map = (
            ("NETEM_LOSS_UNSPEC", "none"),
            ("NETEM_LOSS_GI", "hex"),
            ("NETEM_LOSS_GE", "netem_ge"),
        )

        class netem_ge(nla):
            fields = (("p", "I"), ("r", "I"), ("h", "I"), ("k1", "I"))

    class netem_rate(nla):
        fields = (
            ("rate", "I"),
            ("packet_overhead", "i"),
            ("cell_size", "I"),
            ("cell_overhead", "i"),
        )


class TbfOptions(nla):
    """TCA_OPTIONS of sch_tbf: struct tc_tbf_qopt (two tc_ratespec, limit, buffer, mtu)."""

    nla_map = (
        ("TCA_TBF_UNSPEC", "none"),
        ("TCA_TBF_PARMS", "tbf_parms"),
        ("TCA_TBF_RTAB", "hex"),
        ("TCA_TBF_PTAB", "hex"),
        ("TCA_TBF_RATE64", "uint64"),
        ("TCA_TBF_PRATE64", "uint64"),
        ("TCA_TBF_BURST", "uint32"),
    )

    class tbf_parms(nla):
        fields = (
            ("rate_cell_log", "B"),
            ("rate_linklayer", "B"),
            ("rate_overhead", "H"),
            ("rate_cell_align", "h"),
            ("rate_mpu", "H"),
            ("rate", "I"),
            ("peak_cell_log", "B"),
            ("peak_linklayer", "B"),
            ("peak_overhead", "H"),
            ("peak_cell_align", "h"),
            ("peak_mpu", "H"),
            ("peak", "I"),
            ("limit", "I"),
            ("buffer", "I"),
            ("mtu", "I"),
        )


class FqCodelOptions(nla):
    nla_map = (
        ("TCA_FQ_CODEL_UNSPEC", "none"),
        ("TCA_FQ_CODEL_TARGET", "uint32"),
        ("TCA_FQ_CODEL_LIMIT", "uint32"),
        ("TCA_FQ_CODEL_INTERVAL", "uint32"),
        ("TCA_FQ_CODEL_ECN", "uint32"),
        ("TCA_FQ_CODEL_FLOWS", "uint32"),
        ("TCA_FQ_CODEL_QUANTUM", "uint32"),
    )


class FqOptions(nla):
    nla_map = (
        ("TCA_FQ_UNSPEC", "none"),
        ("TCA_FQ_PLIMIT", "uint32"),
        ("TCA_FQ_FLOW_PLIMIT", "uint32"),
        ("TCA_FQ_QUANTUM", "uint32"),
    )


class PrioOptions(nla):
    """TCA_OPTIONS of sch_prio: struct tc_prio_qopt itself (no attributes)."""

    fields = (("bands", "i"), ("priomap", "16B"))


class U32Options(nla):
    """TCA_OPTIONS of the u32 classifier: the class to send to and one selector."""

    nla_map = (
        ("TCA_U32_UNSPEC", "none"),
        ("TCA_U32_CLASSID", "uint32"),
        ("TCA_U32_HASH", "uint32"),
        ("TCA_U32_LINK", "uint32"),
        ("TCA_U32_DIVISOR", "uint32"),
        ("TCA_U32_SEL", "cdata"),
    )


OPTIONS_BY_KIND = {
    "netem": NetemOptions,
    "tbf": TbfOptions,
    "fq_codel": FqCodelOptions,
    "fq": FqOptions,
    "prio": PrioOptions,
    "u32": U32Options,
}


class QdiscMessage(tcmsg):
    """A tcmsg whose TCA_OPTIONS is encoded by its TCA_KIND with this module's layouts."""

    @staticmethod
    def get_options(self, *argv, **kwarg):  # noqa: ARG004 - pyroute2 dispatch signature
        return OPTIONS_BY_KIND[self.get_attr("TCA_KIND")]


NetemQdiscMessage = QdiscMessage  # the netem-only name the tests and probes used first


def _u32(probability: float) -> int:
    return min(U32_MAX, int(round(probability * U32_MAX)))


def distribution_table(dist: str) -> bytes | None:
    """netem's delay table for a distribution of unit standard deviation, or None for uniform
    (netem's built-in, which has a half-range of sigma: callers scale sigma by sqrt(3))."""
    if dist == "uniform":
        return None
    ints = [int(round(v * NETEM_DIST_SCALE)) for v in unit_table(dist)]
    return struct.pack(f"={len(ints)}h", *ints)


def netem_options(spec: LinkSpec, with_rate: bool = True) -> dict:
    """The netem TCA_OPTIONS for one direction of a link (pure; unit-tested). Without
    `with_rate` the link's rate is left to a tbf below (see the module's docstring)."""
    sigma_s = spec.jitter_s * (math.sqrt(3.0) if spec.jitter_dist == "uniform" else 1.0)
    options: dict = {
        "latency": time2tick(int(spec.delay_s * 1e6)),
        "jitter": time2tick(int(sigma_s * 1e6)),
        "limit": max(1, math.ceil(spec.queue_limit_bytes / spec.mtu)),
        "loss": _u32(spec.loss.p) if spec.loss.kind == "bernoulli" else 0,
        "gap": 0,
        "duplicate": 0,
        "attrs": [
            ("TCA_NETEM_LATENCY64", int(round(spec.delay_s * 1e9))),
            ("TCA_NETEM_JITTER64", int(round(sigma_s * 1e9))),
        ],
    }
    table = distribution_table(spec.jitter_dist) if spec.jitter_s > 0 else None
    if table is not None:
        options["attrs"].append(("TCA_NETEM_DELAY_DIST", table))
    if spec.loss.kind == "gilbert-elliott":
        ge = {
            "p": _u32(spec.loss.p),
            "r": _u32(spec.loss.r),
            "h": _u32(1 - spec.loss.loss_bad),
            "k1": _u32(spec.loss.loss_good),
        }
        options["attrs"].append(("TCA_NETEM_LOSS", {"attrs": [("NETEM_LOSS_GE", ge)]}))
    if spec.rate_bps == 0:
        raise ValueError("the kernel backend cannot stall a link (rate 0): use the userspace one")
    rate_bps = spec.rate_bps if with_rate else None
    if rate_bps is None and spec.jitter_s > 0 and not spec.reorder:
        rate_bps = FIFO_RATE_BPS
    if rate_bps is not None:
        bytes_per_s = int(rate_bps / 8)
        rate = {
            "rate": min(bytes_per_s, U32_MAX),
            "packet_overhead": 0,
            "cell_size": 0,
            "cell_overhead": 0,
        }
        options["attrs"].append(("TCA_NETEM_RATE", rate))
        if bytes_per_s >= U32_MAX:
            options["attrs"].append(("TCA_NETEM_RATE64", bytes_per_s))
    return options


NETEM_HANDLE = 0x10000
TBF_HANDLE = 0x20000
QDISC_HANDLE = 0x30000
REST_HANDLE = 0x40000
ETH_P_IP = 0x0800
TC_U32_TERMINAL = 1
TC_LINKLAYER_ETHERNET = 1
TBF_BURST_S = 0.001  # tokens for 1 ms at the rate (at least two packets): a tight shaper


def _message(ifindex: int, handle: int, parent: int, kind: str, options: dict) -> QdiscMessage:
    msg = QdiscMessage()
    msg["family"] = 0
    msg["index"] = ifindex
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [("TCA_KIND", kind), ("TCA_OPTIONS", options)]
    return msg


def qdisc_message(ifindex: int, spec: LinkSpec) -> QdiscMessage:
    """The root netem of a link (rated by netem itself for fifo, by a tbf below otherwise)."""
    return _message(
        ifindex, NETEM_HANDLE, TC_H_ROOT, "netem", netem_options(spec, spec.qdisc == "fifo")
    )


def tbf_options(spec: LinkSpec) -> dict:
    assert spec.rate_bps
    bytes_per_s = int(spec.rate_bps / 8)
    burst = max(2 * spec.mtu, int(bytes_per_s * TBF_BURST_S))
    rate = {f"rate_{k}": v for k, v in (("cell_log", 0), ("overhead", 0), ("cell_align", 0))}
    peak = {f"peak_{k}": 0 for k in ("cell_log", "linklayer", "overhead", "cell_align", "mpu")}
    parms = {
        **rate,
        "rate_linklayer": TC_LINKLAYER_ETHERNET,
        "rate_mpu": 0,
        "rate": min(bytes_per_s, U32_MAX),
        **peak,
        "peak": 0,
        "limit": spec.queue_limit_bytes,
        "buffer": time2tick(int(1e6 * burst / bytes_per_s)),
        "mtu": 0,
    }
    attrs: list = [("TCA_TBF_PARMS", parms), ("TCA_TBF_BURST", burst)]
    if bytes_per_s >= U32_MAX:
        attrs.append(("TCA_TBF_RATE64", bytes_per_s))
    return {"attrs": attrs}


def _limit_packets(spec: LinkSpec) -> int:
    return max(1, math.ceil(spec.queue_limit_bytes / spec.mtu))


def discipline_options(kind: str, spec: LinkSpec) -> dict:
    """TCA_OPTIONS of fq, fq_codel or prio, with the userspace shaper's parameters: the same
    queue limit (in packets of the MTU), CoDel's 5 ms target and 100 ms interval with ECN, no
    per-flow limit below the total for fq, and prio's three bands with unmatched traffic in
    the lowest."""
    if kind == "fq_codel":
        return {
            "attrs": [
                ("TCA_FQ_CODEL_TARGET", int(DEFAULT_TARGET_S * 1e6)),
                ("TCA_FQ_CODEL_LIMIT", _limit_packets(spec)),
                ("TCA_FQ_CODEL_INTERVAL", int(DEFAULT_INTERVAL_S * 1e6)),
                ("TCA_FQ_CODEL_ECN", 1),
            ]
        }
    if kind == "fq":
        return {
            "attrs": [
                ("TCA_FQ_PLIMIT", _limit_packets(spec)),
                ("TCA_FQ_FLOW_PLIMIT", _limit_packets(spec)),
                ("TCA_FQ_QUANTUM", spec.mtu),
            ]
        }
    if kind == "prio":
        return {"bands": BANDS, "priomap": [BANDS - 1] * 16}
    raise ValueError(f"no kernel discipline {kind!r}")


# prio's bands by the DSCP precedence, as netem.qdisc.prio: the TOS byte is the second of the
# first 32-bit word of the IP header. (mask, value) per band; the last band takes the rest.
BAND_MATCHES = ((0x00800000, 0x00800000), (0x00C00000, 0x00400000))


def u32_selector(mask: int, value: int) -> bytes:
    """struct tc_u32_sel with one key matching (word at offset 0 & mask) == value."""
    header = struct.pack("=BBBxHHhhI", TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0)
    key = struct.pack(">II", mask, value) + struct.pack("=ii", 0, 0)
    return header + key


def band_filter_message(ifindex: int, band: int) -> QdiscMessage:
    """A u32 filter on prio's qdisc sending one DSCP precedence range to band `band`."""
    mask, value = BAND_MATCHES[band]
    msg = QdiscMessage()
    msg["family"] = 0
    msg["index"] = ifindex
    msg["handle"] = 0
    msg["parent"] = QDISC_HANDLE
    msg["info"] = ((band + 1) << 16) | socket_htons(ETH_P_IP)
    msg["attrs"] = [
        ("TCA_KIND", "u32"),
        (
            "TCA_OPTIONS",
            {
                "attrs": [
                    ("TCA_U32_CLASSID", QDISC_HANDLE | (band + 1)),
                    ("TCA_U32_SEL", u32_selector(mask, value)),
                ]
            },
        ),
    ]
    return msg


def socket_htons(value: int) -> int:
    return int.from_bytes(value.to_bytes(2, "big"), "little")


def link_messages(ifindex: int, spec: LinkSpec) -> list[tuple[int, QdiscMessage]]:
    """The netlink messages (type, message) that build a direction's qdisc tree, in order."""
    messages = [(RTM_NEWQDISC, qdisc_message(ifindex, spec))]
    if spec.qdisc == "fifo" or spec.rate_bps is None:
        return messages
    kind, _, rest = spec.qdisc.partition(":")
    messages.append(
        (RTM_NEWQDISC, _message(ifindex, TBF_HANDLE, NETEM_HANDLE | 1, "tbf", tbf_options(spec)))
    )
    messages.append(
        (
            RTM_NEWQDISC,
            _message(ifindex, QDISC_HANDLE, TBF_HANDLE | 1, kind, discipline_options(kind, spec)),
        )
    )
    if kind == "prio":
        messages += [(RTM_NEWTFILTER, band_filter_message(ifindex, band)) for band in (0, 1)]
        if rest and rest != "fifo":
            options = discipline_options(rest, spec)
            messages.append(
                (
                    RTM_NEWQDISC,
                    _message(ifindex, REST_HANDLE, QDISC_HANDLE | BANDS, rest, options),
                )
            )
    return messages


def _tree(spec: LinkSpec) -> str:
    """What decides the shape of a direction's tree (a live change keeps it or rebuilds)."""
    return "fifo" if spec.qdisc == "fifo" or spec.rate_bps is None else spec.qdisc


def apply_netem(
    namespace: str,
    ifname: str,
    spec: LinkSpec,
    replace: bool = False,
    previous: LinkSpec | None = None,
) -> None:
    """Install a direction's qdiscs on `ifname`; with `replace`, change them live: in place
    when the tree keeps its shape (queued packets stay), rebuilt otherwise (they are lost)."""
    with IPRoute(netns=namespace, flags=0) as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            raise OSError(errno.ENODEV, f"no interface {ifname} in {namespace}")
        # pyroute2 0.9 leaves this key unset on IPRoute, which breaks its sync nlm_request.
        ipr.status.setdefault("nlm_generator", False)
        in_place = replace and (previous is None or _tree(previous) == _tree(spec))
        if replace and not in_place:
            delete = _message(index[0], NETEM_HANDLE, TC_H_ROOT, "netem", {})
            delete["attrs"] = []
            ipr.nlm_request(delete, msg_type=RTM_DELQDISC, msg_flags=NLM_F_REQUEST | NLM_F_ACK)
        create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
        for msg_type, message in link_messages(index[0], spec):
            if msg_type == RTM_NEWTFILTER:
                if in_place:
                    continue  # the filters never change
                flags = create | NLM_F_EXCL
            else:
                flags = create | (NLM_F_REPLACE if in_place else NLM_F_EXCL)
            ipr.nlm_request(message, msg_type=msg_type, msg_flags=flags)


KERNEL_CONFIG = "/proc/config.gz"
CONFIG_OPTION = {"netem": "NET_SCH_NETEM", "tbf": "NET_SCH_TBF", "fq": "NET_SCH_FQ"}
CONFIG_OPTION |= {"fq_codel": "NET_SCH_FQ_CODEL", "prio": "NET_SCH_PRIO"}


def built_without(kind: str, config: str = KERNEL_CONFIG) -> str:
    """Why the kernel lacks sch_`kind`, from its build configuration where readable (with no
    modules directory a qdisc left out of the build cannot be loaded), else ""."""
    option = f"CONFIG_{CONFIG_OPTION.get(kind, kind.upper())}"
    try:
        with gzip.open(config, "rt") as lines:
            for line in lines:
                if line.startswith(f"# {option} is not set"):
                    return f"{option} is not set in {config}"
    except OSError:
        pass
    return ""


def probe(scratch_namespace: str | None = None, qdiscs: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Try to build netem (and the trees of `qdiscs`) on a veth in a scratch namespace:
    (True, "") or (False, why).

    Listing qdiscs proves nothing (modules load on first use), so this asks the kernel to
    create them, the only test that cannot be fooled.
    """
    scratch = scratch_namespace or f"netem-probe{os.getpid()}-x"
    netns.create(scratch)
    kind = "netem"
    try:
        with IPRoute(netns=scratch, flags=0) as ipr:
            ipr.link("add", ifname="probe0", kind="veth", peer={"ifname": "probe1"})
        apply_netem(scratch, "probe0", LinkSpec(delay_s=0.001))
        for qdisc in qdiscs:
            if qdisc != "fifo":
                kind = qdisc
                spec = LinkSpec(rate_bps=1e9, delay_s=0.001, qdisc=qdisc)
                apply_netem(scratch, "probe0", spec, replace=True, previous=LinkSpec())
        return True, ""
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            what = "sch_netem" if kind == "netem" else f"one of the qdiscs of {kind} (tbf, {kind})"
            kinds = ("netem",) if kind == "netem" else ("tbf", *kind.split(":"))
            built = "; ".join(filter(None, map(built_without, kinds)))
            why = f"netlink: 'Specified qdisc kind is unknown'{'; ' + built if built else ''}"
            return False, f"the kernel has no {what} ({why})"
        return False, f"{kind} could not be added: {exc}"
    finally:
        netns.remove(scratch)
