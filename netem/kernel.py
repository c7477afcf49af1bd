"""The kernel backend: sch_netem on a veth pair, configured over netlink with pyroute2.

pyroute2's own netem encoder lacks delay distribution tables, the Gilbert-Elliott loss model
and 64-bit delays and rates, so this module declares the full TCA_OPTIONS layout of netem
(struct tc_netem_qopt followed by attributes, as include/uapi/linux/pkt_sched.h has it) and
sends the message through pyroute2's socket. The mapping from a LinkSpec is a pure function,
unit-tested; the kernel call is integration-tested on hosts that have sch_netem.

Rate uses netem's own rate attribute rather than a tbf/htb parent: with it, netem schedules
each packet after the previous one, which is what keeps jittered packets in order (a tbf or
htb beside netem cannot undo netem's reordering).
"""

from __future__ import annotations

import errno
import math
import os
import struct

from pyroute2 import IPRoute, netns
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, nla
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWQDISC, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg import tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import time2tick

from netem.distributions import NETEM_DIST_SCALE, unit_table
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


class NetemQdiscMessage(tcmsg):
    """A tcmsg whose TCA_OPTIONS is always encoded as netem's."""

    @staticmethod
    def get_options(self, *argv, **kwarg):  # noqa: ARG004 - pyroute2 dispatch signature
        return NetemOptions


def _u32(probability: float) -> int:
    return min(U32_MAX, int(round(probability * U32_MAX)))


def distribution_table(dist: str) -> bytes | None:
    """netem's delay table for a distribution of unit standard deviation, or None for uniform
    (netem's built-in, which has a half-range of sigma: callers scale sigma by sqrt(3))."""
    if dist == "uniform":
        return None
    ints = [int(round(v * NETEM_DIST_SCALE)) for v in unit_table(dist)]
    return struct.pack(f"={len(ints)}h", *ints)


def netem_options(spec: LinkSpec) -> dict:
    """The netem TCA_OPTIONS for one direction of a link (pure; unit-tested)."""
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
    rate_bps = spec.rate_bps
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


def qdisc_message(ifindex: int, spec: LinkSpec) -> NetemQdiscMessage:
    msg = NetemQdiscMessage()
    msg["family"] = 0
    msg["index"] = ifindex
    msg["handle"] = 0x10000
    msg["parent"] = TC_H_ROOT
    msg["attrs"] = [("TCA_KIND", "netem"), ("TCA_OPTIONS", netem_options(spec))]
    return msg


def apply_netem(namespace: str, ifname: str, spec: LinkSpec, replace: bool = False) -> None:
    """Install (or replace, for a live change) netem as the root qdisc of `ifname`."""
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
    with IPRoute(netns=namespace, flags=0) as ipr:
        index = ipr.link_lookup(ifname=ifname)
        if not index:
            raise OSError(errno.ENODEV, f"no interface {ifname} in {namespace}")
        # pyroute2 0.9 leaves this key unset on IPRoute, which breaks its sync nlm_request.
        ipr.status.setdefault("nlm_generator", False)
        ipr.nlm_request(qdisc_message(index[0], spec), msg_type=RTM_NEWQDISC, msg_flags=flags)


def probe(scratch_namespace: str | None = None) -> tuple[bool, str]:
    """Try to add netem to a veth in a scratch namespace: (True, "") or (False, why).

    Listing qdiscs proves nothing (the module loads on first use), so this asks the kernel
    to create one, the only test that cannot be fooled.
    """
    scratch = scratch_namespace or f"netem-probe{os.getpid()}-x"
    netns.create(scratch)
    try:
        with IPRoute(netns=scratch, flags=0) as ipr:
            ipr.link("add", ifname="probe0", kind="veth", peer={"ifname": "probe1"})
        apply_netem(scratch, "probe0", LinkSpec(delay_s=0.001))
        return True, ""
    except NetlinkError as exc:
        if exc.code == errno.ENOENT:
            return False, "the kernel has no sch_netem (netlink: 'Specified qdisc kind is unknown')"
        return False, f"netem could not be added: {exc}"
    finally:
        netns.remove(scratch)
