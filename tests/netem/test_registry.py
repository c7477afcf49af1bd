"""Run book-keeping: claims are atomic, cleanup touches only its own run."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from pyroute2 import netns

from netem import kernel
from netem.registry import (
    Registry,
    RunError,
    list_namespaces,
    namespace_name,
    process_start,
    run_of_namespace,
)
from netem.schedule import parse_schedule
from netem.spec import LinkSpec
from netem.topology import LinkConfig, Network, TopologyError
from tests.netem.helpers import median, ping_rtts


def test_namespace_names_map_back_to_their_run() -> None:
    assert run_of_namespace("netem-zq-b-a2") == "zq-b"
    assert run_of_namespace("netem-zq-a") == "zq"
    assert run_of_namespace("other-zq-a") is None


def test_claim_is_exclusive_and_a_recordless_run_is_busy(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    record = registry.claim("alpha")
    assert record.pid == os.getpid() and (tmp_path / "runs" / "alpha" / "run.json").exists()
    with pytest.raises(RunError, match="already up"):
        registry.claim("alpha")  # its controller (this process) is alive
    (tmp_path / "runs" / "beta").mkdir()  # someone else's run, record not readable
    with pytest.raises(RunError, match="already up"):
        registry.claim("beta")
    assert registry.names() == ["alpha", "beta"]  # failed claims leave nothing of their own
    assert len(list((tmp_path / "slots").iterdir())) == 1


def test_a_dead_owners_run_is_taken_over(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    record = registry.claim("gamma")
    record.pid, record.pid_start = 1, -1  # an owner that is not the process running as pid 1
    registry.save(record)
    assert registry.claim("gamma").pid == os.getpid()


def test_cleanup_spares_a_run_whose_name_extends_this_one(run_name: str) -> None:
    mine, theirs = namespace_name(run_name, "a"), namespace_name(f"{run_name}-b", "a")
    for ns in (mine, theirs):
        netns.create(ns)
    try:
        Registry().cleanup(run_name)
        assert mine not in list_namespaces() and theirs in list_namespaces()
    finally:
        Registry().cleanup(f"{run_name}-b")
    assert theirs not in list_namespaces()


def test_cleanup_by_a_late_guardian_spares_a_new_owner(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.claim("delta")
    assert registry.cleanup("delta", owner=(1, -1)) == []  # not the owner's run any more
    assert registry.names() == ["delta"]
    assert registry.cleanup("delta", owner=(os.getpid(), process_start(os.getpid()))) == []
    assert registry.names() == []


def test_a_control_client_that_hangs_up_does_not_stop_the_shaper(
    run_name: str, tools: None
) -> None:
    with Network(
        LinkConfig.symmetric(LinkSpec(delay_s=0.002)), name=run_name, backend="userspace"
    ) as net:
        for _ in range(5):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(net.record.control)
                client.sendall(b'{"op": "stats"}\n')  # and close before reading the answer
        time.sleep(0.2)
        assert net.shaper.poll() is None
        assert len(ping_rtts(net, 3, 0.05)) == 3


def test_a_shaped_intra_link_stays_changeable_at_zero_delay(run_name: str, tools: None) -> None:
    intra = LinkConfig.symmetric(LinkSpec(delay_s=0.003))
    with Network(
        LinkConfig.symmetric(LinkSpec()), intra=intra, name=run_name, backend="userspace"
    ) as net:
        net.set_link("intra", delay_s=0.0)
        net.set_link("intra", delay_s=0.004)
        assert median(ping_rtts(net, 3, 0.05, dst=net.a2.addr)) >= 7.5
        net.set_link_state("intra", up=False)
        assert ping_rtts(net, 3, 0.05, dst=net.a2.addr) == []


def test_the_kernel_backend_refuses_a_schedule(run_name: str) -> None:
    schedule = parse_schedule("0 delay=10ms\n")
    with pytest.raises(TopologyError, match="schedule"):
        Network(
            LinkConfig.symmetric(LinkSpec()), name=run_name, backend="kernel", schedule=schedule
        ).up()
    assert run_name not in Registry().names()


@pytest.mark.parametrize(
    ("raised", "available", "why"),
    [
        (None, True, ""),
        (kernel.NetlinkError(2), False, "no sch_netem"),
        (kernel.NetlinkError(22), False, "could not be added"),
    ],
)
def test_probe_classifies_what_the_kernel_says(
    monkeypatch, run_name: str, raised, available: bool, why: str
) -> None:
    def fake_apply(*_args, **_kwargs) -> None:
        if raised is not None:
            raise raised

    monkeypatch.setattr(kernel, "apply_netem", fake_apply)
    result = kernel.probe(namespace_name(run_name, "probe"))
    assert result[0] is available and why in result[1]
    assert namespace_name(run_name, "probe") not in list_namespaces()
