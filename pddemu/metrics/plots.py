"""The run's figures, as PNG files, each meant to be read at a glance: TTFT's CDF with the SLO
and p50/p90/p99 marked; ITL as a complementary CDF on log axes (the rare stalls are the visible
tail, not a sliver at the top of a linear axis); one relayed request's token timeline with the
handoff zoomed in; the WAN's utilisation and its backlog (KV offered, not yet arrived) over
time; the P-side / MD-side hit-rate histogram.

Figures are drawn on `matplotlib.figure.Figure` objects rendered by the Agg canvas: no pyplot, so
no global figure state and no display is needed. Every function writes one file and returns its
path; with nothing to draw it still writes a figure that says why it is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.records import RequestRecord
from pddemu.metrics.summary import HIT_BUCKETS, PDD_SYSTEM, pooled_itls
from pddemu.workload.stats import hit_bucket_labels, hit_buckets

DPI = 110
RLD_COLOUR = "tab:orange"
MD_COLOUR = "tab:blue"
STALL_COLOUR = "tab:red"

SLO_COLOUR = "tab:red"
MARKS = (50, 90, 99)
MARK_SYMBOLS = {50: "o", 90: "s", 99: "^"}

PLOT_FILES = {
    "TTFT CDF": "ttft_cdf.png",
    "ITL CCDF": "itl_cdf.png",
    "Hit-rate buckets": "hit_rate_buckets.png",
    "Handoff timeline": "handoff_timeline.png",
    "WAN use": "wan_use.png",
}


@dataclass(frozen=True)
class WanTransfer:
    """One KV transfer across the WAN as its receiver saw it: its first and last byte and each
    chunk's arrival (modelled seconds, genuine bytes), and the request it was for (a warm-up's
    are left out of the figure)."""

    start_s: float
    end_s: float
    genuine_bytes: int
    chunks: Sequence[tuple[float, int]] = ()
    request_id: str = ""
    # its sender P's prefill steps for it (step end, modelled tokens computed), its leg's alone
    prefill_steps: Sequence[tuple[float, int]] = ()
    # when each part of it was offered to the WAN (modelled s, genuine bytes); empty: unknown
    offered: Sequence[tuple[float, int]] = ()


@dataclass(frozen=True)
class WanUse:
    """What the WAN figure needs of a run: each system's transfers, the time its requests began
    (times are drawn from there) and the link's scale."""

    transfers: Mapping[str, Sequence[WanTransfer]]
    origins: Mapping[str, float]  # per system: its first arrival, modelled seconds
    rate_bps: float | None  # the modelled WAN rate (None: unshaped)
    byte_scale: float  # genuine bytes per modelled byte


def _figure(width: float = 7.0, height: float = 4.2) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(figure)
    return figure, figure.add_subplot()


def _save(figure: Figure, path: Path | str) -> Path:
    path = Path(path)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def _say_empty(axes: Axes, message: str) -> None:
    axes.text(0.5, 0.5, message, ha="center", va="center", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _cdf(axes: Axes, samples: Mapping[str, np.ndarray], unit_label: str) -> None:
    """Empirical CDFs on a log time axis; non-positive samples cannot be placed and are counted."""
    drawn = False
    for system, values in samples.items():
        positive = np.sort(values[values > 0])
        dropped = values.size - positive.size
        label = f"{system} (n={values.size}" + (
            f", {dropped} at 0 s not shown)" if dropped else ")"
        )
        if positive.size == 0:
            axes.plot([], [], label=f"{system}: nothing to show")
            continue
        fraction = np.arange(0, positive.size + 1) / values.size + dropped / values.size
        axes.step(np.r_[positive[0], positive], fraction, where="post", label=label)
        drawn = True
    if drawn:
        axes.set_xscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        axes.xaxis.set_major_formatter(plain)
        positive = np.concatenate([v[v > 0] for v in samples.values()])
        if positive.max() / positive.min() < 100:  # under two decades: label 2 and 5 too
            axes.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            axes.xaxis.set_minor_formatter(plain)
        else:
            axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel(unit_label)
    axes.set_ylabel("fraction of samples")
    axes.set_ylim(0, 1.02)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right")


def _percentile_marks(axes: Axes, samples: Mapping[str, np.ndarray]) -> None:
    """p50 / p90 / p99 of each system as markers on its CDF, in the curve's colour."""
    colours = [line.get_color() for line in axes.get_lines()]
    for colour, values in zip(colours, samples.values(), strict=False):
        if not (values > 0).any():
            continue
        for q in MARKS:
            x = float(np.percentile(values, q))
            axes.plot([x], [q / 100], MARK_SYMBOLS[q], color=colour, ms=6, mec="black", mew=0.5)
    for q in MARKS:  # one legend entry per mark shape
        axes.plot([], [], MARK_SYMBOLS[q], color="grey", mec="black", mew=0.5, label=f"p{q}")


def plot_ttft_cdf(
    path: Path | str,
    records_by_system: Mapping[str, Sequence[RequestRecord]],
    slo_ttft_s: float | None = None,
) -> Path:
    """CDF of TTFT (completed requests) per system, log x axis, with each system's p50, p90
    and p99 marked and the SLO's TTFT target as a vertical line."""
    figure, axes = _figure()
    samples = {
        system: np.asarray([r.ttft_s for r in records if r.state == "completed"], dtype=np.float64)
        for system, records in records_by_system.items()
    }
    _cdf(axes, samples, "TTFT (modelled seconds, log scale)")
    axes.set_ylabel("share of completed requests")
    _percentile_marks(axes, samples)
    if slo_ttft_s is not None and any((v > 0).any() for v in samples.values()):
        axes.axvline(slo_ttft_s, color=SLO_COLOUR, ls="--", lw=1.2, label=f"SLO {slo_ttft_s:g} s")
    axes.legend(loc="lower right", fontsize="small", ncol=2)
    axes.set_title("Time to first token: share of requests served within x")
    return _save(figure, path)


def share_at_least(gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positive gaps in increasing order, and for each the share of all gaps (zeros
    included, which a log axis cannot show) at least that long."""
    positive = np.sort(gaps[gaps > 0])
    return positive, (positive.size - np.arange(positive.size)) / max(gaps.size, 1)


def plot_itl_cdf(
    path: Path | str, records_by_system: Mapping[str, Sequence[RequestRecord]]
) -> Path:
    """Complementary CDF of all inter-token gaps (completed requests) per system, both axes
    logarithmic: the share of gaps at least x long, so the steady decode cadence is the drop on
    the left and the rare stalls (handoffs, queueing) are the tail on the right."""
    figure, axes = _figure()
    drawn = False
    for system, gaps in (
        (system, pooled_itls(r for r in records if r.state == "completed"))
        for system, records in records_by_system.items()
    ):
        positive, at_least = share_at_least(gaps)
        if positive.size == 0:
            axes.plot([], [], label=f"{system}: nothing to show")
            continue
        zeros = gaps.size - positive.size
        label = f"{system} (n={gaps.size}, max {positive[-1] * 1e3:.0f} ms" + (
            f", {zeros} at 0 not shown)" if zeros else ")"
        )
        line = axes.step(positive * 1e3, at_least, where="post", label=label)
        p99 = float(np.percentile(gaps, 99)) * 1e3
        axes.plot([p99], [0.01], "^", color=line[0].get_color(), mec="black", mew=0.5)
        drawn = True
    if drawn:
        axes.set_xscale("log")
        axes.set_yscale("log")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        axes.xaxis.set_major_formatter(plain)
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value * 100:g} %"))
        axes.axhline(0.01, color="grey", lw=0.8, ls=":", label="1 % of gaps (p99, ▲)")
    else:
        _say_empty(axes, "no inter-token gaps")
    axes.set_xlabel("inter-token gap x (modelled ms, log scale)")
    axes.set_ylabel("share of gaps ≥ x (log scale)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower left", fontsize="small")
    axes.set_title("Inter-token latency: how often a gap is at least this long")
    return _save(figure, path)


def _handoff_inside_stream(record: RequestRecord) -> bool:
    """A handoff position with at least one token on each side of it."""
    position = record.handoff_position
    return position is not None and 0 < position < len(record.token_times_s)


def pick_handoff_request(records: Sequence[RequestRecord]) -> RequestRecord | None:
    """The completed P->RLD->MD request with a handoff inside its token stream and the largest
    recorded handoff stall (the first such, in record order, on a tie)."""
    candidates = [
        r
        for r in records
        if r.state == "completed" and r.pipeline == "P-RLD-MD" and _handoff_inside_stream(r)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda r: r.handoff_stall_s or 0.0)


def plot_handoff_timeline(
    path: Path | str, records: Sequence[RequestRecord], request_id: str | None = None
) -> Path:
    """`handoff_timeline_figure` written to `path`."""
    return _save(handoff_timeline_figure(records, request_id), path)


def handoff_timeline_figure(
    records: Sequence[RequestRecord], request_id: str | None = None
) -> Figure:
    """Token index against time since arrival for one relayed request: tokens before the
    handoff (eager output of the RLD) and after it (MD) in two colours, the handoff (MD's first
    delivered token) as a dashed line and the stream's largest gap shaded; below, a zoom on the
    handoff. The zoom is a panel of its own, not an inset: the top panel's lines cannot then run
    through it and read against its axis."""
    if request_id is None:
        record = pick_handoff_request(records)
    else:
        matches = [r for r in records if r.request_id == request_id]
        if not matches:
            raise MetricsError(f"no request {request_id!r} to draw")
        record = matches[0]
        if not _handoff_inside_stream(record):
            raise MetricsError(
                f"request {request_id!r} has no handoff inside its token times "
                f"(position {record.handoff_position}, {len(record.token_times_s)} token times)"
            )
    if record is None:
        figure, axes = _figure()
        _say_empty(axes, "no completed P->RLD->MD request with a handoff")
        axes.set_title("Handoff timeline")
        return figure
    figure = Figure(figsize=(7.0, 6.4), dpi=DPI)
    FigureCanvasAgg(figure)
    axes, zoom = figure.subplots(2, 1, height_ratios=(3, 2))
    times = np.asarray(record.token_times_s, dtype=np.float64) - record.arrival_s
    index = np.arange(times.size)
    position = int(record.handoff_position or 0)  # checked: inside the stream
    size = 6 if times.size <= 200 else 2
    axes.plot(
        times[:position],
        index[:position],
        ".",
        ms=size,
        color=RLD_COLOUR,
        label=f"before handoff: RLD eager output ({position} tokens)",
    )
    axes.plot(
        times[position:],
        index[position:],
        ".",
        ms=size,
        color=MD_COLOUR,
        label=f"after handoff: MD ({times.size - position} tokens)",
    )
    axes.axvline(
        times[position],
        color="black",
        lw=1,
        ls="--",
        label=f"handoff: MD's first token ({record.handoff_mode}, "
        f"{record.handoff_rounds} round(s))",
    )
    gaps = np.diff(times)  # a handoff inside the stream leaves at least two tokens
    widest = int(np.argmax(gaps))
    axes.axvspan(
        times[widest],
        times[widest + 1],
        color=STALL_COLOUR,
        alpha=0.25,
        label=f"largest gap: {gaps[widest] * 1000:.1f} ms, at {times[widest]:.2f} s",
    )
    axes.set_title(handoff_title(record))
    axes.set_xlabel("time since arrival (modelled seconds)")
    axes.set_ylabel("output token index")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
    _zoom_on_handoff(axes, zoom, times, position, record.tpot_s)
    figure.tight_layout()
    return figure


def handoff_title(record: RequestRecord) -> str:
    """The recorded stall, spelt out as the frontend computes it: the handoff's gap (between
    the relay's last delivered token and MD's first) minus the request's TPOT, at least 0."""
    stall, gap, tpot = record.handoff_stall_s, record.handoff_gap_s, record.tpot_s
    if stall is None or gap is None:
        return f"Request {record.request_id}: handoff stall not recorded"
    return (
        f"Request {record.request_id}: handoff stall {stall * 1000:.1f} ms\n"
        f"= max(0, handoff gap {gap * 1000:.1f} ms - TPOT {(tpot or 0.0) * 1000:.1f} ms)"
    )


def _zoom_on_handoff(
    axes: Axes, zoom: Axes, times: np.ndarray, position: int, tpot: float | None
) -> None:
    """A few typical gaps either side of the handoff, so the handoff's gap reads against the
    decode cadence, whatever the request's length; the zoomed span is boxed in `axes` (no
    connecting lines: they would cross `axes`' data)."""
    cadence = float(np.median(np.diff(times)))
    gap = times[position] - times[position - 1]
    half = max(3 * gap, 12 * cadence)
    low, high = times[position - 1] - half / 2, times[position] + half / 2
    shown = (times >= low) & (times <= high)
    index = np.arange(times.size)
    before, after = shown & (index < position), shown & (index >= position)
    zoom.plot(times[before], index[before], ".", ms=5, color=RLD_COLOUR)
    zoom.plot(times[after], index[after], ".", ms=5, color=MD_COLOUR)
    zoom.axvline(times[position], color="black", lw=1, ls="--")
    zoom.axvspan(times[position - 1], times[position], color=STALL_COLOUR, alpha=0.25)
    zoom.set_xlim(low, high)
    bottom, top = index[shown].min() - 1, index[shown].max() + 1
    zoom.set_ylim(bottom, top)
    zoom.yaxis.set_major_locator(MaxNLocator(integer=True))
    tpot_text = "TPOT not recorded" if tpot is None else f"TPOT {tpot * 1000:.1f} ms"
    zoom.set_title(
        f"Zoom on the handoff: gap {gap * 1000:.1f} ms from the RLD's last token to MD's first "
        f"({tpot_text})",
        fontsize="small",
    )
    zoom.set_xlabel("time since arrival (modelled seconds)")
    zoom.set_ylabel("output token index")
    zoom.grid(True, alpha=0.3)
    axes.indicate_inset((low, bottom, high - low, top - bottom), edgecolor="black")


def _bits_sent_by(
    transfers: Sequence[WanTransfer], times: np.ndarray, rate_bps: float | None, byte_scale: float
) -> np.ndarray:
    """Modelled bits on the link by each of `times`, reconstructed from the chunks' arrivals:
    every chunk sent as late as a link of `rate_bps` allows (one link per direction, shared by
    all transfers), so the curve never outruns the link and meets every arrival. Without a
    rate, the bits delivered by then."""
    arrivals = sorted(
        (at, 8 * genuine / byte_scale)
        for transfer in transfers
        for at, genuine in (transfer.chunks or [(transfer.end_s, transfer.genuine_bytes)])
    )
    at = np.asarray([a for a, _ in arrivals], dtype=np.float64)
    delivered = np.cumsum([bits for _, bits in arrivals])
    by_then = np.searchsorted(at, times, side="right")
    sent = np.where(by_then > 0, delivered[np.maximum(by_then - 1, 0)], 0.0)
    if rate_bps:
        later = at[None, :] >= times[:, None]
        ahead = np.where(later, delivered[None, :] - rate_bps * (at[None, :] - times[:, None]), 0)
        sent = np.maximum(sent, ahead.max(axis=1, initial=0.0))
    return sent


def wan_backlog(
    transfers: Sequence[WanTransfer], origin: float
) -> tuple[np.ndarray, np.ndarray, int]:
    """The WAN's backlog over time from `origin` (a step function's times and genuine bytes,
    from 0 s): the KV offered to the WAN (`WanTransfer.offered`) and not yet arrived at its
    receiver (`WanTransfer.chunks`). What is offered and what arrives at one instant are
    netted, so a part offered as another arrives is neither a dip nor a spike. A transfer
    whose offering is unknown cannot be placed: it is left out and counted (the third value),
    for the figure to say."""
    placed = [t for t in transfers if t.offered]
    moments = [(at - origin, size) for t in placed for at, size in t.offered] + [
        (at - origin, -size) for t in placed for at, size in t.chunks
    ]
    dates = np.asarray([at for at, _ in moments], dtype=np.float64)
    changes = np.asarray([size for _, size in moments], dtype=np.float64)
    instants, which = np.unique(dates, return_inverse=True)
    net = np.zeros(instants.size)
    np.add.at(net, which, changes)
    return np.r_[0.0, instants], np.cumsum(np.r_[0.0, net]), len(transfers) - len(placed)


def plot_wan_use(path: Path | str, wan: WanUse, bins: int = 100) -> Path:
    """`wan_use_figure` written to `path`."""
    return _save(wan_use_figure(wan, bins), path)


def wan_use_figure(wan: WanUse, bins: int = 100) -> Figure:
    """The WAN over the run, per system that crosses it: top, its utilisation (modelled bits
    of the KV chunks P->MD per modelled second over the modelled rate, `_bits_sent_by`);
    bottom, its backlog (`wan_backlog`) in modelled GB, with the seconds the modelled rate
    takes to carry it on the right. Times from each system's first arrival."""
    figure = Figure(figsize=(8.0, 5.2), dpi=DPI)
    FigureCanvasAgg(figure)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    spans = [t for transfers in wan.transfers.values() for t in transfers]
    if not spans:
        _say_empty(top, "no KV transfer crossed the WAN")
        bottom.set_axis_off()
        top.set_title("WAN use")
        return figure
    end = max(
        t.end_s - wan.origins.get(system, 0.0)
        for system, transfers in wan.transfers.items()
        for t in transfers
    )
    edges = np.linspace(0.0, max(end, 1e-3), bins + 1)
    width = edges[1] - edges[0]
    unplaced = 0  # transfers with no record of when their KV was offered, over every system
    for number, (system, transfers) in enumerate(wan.transfers.items()):
        style = {"ls": ("-", "--", ":")[number % 3], "lw": 2.2 - 0.6 * (number % 3)}
        origin = wan.origins.get(system, 0.0)
        if not transfers:
            continue
        sent = _bits_sent_by(transfers, edges + origin, wan.rate_bps, wan.byte_scale)
        rate = np.diff(sent) / width
        if wan.rate_bps:
            top.step(edges[:-1], rate / wan.rate_bps * 100, where="post", label=system, **style)
        else:
            top.step(edges[:-1], rate / 1e9, where="post", label=system, **style)
        times, backlog, unknown = wan_backlog(transfers, origin)
        unplaced += unknown
        label = system + (
            f": {unknown} transfer(s) with no record of when P offered their KV, not counted"
            if unknown
            else ""
        )
        bottom.step(times, backlog / wan.byte_scale / 1e9, where="post", label=label, **style)
    if wan.rate_bps:
        top.set_ylabel(f"utilisation of {wan.rate_bps / 1e9:g} Gbit/s (%)")
        top.axhline(100, color="grey", lw=0.8, ls=":")
    else:
        top.set_ylabel("KV rate (Gbit/s)")
    top.set_title(f"WAN use: KV sent P->MD, {bins} bins of {width:.2f} s", loc="left")
    top.grid(True, alpha=0.3)
    # above the axes, right of the title: inside, it hides part of a trace wherever it stands
    top.legend(
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        ncol=len(wan.transfers),
        fontsize="small",
        frameon=False,
        borderaxespad=0.2,
    )
    if unplaced:  # the figure says what it could not draw
        bottom.legend(loc="best", fontsize="small")
    bottom.set_ylabel("backlog: KV offered,\nnot yet at MD (GB)")
    bottom.set_ylim(bottom=0)
    if wan.rate_bps:  # the same backlog as the time the link takes to carry it
        line_time = bottom.secondary_yaxis(
            "right",
            functions=(
                lambda gb: gb * 8e9 / wan.rate_bps,
                lambda seconds: seconds * wan.rate_bps / 8e9,
            ),
        )
        line_time.set_ylabel(f"s at {wan.rate_bps / 1e9:g} Gbit/s")
    bottom.set_xlabel("time since the system's first arrival (modelled seconds)")
    bottom.grid(True, alpha=0.3)
    return figure


def plot_hit_rate_histogram(path: Path | str, records: Sequence[RequestRecord]) -> Path:
    """Share of requests per hit-rate bucket, P side (all requests) beside MD side (requests
    that reached an MD); the buckets are the trace statistics' seven."""
    labels = hit_bucket_labels()
    sides = {
        "P side": [(r.p_hit_tokens, r.input_tokens) for r in records],
        "MD side": [
            (r.md_hit_tokens, r.input_tokens) for r in records if r.md_hit_tokens is not None
        ],
    }
    figure, axes = _figure(8.0, 4.2)
    width = 0.4
    positions = np.arange(HIT_BUCKETS)
    for offset, (side, pairs) in zip((-width / 2, width / 2), sides.items(), strict=True):
        if pairs:
            hits, inputs = (
                np.asarray(column, dtype=np.int64) for column in zip(*pairs, strict=True)
            )
            counts = np.bincount(hit_buckets(hits, inputs), minlength=HIT_BUCKETS)
        else:
            counts = np.zeros(HIT_BUCKETS, dtype=np.int64)
        shares = counts / max(len(pairs), 1) * 100
        bars = axes.bar(positions + offset, shares, width, label=f"{side} (n={len(pairs)})")
        axes.bar_label(bars, labels=[str(c) for c in counts], fontsize="x-small")
    axes.set_xticks(positions, labels, rotation=20)
    axes.set_xlabel("prefix hit rate (hit tokens / input tokens)")
    axes.set_ylabel("share of requests (%); bar labels: counts")
    systems = sorted({r.system for r in records})
    axes.set_title("Prefix hit rate per request" + (f" ({', '.join(systems)})" if systems else ""))
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return _save(figure, path)


def write_plots(
    out_dir: Path | str,
    records_by_system: Mapping[str, Sequence[RequestRecord]],
    slo_ttft_s: float | None = None,
    wan: WanUse | None = None,
) -> dict[str, Path]:
    """Every standard figure of a run, titled as in `PLOT_FILES`; the timeline and histogram
    are drawn for pdd (or the first system when pdd did not run), the WAN figure when `wan`
    is given."""
    if not records_by_system:
        raise MetricsError("no system to plot")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    focus = records_by_system.get(PDD_SYSTEM, next(iter(records_by_system.values())))
    files = {title: out_dir / name for title, name in PLOT_FILES.items()}
    plots = {
        "TTFT CDF": plot_ttft_cdf(files["TTFT CDF"], records_by_system, slo_ttft_s),
        "ITL CCDF": plot_itl_cdf(files["ITL CCDF"], records_by_system),
        "Hit-rate buckets": plot_hit_rate_histogram(files["Hit-rate buckets"], focus),
        "Handoff timeline": plot_handoff_timeline(files["Handoff timeline"], focus),
    }
    if wan is not None:
        plots["WAN use"] = plot_wan_use(files["WAN use"], wan)
    return plots
