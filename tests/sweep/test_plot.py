"""`pddemu sweep plot`: a metric against a swept key, one line per system (and setting of the
other swept keys), each marker the mean over the seeds and its error bar their range."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pddemu.config import ConfigError
from pddemu.sweep.plot import plot_sweep, series


def entry(system: str, seed: int, rate: str, p99: float | None, status: str = "done") -> dict:
    summary: dict[str, Any] = {} if p99 is None else {"ttft_s": {"p99": p99}}
    return {
        "settings": {"wan.rate": rate, "wan.qdisc": "fifo"},
        "values": {"wan.rate": float(rate.removesuffix("gbit")) * 1e9, "wan.qdisc": "fifo"},
        "seed": seed,
        "system": system,
        "point": {"id": f"{system}-{seed}-{rate}", "status": status},
        **summary,
    }


ENTRIES = [
    entry("pdd", 0, "1gbit", 4.0),
    entry("pdd", 1, "1gbit", 6.0),
    entry("pdd", 2, "1gbit", 11.0),
    entry("pdd", 0, "10gbit", 1.0),
    entry("pdd", 1, "10gbit", 99.0, status="failed"),  # not finished: left out
    entry("naive", 0, "10gbit", 2.0),
    entry("naive", 1, "10gbit", None),  # no such field: left out
]


def test_each_marker_is_the_seeds_mean_and_its_bar_their_range() -> None:
    lines = series(ENTRIES, "wan.rate", "ttft_s.p99")
    assert set(lines) == {"pdd (wan.qdisc=fifo)", "naive (wan.qdisc=fifo)"}
    assert sorted(lines["pdd (wan.qdisc=fifo)"]) == [(1e9, 7.0, 4.0, 11.0), (1e10, 1.0, 1.0, 1.0)]
    assert lines["naive (wan.qdisc=fifo)"] == [(1e10, 2.0, 2.0, 2.0)]
    # a key whose values are not numbers keeps them as written
    assert series(ENTRIES, "wan.qdisc", "ttft_s.p99")["pdd (wan.rate=1gbit)"] == [
        ("fifo", 7.0, 4.0, 11.0)
    ]


def test_an_unknown_key_or_metric_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="--x wan.delay: not a swept key; swept: wan.qdisc"):
        series(ENTRIES, "wan.delay", "ttft_s.p99")
    with pytest.raises(ConfigError, match="--y bcr: no finished point has this field"):
        series(ENTRIES, "wan.rate", "bcr")


def test_the_plot_is_written_beside_the_sweep(tmp_path: Path) -> None:
    (tmp_path / "sweep.json").write_text(json.dumps({"sweep": {}, "points": ENTRIES}))
    path = plot_sweep(tmp_path, "wan.rate", "ttft_s.p99", logx=True)
    assert path == tmp_path / "ttft_s.p99-vs-wan.rate.png"
    assert path.read_bytes().startswith(b"\x89PNG")
    with pytest.raises(ConfigError, match="not a sweep directory"):
        plot_sweep(tmp_path / "nothing", "wan.rate", "ttft_s.p99")
