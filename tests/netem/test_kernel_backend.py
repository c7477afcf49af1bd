"""The kernel backend: netlink parameters checked by encoding and decoding the message;
the real qdisc where the kernel has sch_netem (skipped with the reason elsewhere)."""

from __future__ import annotations

import errno
import math
import re
import shutil
import struct
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyroute2 import IPRoute, netns
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from netem import kernel
from netem.distributions import NETEM_DIST_SCALE, TABLE_SIZE
from netem.nsexec import command_in
from netem.spec import LinkSpec, LossModel
from netem.topology import LinkConfig, Network
from tests.conftest import require_namespaces


def encoded_options(spec: LinkSpec) -> kernel.NetemOptions:
    message = kernel.qdisc_message(7, spec)
    message.encode()
    decoded = kernel.NetemQdiscMessage(message.data)
    decoded.decode()
    assert decoded.get_attr("TCA_KIND") == "netem"
    assert decoded["index"] == 7
    return decoded.get_attr("TCA_OPTIONS")


def test_delay_rate_limit_and_loss_encode() -> None:
    spec = LinkSpec(
        rate_bps=100e6, delay_s=0.020, loss=LossModel("bernoulli", 0.01), limit_bytes=1_500_000
    )
    options = encoded_options(spec)
    assert options.get_attr("TCA_NETEM_LATENCY64") == 20_000_000
    assert options["limit"] == 1000
    assert options["loss"] == pytest.approx(0.01 * kernel.U32_MAX, rel=1e-6)
    assert options.get_attr("TCA_NETEM_RATE")["rate"] == 12_500_000
    assert options.get_attr("TCA_NETEM_DELAY_DIST") is None


def test_uniform_jitter_is_scaled_to_the_configured_std() -> None:
    options = encoded_options(LinkSpec(delay_s=0.02, jitter_s=0.002))
    # netem's built-in uniform spans +-sigma, whose std is sigma/sqrt(3)
    assert options.get_attr("TCA_NETEM_JITTER64") == round(0.002 * math.sqrt(3) * 1e9)
    # jitter without reordering gets a rate, which keeps netem's queue in order
    assert (
        options.get_attr("TCA_NETEM_RATE64") is not None
        or options.get_attr("TCA_NETEM_RATE") is not None
    )


def test_reordering_allowed_sends_no_fifo_rate() -> None:
    options = encoded_options(LinkSpec(delay_s=0.02, jitter_s=0.002, reorder=True))
    assert options.get_attr("TCA_NETEM_RATE") is None


@pytest.mark.parametrize("dist", ["normal", "pareto"])
def test_distribution_tables_have_unit_std(dist: str) -> None:
    options = encoded_options(LinkSpec(delay_s=0.02, jitter_s=0.002, jitter_dist=dist))
    table = options.get_attr("TCA_NETEM_DELAY_DIST")
    values = struct.unpack(f"={len(table) // 2}h", table)
    assert len(values) == TABLE_SIZE
    mean = sum(values) / len(values) / NETEM_DIST_SCALE
    std = math.sqrt(sum((v / NETEM_DIST_SCALE - mean) ** 2 for v in values) / len(values))
    assert abs(mean) < 0.01
    assert std == pytest.approx(1.0, rel=0.01)  # also after int16 cuts pareto's tail at 4 sigma
    assert options.get_attr("TCA_NETEM_JITTER64") == 2_000_000


def test_gilbert_elliott_encodes_transmit_probability_in_bad_state() -> None:
    loss = LossModel("gilbert-elliott", p=0.01, r=0.1, loss_bad=0.8, loss_good=0.001)
    ge = dict(encoded_options(LinkSpec(loss=loss)).get_attr("TCA_NETEM_LOSS")["attrs"])[
        "NETEM_LOSS_GE"
    ]
    assert ge["p"] == round(0.01 * kernel.U32_MAX)
    assert ge["r"] == round(0.1 * kernel.U32_MAX)
    assert ge["h"] == round(0.2 * kernel.U32_MAX)  # the kernel drops in the bad state when rnd > h
    assert ge["k1"] == round(0.001 * kernel.U32_MAX)


def test_fast_links_use_64_bit_rate() -> None:
    options = encoded_options(LinkSpec(rate_bps=100e9))
    assert options.get_attr("TCA_NETEM_RATE64") == int(100e9 / 8)


@pytest.mark.parametrize("qdisc", ["fifo", "fq_codel", "prio:fq"])
def test_kernel_backend_delays_packets(qdisc: str) -> None:
    require_namespaces()
    available, why = kernel.probe(f"netem-probe-{uuid.uuid4().hex[:8]}", (qdisc,))
    if not available:
        pytest.skip(f"kernel backend not testable here: {why}")
    spec = LinkSpec(rate_bps=100e6, delay_s=0.02, qdisc=qdisc)
    with Network(
        LinkConfig.symmetric(spec), name="t" + uuid.uuid4().hex[:10], backend="kernel"
    ) as net:
        out = subprocess.run(
            command_in(net.a.netns, ["ping", "-n", "-c", "5", "-i", "0.1", net.b.addr]),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rtts = [float(x.split("=")[1]) for x in out.split() if x.startswith("time=")]
        assert min(rtts) >= 39.5


# -- queueing disciplines: netem -> tbf -> discipline ---------------------------------------


def decoded(message: kernel.QdiscMessage) -> kernel.QdiscMessage:
    message.encode()
    back = kernel.QdiscMessage(message.data)
    back.decode()
    return back


def tree(spec: LinkSpec) -> list[tuple[int, kernel.QdiscMessage]]:
    return [(kind, decoded(m)) for kind, m in kernel.link_messages(7, spec)]


def test_fifo_is_netem_alone_with_its_own_rate() -> None:
    ((kind, root),) = tree(LinkSpec(rate_bps=100e6, delay_s=0.02))
    assert root.get_attr("TCA_KIND") == "netem" and root["parent"] == kernel.TC_H_ROOT
    assert root.get_attr("TCA_OPTIONS").get_attr("TCA_NETEM_RATE")["rate"] == 12_500_000


def test_fq_codel_sits_under_a_tbf_that_carries_the_rate() -> None:
    spec = LinkSpec(rate_bps=100e6, delay_s=0.02, qdisc="fq_codel", limit_bytes=1_500_000)
    (_, netem), (_, tbf), (_, fq_codel) = tree(spec)
    assert netem.get_attr("TCA_OPTIONS").get_attr("TCA_NETEM_RATE") is None
    assert netem.get_attr("TCA_OPTIONS").get_attr("TCA_NETEM_LATENCY64") == 20_000_000
    assert (tbf["parent"], tbf["handle"]) == (kernel.NETEM_HANDLE | 1, kernel.TBF_HANDLE)
    options = tbf.get_attr("TCA_OPTIONS")
    assert options.get_attr("TCA_TBF_PARMS")["rate"] == 12_500_000
    assert options.get_attr("TCA_TBF_BURST") == 12_500  # 1 ms at the rate
    assert (fq_codel["parent"], fq_codel.get_attr("TCA_KIND")) == (
        kernel.TBF_HANDLE | 1,
        "fq_codel",
    )
    codel = fq_codel.get_attr("TCA_OPTIONS")
    assert codel.get_attr("TCA_FQ_CODEL_LIMIT") == 1000
    assert codel.get_attr("TCA_FQ_CODEL_TARGET") == 5000
    assert codel.get_attr("TCA_FQ_CODEL_INTERVAL") == 100_000
    assert codel.get_attr("TCA_FQ_CODEL_ECN") == 1


def test_jitter_keeps_netem_in_order_when_a_tbf_rates_the_link() -> None:
    spec = LinkSpec(rate_bps=100e6, delay_s=0.02, jitter_s=0.002, qdisc="fq")
    netem = tree(spec)[0][1].get_attr("TCA_OPTIONS")
    assert netem.get_attr("TCA_NETEM_RATE64") == int(kernel.FIFO_RATE_BPS / 8)


def test_prio_classifies_by_dscp_precedence_into_three_bands() -> None:
    spec = LinkSpec(rate_bps=50e6, qdisc="prio:fq")
    messages = tree(spec)
    prio = messages[2][1]
    assert prio.get_attr("TCA_KIND") == "prio"
    options = prio.get_attr("TCA_OPTIONS")
    assert options["bands"] == 3 and list(options["priomap"]) == [2] * 16
    filters = [m for kind, m in messages if kind == kernel.RTM_NEWTFILTER]
    assert [f.get_attr("TCA_OPTIONS").get_attr("TCA_U32_CLASSID") for f in filters] == [
        kernel.QDISC_HANDLE | 1,
        kernel.QDISC_HANDLE | 2,
    ]
    selector = filters[1].get_attr("TCA_OPTIONS").get_attr("TCA_U32_SEL")
    flags, _, nkeys = selector[0], selector[1], selector[2]
    mask, value = struct.unpack(">II", selector[16:24])
    assert (flags, nkeys, mask, value) == (kernel.TC_U32_TERMINAL, 1, 0x00C00000, 0x00400000)
    assert all(f["info"] & 0xFFFF == 0x0008 for f in filters)  # ETH_P_IP in network order
    rest = messages[-1][1]
    assert (rest["parent"], rest.get_attr("TCA_KIND")) == (kernel.QDISC_HANDLE | 3, "fq")
    assert (
        rest.get_attr("TCA_OPTIONS").get_attr("TCA_FQ_FLOW_PLIMIT")
        == spec.queue_limit_bytes // 1500
    )


def test_a_stalled_link_is_refused_by_the_kernel_backend() -> None:
    with pytest.raises(ValueError, match="rate 0"):
        kernel.link_messages(7, LinkSpec(rate_bps=0.0))


@pytest.fixture
def scratch_veth():
    """A veth in a namespace of its own, for messages this kernel can take (tbf, htb, u32)."""
    require_namespaces()
    name = f"netem-kq-{uuid.uuid4().hex[:8]}"
    netns.create(name)
    try:
        with IPRoute(netns=name, flags=0) as ipr:
            ipr.link("add", ifname="k0", kind="veth", peer={"ifname": "k1"})
            index = ipr.link_lookup(ifname="k0")[0]
            ipr.status.setdefault("nlm_generator", False)
            yield name, ipr, index
    finally:
        netns.remove(name)


def tc_show(namespace: str, what: str) -> str:
    return subprocess.run(
        command_in(namespace, ["tc", what, "show", "dev", "k0"]),
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_this_kernel_takes_the_tbf_and_the_band_filters(scratch_veth) -> None:
    """The parts of the tree this kernel has, sent as built and read back through pyroute2 (tbf
    as root here; the filters on an htb standing in for prio, which shares their parent)."""
    namespace, ipr, index = scratch_veth
    spec = LinkSpec(rate_bps=100e6, qdisc="fq_codel", limit_bytes=150_000)
    tbf = kernel.link_messages(index, spec)[1][1]
    tbf["parent"] = kernel.TC_H_ROOT
    ipr.nlm_request(tbf, msg_type=kernel.RTM_NEWQDISC, msg_flags=CREATE)
    parms = read_back(ipr, index)[kernel.TBF_HANDLE].get_attr("TCA_OPTIONS")
    parms = parms.get_attr("TCA_TBF_PARMS")
    assert (parms["rate"], parms["limit"]) == (12_500_000, 150_000)
    assert "rate 100Mbit burst 12500b" in tc_show(namespace, "qdisc")
    subprocess.run(command_in(namespace, ["tc", "qdisc", "del", "dev", "k0", "root"]), check=True)
    subprocess.run(
        command_in(namespace, ["tc", "qdisc", "add", "dev", "k0", "root", "handle", "3:", "htb"]),
        check=True,
    )
    for band in (0, 1):
        ipr.nlm_request(
            kernel.band_filter_message(index, band),
            msg_type=kernel.RTM_NEWTFILTER,
            msg_flags=CREATE,
        )
    assert band_classes(ipr, index) == [kernel.QDISC_HANDLE | 1, kernel.QDISC_HANDLE | 2]
    shown = tc_show(namespace, "filter")
    assert "flowid 3:1" in shown and "match 00800000/00800000 at 0" in shown
    assert "flowid 3:2" in shown and "match 00400000/00c00000 at 0" in shown


@pytest.mark.parametrize("qdisc", ["fq", "fq_codel", "prio", "prio:fq", "prio:fq_codel"])
def test_the_discipline_part_of_each_tree_reads_back_as_mapped(scratch_veth, qdisc: str) -> None:
    """Everything of a discipline's tree below netem, sent as built (the tbf as root: netem
    above it needs sch_netem) and read back through pyroute2: each qdisc at the handle and
    parent the mapping gives it, the tbf's rate and limit, prio's filters to bands 1 and 2.
    Skipped, naming the missing module, on a kernel without the discipline (this one has tbf,
    htb and pfifo, not fq, fq_codel or prio)."""
    _, ipr, index = scratch_veth
    spec = LinkSpec(rate_bps=100e6, qdisc=qdisc, limit_bytes=150_000)
    messages = kernel.link_messages(index, spec)[1:]
    messages[0][1]["parent"] = kernel.TC_H_ROOT
    missing = None
    for msg_type, message in messages:
        try:
            ipr.nlm_request(message, msg_type=msg_type, msg_flags=CREATE)
        except NetlinkError as exc:
            if exc.code != errno.ENOENT or msg_type != kernel.RTM_NEWQDISC:
                raise
            missing = message.get_attr("TCA_KIND")
            break
    found = read_back(ipr, index)
    parms = found[kernel.TBF_HANDLE].get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")
    assert (parms["rate"], parms["limit"]) == (12_500_000, 150_000)
    if missing is not None:
        built = kernel.built_without(missing) or "no build configuration readable"
        pytest.skip(
            f"this kernel has no sch_{missing} (netlink: 'Specified qdisc kind is unknown'; "
            f"{built}); the tbf above it was built and read back, and the request checked "
            "against tc's (test_each_discipline_is_the_request_tc_sends)"
        )
    kind, _, rest = qdisc.partition(":")
    expected = {
        kernel.TBF_HANDLE: ("tbf", kernel.TC_H_ROOT),
        kernel.QDISC_HANDLE: (kind, kernel.TBF_HANDLE | 1),
    }
    if rest:
        expected[kernel.REST_HANDLE] = (rest, kernel.QDISC_HANDLE | kernel.BANDS)
    assert {
        handle: (message.get_attr("TCA_KIND"), message["parent"])
        for handle, message in found.items()
        if handle in expected
    } == expected
    if kind == "prio":
        assert band_classes(ipr, index) == [kernel.QDISC_HANDLE | 1, kernel.QDISC_HANDLE | 2]
    if "fq_codel" in qdisc:
        handle = kernel.QDISC_HANDLE if kind == "fq_codel" else kernel.REST_HANDLE
        codel = found[handle].get_attr("TCA_OPTIONS")
        assert codel.get_attr("TCA_FQ_CODEL_LIMIT") == 100  # 150 kB of 1500-byte packets


CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL


def read_back(ipr: IPRoute, index: int) -> dict[int, Any]:
    """The interface's qdiscs as the kernel reports them, by handle."""
    return {message["handle"]: message for message in ipr.get_qdiscs(index=index)}


def band_classes(ipr: IPRoute, index: int) -> list[int]:
    """The classes the u32 filters under prio's handle send to, as the kernel reports them."""
    return sorted(
        options.get_attr("TCA_U32_CLASSID")
        for message in ipr.get_filters(index=index, parent=kernel.QDISC_HANDLE)
        if (options := message.get_attr("TCA_OPTIONS")) and options.get_attr("TCA_U32_CLASSID")
    )


# What `tc` is told to build each discipline of the mapping (kernel.discipline_options).
TC_ARGS = {
    "fq_codel": "limit {limit} target 5000us interval 100000us ecn",
    "fq": "limit {limit} flow_limit {limit} quantum 1500",
    "prio": "bands 3 priomap" + " 2" * 16,
}


HEADERS = 16 + 20  # struct nlmsghdr, struct tcmsg: the attributes follow
RTM_NEWQDISC = 36  # the netlink message type of a qdisc request (linux/rtnetlink.h)


def tc_handle(handle: int) -> str:
    return f"{handle >> 16:x}:{handle & 0xFFFF:x}"


def tc_request(namespace: str, argv: list[str], dump: Path) -> bytes:
    """The netlink request `tc` sends for `argv`, whether or not this kernel can take it: the
    bytes of its sendmsg carrying RTM_NEWQDISC, as strace dumps them (one dump per call: tc
    may send other requests, e.g. to look the device up, by sendmsg too)."""
    traced = subprocess.run(
        command_in(namespace, ["strace", "-qq", "-e", "trace=sendmsg", "-e", "write=all"])
        + ["-o", str(dump), "tc", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    if not dump.exists():
        pytest.fail(f"strace could not trace tc {' '.join(argv)}: {traced.stderr.strip()}")
    requests = []
    for call in re.split(r"^(?! \| )", dump.read_text(), flags=re.M):
        rows = re.findall(r"^ \| [0-9a-f]{5}  ((?:[0-9a-f]{2} {1,2})+)", call, re.M)
        data = bytes.fromhex("".join(rows).replace(" ", ""))
        if len(data) >= HEADERS and struct.unpack_from("=H", data, 4)[0] == RTM_NEWQDISC:
            requests.append(data)
    assert len(requests) == 1, f"tc sent {len(requests)} RTM_NEWQDISC requests for {argv}"
    return requests[0]


def attributes(data: bytes) -> list[tuple[int, bytes]]:
    """Netlink attributes (type, payload), sorted: tc and pyroute2 may order them differently."""
    found, at = [], 0
    while at + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, at)
        assert length >= 4, f"a malformed attribute at byte {at}"
        found.append((kind, data[at + 4 : at + length]))
        at += (length + 3) & ~3
    return sorted(found)


def as_pyroute2_reads_it(data: bytes) -> tuple[dict, object]:
    """A qdisc request decoded by pyroute2's stock tcmsg, with its own option layouts (fq_codel's
    attributes, prio's struct; fq, which it lacks, as the raw bytes): header, kind, options."""
    message = tcmsg(data)
    message.decode()
    header = {k: message[k] for k in ("family", "index", "handle", "parent", "info")}
    options = message.get_attr("TCA_OPTIONS")
    if not isinstance(options, str):
        attrs = sorted((slot[0], slot[1]) for slot in options.get("attrs") or [])
        options = (attrs, options.get("bands"), options.get("priomap"))
    return {**header, "kind": message.get_attr("TCA_KIND")}, options


@pytest.mark.parametrize("qdisc", ["fq", "fq_codel", "prio", "prio:fq", "prio:fq_codel"])
def test_each_discipline_is_the_request_tc_sends(scratch_veth, tmp_path, qdisc: str) -> None:
    """The mapping's fq, fq_codel and prio requests against `tc`'s for the same qdisc: same
    header, kind and option attributes byte for byte, both decoded by pyroute2. It runs where
    the kernel lacks these disciplines (tc's request is read before the kernel refuses it);
    whether a kernel that has them installs them as read back stays for
    test_the_discipline_part_of_each_tree_reads_back_as_mapped."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (scripts/install-system-deps installs it)")
    namespace, _, index = scratch_veth
    spec = LinkSpec(rate_bps=100e6, qdisc=qdisc, limit_bytes=150_000)
    ours = [
        m
        for t, m in kernel.link_messages(index, spec)
        if t == kernel.RTM_NEWQDISC and m.get_attr("TCA_KIND") not in ("netem", "tbf")
    ]
    assert len(ours) == len(qdisc.split(":"))
    for n, message in enumerate(ours):
        kind = message.get_attr("TCA_KIND")
        args = TC_ARGS[kind].format(limit=100).split()  # 150 kB of 1500-byte packets
        place = ["parent", tc_handle(message["parent"]), "handle", tc_handle(message["handle"])]
        sent = tc_request(
            namespace, ["qdisc", "add", "dev", "k0", *place, kind, *args], tmp_path / f"{n}"
        )
        message.encode()
        ours_read, tc_read = as_pyroute2_reads_it(message.data), as_pyroute2_reads_it(sent)
        assert ours_read[0] == tc_read[0]
        if not isinstance(tc_read[1], str):  # a kind pyroute2 has a layout for
            assert ours_read[1] == tc_read[1]
        ours_options = attributes(message.data[HEADERS:])[1][1]  # TCA_OPTIONS after TCA_KIND
        tc_options = attributes(sent[HEADERS:])[1][1]
        if kind == "prio":  # struct tc_prio_qopt itself (tc follows it with an empty nest
            # of attributes, its compat form, which sch_prio reads only for multiqueue)
            assert ours_options == tc_options[:20] and tc_options[20:] == b"\x04\x00\x02\x00"
        else:
            assert attributes(ours_options) == attributes(tc_options)
