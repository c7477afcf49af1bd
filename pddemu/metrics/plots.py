"""The run's figures, as PNG files: TTFT and ITL CDFs, one relayed request's token timeline and
the P-side / MD-side hit-rate histogram.

Figures are drawn on `matplotlib.figure.Figure` objects rendered by the Agg canvas: no pyplot, so
no global figure state and no display is needed. Every function writes one file and returns its
path; with nothing to draw it still writes a figure that says why it is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.records import RequestRecord
from pddemu.metrics.summary import HIT_BUCKETS, PDD_SYSTEM, pooled_itls
from pddemu.workload.stats import hit_bucket_labels, hit_buckets

DPI = 110
RLD_COLOUR = "tab:orange"
MD_COLOUR = "tab:blue"
STALL_COLOUR = "tab:red"

PLOT_FILES = {
    "TTFT CDF": "ttft_cdf.png",
    "ITL CDF": "itl_cdf.png",
    "Hit-rate buckets": "hit_rate_buckets.png",
    "Handoff timeline": "handoff_timeline.png",
}


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
        axes.xaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel(unit_label)
    axes.set_ylabel("fraction of samples")
    axes.set_ylim(0, 1.02)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right")


def plot_ttft_cdf(
    path: Path | str, records_by_system: Mapping[str, Sequence[RequestRecord]]
) -> Path:
    """CDF of TTFT (completed requests) per system, log x axis."""
    figure, axes = _figure()
    samples = {
        system: np.asarray([r.ttft_s for r in records if r.state == "completed"], dtype=np.float64)
        for system, records in records_by_system.items()
    }
    _cdf(axes, samples, "TTFT (modelled seconds, log scale)")
    axes.set_title("Time to first token")
    return _save(figure, path)


def plot_itl_cdf(
    path: Path | str, records_by_system: Mapping[str, Sequence[RequestRecord]]
) -> Path:
    """CDF of all inter-token gaps (completed requests) per system, log x axis: stalls are the
    far right tail."""
    figure, axes = _figure()
    samples = {
        system: pooled_itls(r for r in records if r.state == "completed")
        for system, records in records_by_system.items()
    }
    _cdf(axes, samples, "inter-token latency (modelled seconds, log scale)")
    axes.set_title("Inter-token latency")
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
    """Token index against time since arrival for one relayed request: tokens before the
    handoff (eager output of the RLD) and after it (MD) in two colours, the handoff as a line
    and the stream's largest gap shaded."""
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
    figure, axes = _figure()
    if record is None:
        _say_empty(axes, "no completed P->RLD->MD request with a handoff")
        axes.set_title("Handoff timeline")
        return _save(figure, path)
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
        label=f"handoff ({record.handoff_mode}, {record.handoff_rounds} round(s))",
    )
    gaps = np.diff(times)  # a handoff inside the stream leaves at least two tokens
    widest = int(np.argmax(gaps))
    axes.axvspan(
        times[widest],
        times[widest + 1],
        color=STALL_COLOUR,
        alpha=0.25,
        label=f"largest gap: {gaps[widest] * 1000:.1f} ms",
    )
    stall = record.handoff_stall_s
    stall_text = "not recorded" if stall is None else f"{stall * 1000:.1f} ms"
    axes.set_title(f"Request {record.request_id}: handoff stall {stall_text}")
    axes.set_xlabel("time since arrival (modelled seconds)")
    axes.set_ylabel("output token index")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left", fontsize="small")
    return _save(figure, path)


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
    out_dir: Path | str, records_by_system: Mapping[str, Sequence[RequestRecord]]
) -> dict[str, Path]:
    """Every standard figure of a run, titled as in `PLOT_FILES`; the timeline and histogram
    are drawn for pdd (or the first system when pdd did not run)."""
    if not records_by_system:
        raise MetricsError("no system to plot")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    focus = records_by_system.get(PDD_SYSTEM, next(iter(records_by_system.values())))
    files = {title: out_dir / name for title, name in PLOT_FILES.items()}
    return {
        "TTFT CDF": plot_ttft_cdf(files["TTFT CDF"], records_by_system),
        "ITL CDF": plot_itl_cdf(files["ITL CDF"], records_by_system),
        "Hit-rate buckets": plot_hit_rate_histogram(files["Hit-rate buckets"], focus),
        "Handoff timeline": plot_handoff_timeline(files["Handoff timeline"], focus),
    }
