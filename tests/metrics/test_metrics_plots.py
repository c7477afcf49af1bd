"""Every figure is a real, non-empty PNG, and the timeline shows the request it should."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from metrics_samples import baseline_records, completed, sample_records

from pddemu.metrics import MetricsError
from pddemu.metrics.plots import (
    DPI,
    PLOT_FILES,
    WanTransfer,
    WanUse,
    _bits_sent_by,
    pick_handoff_request,
    plot_handoff_timeline,
    plot_hit_rate_histogram,
    plot_itl_cdf,
    plot_ttft_cdf,
    plot_wan_use,
    share_at_least,
    write_plots,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def assert_png(path: Path, width_in: float) -> None:
    assert path.is_file()
    assert path.stat().st_size > 10_000  # axes, text and data, not a blank canvas
    width, height = png_size(path)
    assert width == round(width_in * DPI) and height > 300


def share_of_pixels_near(path: Path, colour: str) -> float:
    from matplotlib.colors import to_rgb

    image = imread(path)[..., :3]
    distance = np.abs(image - np.asarray(to_rgb(colour))).max(axis=-1)
    return float((distance < 0.08).mean())


def by_system() -> dict:
    return {"pdd": sample_records(), "naive": baseline_records("naive", 2.0)}


def test_ttft_and_itl_cdfs(tmp_path: Path) -> None:
    assert_png(plot_ttft_cdf(tmp_path / "ttft.png", by_system()), 7.0)
    assert_png(plot_itl_cdf(tmp_path / "itl.png", by_system()), 7.0)


def test_itl_ccdf_counts_gaps_of_zero_below_every_drawn_point() -> None:
    """Two of four gaps are 0 (tokens delivered together): no drawn gap has more than half of
    all gaps at or above it."""
    gaps, share = share_at_least(np.array([0.002, 0.0, 0.001, 0.0]))
    assert gaps.tolist() == [0.001, 0.002] and share.tolist() == [0.5, 0.25]


def test_cdf_of_systems_without_completed_requests_still_draws(tmp_path: Path) -> None:
    path = plot_ttft_cdf(tmp_path / "ttft.png", {"pdd": [], "naive": []})
    assert png_size(path)[0] == 770


def test_pick_handoff_request_takes_the_largest_stall() -> None:
    records = sample_records()
    assert pick_handoff_request(records).request_id == "r2"  # stall 2.0 s against r5's 0.2 s
    records[1].state = "failed"
    assert pick_handoff_request(records).request_id == "r5"
    assert pick_handoff_request(records[2:4]) is None


def test_timeline_draws_rld_and_md_tokens_and_the_stall(tmp_path: Path) -> None:
    times = [1.0 + 0.02 * i for i in range(40)] + [5.0 + 0.02 * i for i in range(60)]
    record = completed(
        "long",
        0.0,
        times,
        pipeline="P-RLD-MD",
        handoff_mode="one_shot",
        handoff_position=40,
        handoff_stall_s=times[40] - times[39],
        handoff_rounds=1,
        rld_tokens=40,
        md_tokens=60,
    )
    path = plot_handoff_timeline(tmp_path / "timeline.png", [*sample_records(), record])
    assert_png(path, 7.0)
    assert share_of_pixels_near(path, "tab:orange") > 0.001  # RLD tokens
    assert share_of_pixels_near(path, "tab:blue") > 0.001  # MD tokens
    # the shaded stall: red at alpha 0.25 over white
    assert share_of_pixels_near(path, "#f6c9c9") > 0.01


def test_timeline_of_a_named_request_and_of_none(tmp_path: Path) -> None:
    records = sample_records()
    assert_png(plot_handoff_timeline(tmp_path / "r5.png", records, request_id="r5"), 7.0)
    empty = plot_handoff_timeline(tmp_path / "none.png", baseline_records("naive", 1.0))
    assert png_size(empty)[0] == 770
    with pytest.raises(MetricsError, match="no request 'zz'"):
        plot_handoff_timeline(tmp_path / "x.png", records, request_id="zz")
    with pytest.raises(MetricsError, match="'r1' has no handoff inside its token times"):
        plot_handoff_timeline(tmp_path / "x.png", records, request_id="r1")


def test_hit_rate_histogram(tmp_path: Path) -> None:
    assert_png(plot_hit_rate_histogram(tmp_path / "hits.png", sample_records()), 8.0)
    assert png_size(plot_hit_rate_histogram(tmp_path / "none.png", []))[0] == 880


def test_write_plots_writes_every_figure(tmp_path: Path) -> None:
    wan = WanUse({"pdd": [WanTransfer(0.0, 2.0, 1000, [(1.0, 400), (2.0, 600)])]}, {}, 8e3, 1.0)
    plots = write_plots(tmp_path / "out", by_system(), slo_ttft_s=1.5, wan=wan)
    assert list(plots) == list(PLOT_FILES)
    for title, path in plots.items():
        assert path == tmp_path / "out" / PLOT_FILES[title]
        assert png_size(path)[0] > 0 and path.stat().st_size > 10_000
    with pytest.raises(MetricsError, match="no system"):
        write_plots(tmp_path, {})


def test_wan_bits_never_outrun_the_link_and_meet_every_arrival() -> None:
    """Two transfers whose chunks arrive together: the link (8 kbit/s) cannot have carried
    both in the last second, so the reconstruction starts sending earlier."""
    transfers = [
        WanTransfer(0.0, 4.0, 2000, [(2.0, 1000), (4.0, 1000)]),
        WanTransfer(0.0, 4.0, 1000, [(4.0, 1000)]),
    ]
    times = np.linspace(0.0, 4.0, 41)
    sent = _bits_sent_by(transfers, times, rate_bps=8e3, byte_scale=1.0)
    assert np.all(np.diff(sent) <= 8e3 * 0.1 + 1e-6)  # at most the link's rate
    assert sent[20] >= 8000 and sent[-1] == 24000  # every chunk on the link by its arrival
    assert sent[0] == 0 and np.all(np.diff(sent) >= 0)


def test_ttft_and_wan_figures_are_read_at_a_glance(tmp_path: Path) -> None:
    """The SLO line is drawn in its colour; the WAN figure has both panels."""
    path = plot_ttft_cdf(tmp_path / "ttft.png", by_system(), slo_ttft_s=1.5)
    assert share_of_pixels_near(path, "tab:red") > 0.001
    wan = WanUse({"pdd": [WanTransfer(0.0, 2.0, 1000, [(2.0, 1000)])]}, {"pdd": 0.0}, 8e3, 1.0)
    assert_png(plot_wan_use(tmp_path / "wan.png", wan), 8.0)
