"""`pddemu plot`: a run's figures drawn again from its directory, as `pddemu emulate` drew them
at the end of the run.

    pddemu plot RUN_DIR [--system S] [--out DIR]

The figures are drawn from requests.csv (every request's record, its token times included),
summary.json (the SLO, the WAN's modelled rate, the byte scale, the warm-up's request ids) and,
for the WAN figure, the KV transfers MD recorded (instances-<system>.json of each system whose
KV crosses the WAN). requests.csv and the instances files are read gzipped too (requests.csv.gz,
as the reference runs in docs/reference-run are kept). --system draws one system's figures
alone; --out writes them to DIR instead of RUN_DIR.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pddemu.config import SYSTEMS
from pddemu.help_format import HelpFormatter

if TYPE_CHECKING:  # matplotlib and the run's readers are imported when the command runs
    from pddemu.metrics.plots import WanUse
    from pddemu.metrics.records import RequestRecord


class PlotError(ValueError):
    """A run directory whose figures cannot be drawn: what it lacks, named."""


@dataclass(frozen=True)
class FigureInputs:
    """Everything `write_plots` draws from."""

    measured: dict[str, list[RequestRecord]]  # per system, the warm-up left out
    slo_ttft_s: float
    wan: WanUse


def figure_inputs(run_dir: Path, system: str | None = None) -> FigureInputs:
    """A run directory's figure inputs (every system's, or `system`'s alone), or a PlotError
    naming the file or key it lacks."""
    from pddemu.export.run import instances_file, read_run, run_file
    from pddemu.metrics.figure_inputs import (
        crosses_the_wan,
        measured_wan_use,
        split_warmup,
        wan_transfers,
    )
    from pddemu.metrics.outputs import REQUESTS_FILE, SUMMARY_FILE

    if not run_dir.is_dir():
        raise PlotError(f"{run_dir}: no such directory (a pddemu emulate --out)")
    if run_file(run_dir, REQUESTS_FILE) is None:
        raise PlotError(
            f"{run_dir / REQUESTS_FILE} is missing (nor is there a gzipped copy): every figure "
            f"is drawn from the requests' records"
        )
    runs = read_run(run_dir, system, allow_all=True)
    summary = run_dir / SUMMARY_FILE
    warmup_ids = _warmup_ids(runs[0].meta, summary)
    measured = {run.system: split_warmup(run.records, warmup_ids)[1] for run in runs}
    transfers = {}
    for run in runs:
        instances = instances_file(run.system)
        if crosses_the_wan(run.system) and run_file(run_dir, instances) is None:
            raise PlotError(
                f"{run_dir / instances} is missing (nor is there a gzipped copy): the WAN figure "
                f"is drawn from the KV transfers {run.system}'s MD instances recorded there"
            )
        transfers[run.system] = wan_transfers(run.instances)
    return FigureInputs(
        measured,
        float(_entry(runs[0].summary, summary, runs[0].system, "slo", "ttft_s")),
        measured_wan_use(
            transfers,
            measured,
            _entry(runs[0].meta, summary, None, "wan_modelled", "rate_bps"),
            float(_entry(runs[0].summary, summary, runs[0].system, "scale", "byte_scale")),
        ),
    )


def _warmup_ids(meta: Mapping[str, Any], summary: Path) -> frozenset[str]:
    """The warm-up's request ids (none when the run had no warm-up)."""
    if not meta.get("warmup_requests"):
        return frozenset()
    if "warmup_request_ids" not in meta:
        raise PlotError(
            f"{summary} has no warmup_request_ids (runs before 2026-12-02 do not keep them): "
            f"its {meta['warmup_requests']} warm-up requests cannot be told from the measured ones"
        )
    return frozenset(meta["warmup_request_ids"])


def _entry(document: Mapping[str, Any], path: Path, system: str | None, *keys: str) -> Any:
    """document[keys[0]][keys[1]]..., or a PlotError naming the file and the key."""
    value: Any = document
    for depth, key in enumerate(keys):
        if not isinstance(value, Mapping) or key not in value:
            where = ".".join(([f"systems.{system}"] if system else []) + list(keys[: depth + 1]))
            raise PlotError(f"{path} has no {where}: the figures need it")
        value = value[key]
    return value


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="draw a run's figures again from its directory",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a pddemu emulate --out")
    parser.add_argument("--system", choices=SYSTEMS, help="draw this system's figures alone")
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="directory for the figures (default: RUN_DIR)"
    )
    parser.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    from pddemu.metrics.plots import write_plots

    inputs = figure_inputs(args.run_dir, args.system)
    plots = write_plots(args.out or args.run_dir, inputs.measured, inputs.slo_ttft_s, inputs.wan)
    print(f"wrote {', '.join(str(path) for path in plots.values())}")
    return 0
