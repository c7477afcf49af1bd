"""The kernel backend: netlink parameters checked by encoding and decoding the message;
the real qdisc where the kernel has sch_netem (skipped with the reason elsewhere)."""

from __future__ import annotations

import math
import struct
import subprocess
import uuid

import pytest

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


def test_kernel_backend_delays_packets() -> None:
    require_namespaces()
    available, why = kernel.probe(f"netem-probe-{uuid.uuid4().hex[:8]}")
    if not available:
        pytest.skip(f"kernel backend not testable here: {why}")
    spec = LinkSpec(delay_s=0.02)
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
