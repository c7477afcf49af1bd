"""`pddemu sweep plot DIR --x KEY --y METRIC`: a summary field against a swept key.

One line per system and combination of the other swept keys; each marker is the mean over the
point's seeds, its error bar the seeds' range (lowest to highest). The x axis is the key's
checked value in base units (`wan.rate` in bit/s) when it is a number, else the values as
written, in the sweep's order. When the plotted points ran on more than one code version (a
sweep resumed on other code), the figure says so under its title and on stderr.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from pddemu.config import ConfigError
from pddemu.sweep.provenance import mixed_code_note
from pddemu.sweep.store import SWEEP_JSON, metric

DPI = 110


def load_entries(directory: Path) -> list[dict[str, Any]]:
    path = directory / SWEEP_JSON
    try:
        return json.loads(path.read_text())["points"]
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (not a sweep directory)") from None
    except (json.JSONDecodeError, KeyError, TypeError):
        raise ConfigError(f"{path}: not a sweep.json") from None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def finished_at(entries: list[dict[str, Any]], x: str) -> list[dict[str, Any]]:
    """The finished points that set `x`."""
    return [e for e in entries if x in e["settings"] and e["point"]["status"] == "done"]


def plotted(entries: list[dict[str, Any]], x: str, y: str) -> list[dict[str, Any]]:
    """The finished points a plot of `y` against `x` draws."""
    return [e for e in finished_at(entries, x) if _number(metric(e, y))]


def series(
    entries: list[dict[str, Any]], x: str, y: str
) -> dict[str, list[tuple[Any, float, float, float]]]:
    """{label: [(x, mean, low, high)]} over the finished points that have both fields."""
    if not any(x in e["settings"] for e in entries):
        swept = sorted({key for e in entries for key in e["settings"]})
        raise ConfigError(f"--x {x}: not a swept key; swept: {', '.join(swept) or 'none'}")
    numeric = all(_number(e["values"].get(x)) for e in entries if x in e["settings"])
    samples: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
    found_y = any(metric(e, y) is not None for e in finished_at(entries, x))
    for e in plotted(entries, x, y):
        others = ", ".join(f"{k}={v}" for k, v in e["settings"].items() if k != x)
        label = e["system"] + (f" ({others})" if others else "")
        samples[label][e["values"][x] if numeric else e["settings"][x]].append(float(metric(e, y)))
    if not found_y:
        raise ConfigError(f"--y {y}: no finished point has this field (e.g. ttft_s.p99, bcr)")
    return {
        label: [(at, sum(v) / len(v), min(v), max(v)) for at, v in by_x.items()]
        for label, by_x in samples.items()
    }


def plot_sweep(
    directory: Path,
    x: str,
    y: str,
    out: Path | None = None,
    logx: bool = False,
    logy: bool = False,
) -> Path:
    entries = load_entries(directory)
    lines = series(entries, x, y)
    mixed = mixed_code_note(plotted(entries, x, y))
    if mixed:
        print(f"pddemu sweep plot: {directory}: {mixed}", file=sys.stderr)
    figure = Figure(figsize=(7.0, 4.2), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    categories: list[Any] = []
    for points in lines.values():
        for at, *_ in points:
            if not _number(at) and at not in categories:
                categories.append(at)
    for label, points in sorted(lines.items()):
        points.sort(key=lambda p: categories.index(p[0]) if categories else p[0])
        xs = [categories.index(p[0]) if categories else p[0] for p in points]
        means = [p[1] for p in points]
        errors = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
        axes.errorbar(xs, means, yerr=errors, marker="o", capsize=3, label=label)
    axes.set_xscale("log" if logx else "linear")
    axes.set_yscale("log" if logy else "linear")
    if categories:
        axes.set_xticks(range(len(categories)), [str(c) for c in categories])
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    title = f"{y} against {x} (mean over seeds; bars: their range)"
    axes.set_title(title + (f"\n{mixed}" if mixed else ""), fontsize=10 if not mixed else 8)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    out = out or directory / f"{_file_part(y)}-vs-{_file_part(x)}.png"
    figure.savefig(out)
    return out


def _file_part(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
