"""What `make bench-netem` records beside each row about the host it ran on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from netem import bench
from netem.procstat import process_cpu_s, steal_between, steal_s


def test_steal_time_is_read_per_cpu_from_proc_stat() -> None:
    stat = (
        "cpu  4276204 1870903 806877 6545148 37163 0 39399 151017 0 0\n"
        "cpu0 1725918 968529 378626 3683837 7814 0 16948 76068 0 0\n"
        "cpu1 2550286 902374 428251 2861311 29348 0 22451 74949 0 0\n"
        "intr 1 2 3\n"
    )
    ticks = os.sysconf("SC_CLK_TCK")
    assert steal_s(stat) == [76068 / ticks, 74949 / ticks]
    assert len(steal_s()) == os.cpu_count()
    assert steal_between([1.0, 2.0], [1.5, 2.004]) == [0.5, 0.0]
    # a CPU brought online or taken off between the readings: unknown, not an error
    assert steal_between([1.0, 2.0], [1.5, 2.0, 0.3]) is None
    assert steal_between([1.0, 2.0], [1.5]) is None


def test_process_cpu_is_read_from_proc_and_gone_processes_read_none() -> None:
    assert process_cpu_s(os.getpid()) > 0
    assert process_cpu_s(2**22 + 1) is None  # above the kernel's largest pid


@pytest.mark.parametrize("shaper_pid", [None, os.getpid()])
def test_rate_row_reads_shaper_share_null_without_a_shaper(
    monkeypatch: pytest.MonkeyPatch, shaper_pid: int | None
) -> None:
    """The kernel backend has no shaper process: its rows say the share is unknown (null),
    not that the shaping cost nothing (0.0); a userspace row gives a measured share."""

    @contextmanager
    def network(*_args: Any, **_options: Any) -> Iterator[SimpleNamespace]:
        shaper = None if shaper_pid is None else SimpleNamespace(pid=shaper_pid)
        yield SimpleNamespace(shaper=shaper)

    def iperf(*_args: Any, **_options: Any) -> dict[str, Any]:
        sum(range(200_000))  # some CPU of this process, the stand-in shaper
        end = {"bits_per_second": 9.5e6, "retransmits": 0}
        return {"end": {"sum_received": end, "sum_sent": end}}

    monkeypatch.setattr(bench, "_network", network)
    monkeypatch.setattr(bench, "iperf", iperf)
    share = bench.bench_rate(10e6, quick=True)["shaper_cpu_share"]
    if shaper_pid is None:
        assert share is None
    else:
        assert isinstance(share, float) and share >= 0
