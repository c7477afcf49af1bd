"""What `make bench-netem` records beside each row about the host it ran on."""

from __future__ import annotations

import os

from netem.bench import steal_s


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
