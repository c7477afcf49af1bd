"""Every figure is a real, non-empty PNG, and the timeline shows the request it should."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from matplotlib.text import Text
from metrics_samples import baseline_records, completed, sample_records

from pddemu.metrics import MetricsError
from pddemu.metrics.plots import (
    DPI,
    PLOT_FILES,
    WanTransfer,
    WanUse,
    _bits_sent_by,
    handoff_timeline_figure,
    pick_handoff_request,
    plot_handoff_timeline,
    plot_hit_rate_histogram,
    plot_itl_cdf,
    plot_ttft_cdf,
    plot_wan_use,
    share_at_least,
    wan_backlog,
    wan_use_figure,
    write_plots,
)
from pddemu.metrics.records import RequestRecord

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


def relayed(handoff_gap_s: float) -> RequestRecord:
    """600 tokens at an 8 ms cadence, MD taking over at 422 after `handoff_gap_s`; the gap and
    stall recorded as the frontend records them."""
    times = [2.0 + 0.008 * i for i in range(422)]
    times += [times[-1] + handoff_gap_s + 0.008 * i for i in range(178)]
    record = completed(
        "relayed",
        1.0,
        times,
        pipeline="P-RLD-MD",
        handoff_mode="catch_up",
        handoff_position=422,
        handoff_rounds=2,
        rld_tokens=422,
        md_tokens=178,
    )
    record.handoff_gap_s = times[422] - times[421]
    record.handoff_stall_s = max(0.0, record.handoff_gap_s - record.tpot_s)
    return record


@pytest.mark.parametrize("handoff_gap_s", [0.0, 0.03])
def test_timeline_ticks_count_whole_tokens(handoff_gap_s: float) -> None:
    """A zoom over a dozen tokens would get ticks every 2.5 tokens by default."""
    figure = handoff_timeline_figure([relayed(handoff_gap_s)])
    assert len(figure.axes) == 2
    for axes in figure.axes:
        low, high = axes.get_ylim()
        ticks = [t for t in axes.get_yticks() if low <= t <= high]
        assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks), ticks


@pytest.mark.parametrize("handoff_gap_s", [0.0, 0.03])
def test_timeline_marks_the_handoff_at_mds_first_token_in_both_panels(
    handoff_gap_s: float,
) -> None:
    """The dashed line of each panel is at the recorded handoff's token time, and the zoom's
    x range holds it: no line of the top panel crosses the zoom at another time."""
    record = relayed(handoff_gap_s)
    handoff = record.token_times_s[record.handoff_position] - record.arrival_s
    top, zoom = handoff_timeline_figure([record]).axes
    for axes in (top, zoom):
        dashed = [line for line in axes.get_lines() if line.get_linestyle() == "--"]
        assert [line.get_xdata()[0] for line in dashed] == [handoff]
    low, high = zoom.get_xlim()
    assert low < handoff < high
    assert not zoom.child_axes and not top.child_axes  # the zoom is no inset over `top`


def test_timeline_names_gap_and_stall_as_the_record_does() -> None:
    """stall = max(0, gap - TPOT), gap = time between consecutive delivered tokens: the title
    spells the stall out from the record's figures, the zoom names the same gap."""
    record = relayed(0.03)
    top, zoom = handoff_timeline_figure([record]).axes
    gap, tpot, stall = (x * 1000 for x in (0.03, record.tpot_s, record.handoff_stall_s))
    assert stall == pytest.approx(gap - tpot) and stall > 0
    assert top.get_title() == (
        f"Request relayed: handoff stall {stall:.1f} ms\n"
        f"= max(0, handoff gap {gap:.1f} ms - TPOT {tpot:.1f} ms)"
    )
    assert f"gap {gap:.1f} ms from the RLD's last token to MD's first" in zoom.get_title()
    assert f"TPOT {tpot:.1f} ms" in zoom.get_title() and "stall" not in zoom.get_title()
    labels = [text.get_text() for text in top.get_legend().get_texts()]
    assert f"largest gap: {gap:.1f} ms, at {record.token_times_s[421] - 1.0:.2f} s" in labels
    assert "handoff: MD's first token (catch_up, 2 round(s))" in labels
    zero = relayed(0.0)
    assert "handoff stall 0.0 ms" in handoff_timeline_figure([zero]).axes[0].get_title()


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


def test_the_wan_backlog_is_what_was_offered_and_has_not_arrived() -> None:
    """Two transfers on a link of 1000 B/s: A offers 2000 B at 0 s (arriving 1000 B at 1 s
    and 2 s), B offers 1000 B at 1 s (arriving at 3 s). The backlog is 2000 B until 2 s (at
    1 s B's offer and A's first arrival meet: neither dip nor spike), 1000 B until 3 s, then 0; a transfer
    with no record of its offering is left out, counted and named in the figure's legend."""
    a = WanTransfer(0.0, 2.0, 2000, [(1.0, 1000), (2.0, 1000)], "a", offered=[(0.0, 2000)])
    b = WanTransfer(1.0, 3.0, 1000, [(3.0, 1000)], "b", offered=[(1.0, 1000)])
    unknown = WanTransfer(1.0, 2.0, 500, [(2.0, 500)], "c")
    times, backlog, left_out = wan_backlog([a, b, unknown], origin=-1.0)
    assert left_out == 1 and backlog.min() == 0
    assert list(zip(times.tolist(), backlog.tolist(), strict=True)) == [
        (0.0, 0.0), (1.0, 2000.0), (2.0, 2000.0), (3.0, 1000.0), (4.0, 0.0)
    ]  # fmt: skip
    figure = wan_use_figure(WanUse({"pdd": [a, b, unknown]}, {"pdd": -1.0}, 8e3, 0.5))
    bottom = figure.axes[1]
    line = bottom.get_lines()[0]
    assert line.get_ydata().max() == pytest.approx(4000 / 1e9)  # modelled GB: genuine / 0.5
    assert "offered" in bottom.get_ylabel()
    assert [text.get_text() for text in bottom.get_legend().get_texts()] == [
        "pdd: 1 transfer(s) with no record of when P offered their KV, not counted"
    ]


def test_the_wan_legend_hides_no_trace_and_not_the_title() -> None:
    """Two systems whose utilisation fills the axes at every height somewhere (as the
    reference run's does): the legend stands outside the axes, clear of the title."""
    transfers = {
        system: [
            WanTransfer(float(i), float(i) + 1.0, (i % 10 + 1) * 100, [(float(i) + 1.0, 1000)])
            for i in range(0, 40, 2)
        ]
        for system in ("pdd", "naive")
    }
    figure = wan_use_figure(WanUse(transfers, {"pdd": 0.0, "naive": 0.0}, 8e3, 1.0))
    figure.tight_layout()
    renderer = figure.canvas.get_renderer()
    top = figure.axes[0]
    legend = top.get_legend().get_window_extent(renderer)
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["pdd", "naive"]
    assert not legend.overlaps(top.get_window_extent(renderer))
    (title,) = [t for t in top.findobj(Text) if t.get_text().startswith("WAN use")]
    assert not legend.overlaps(title.get_window_extent(renderer))
