"""A finished run's directory, read back for exports: summary.json, requests.csv and the
instances' reports (instances-<system>.json, with their timeline events)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.outputs import REQUESTS_FILE, SUMMARY_FILE, read_requests_csv
from pddemu.metrics.records import RequestRecord


class ExportError(ValueError):
    """A run directory that cannot be exported as asked."""


@dataclass(frozen=True)
class SystemRun:
    """One system of a run: its summary, its requests in arrival order, its instances."""

    system: str
    summary: dict[str, Any]
    records: list[RequestRecord]
    instances: dict[str, dict[str, Any]]  # name -> /stats report (role, events, ...)
    meta: dict[str, Any]  # the run's summary.json outside "systems" (config, trace, ...)


def read_run(run_dir: Path, system: str | None, allow_all: bool = False) -> list[SystemRun]:
    """The run's systems: the one named, or (`allow_all`) every one; with neither, the run's
    only system (a run of several must be told which)."""
    summary_path = run_dir / SUMMARY_FILE
    try:
        document = json.loads(summary_path.read_text())
    except OSError as error:
        raise ExportError(
            f"{summary_path}: {error.strerror} (is {run_dir} a run's directory?)"
        ) from None
    except json.JSONDecodeError as error:
        raise ExportError(f"{summary_path}: not JSON: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("systems"), dict):
        raise ExportError(f"{summary_path}: no 'systems' object: not a pddemu run's summary")
    systems = list(document["systems"])
    if system is not None and system not in systems:
        raise ExportError(f"{run_dir} has no system {system!r}; it has {', '.join(systems)}")
    if system is None and not allow_all and len(systems) != 1:
        raise ExportError(f"{run_dir} holds {', '.join(systems)}: choose one with --system")
    chosen = [system] if system is not None else systems
    try:
        records = read_requests_csv(run_dir / REQUESTS_FILE)
    except MetricsError as error:
        raise ExportError(str(error)) from None
    meta = {k: v for k, v in document.items() if k != "systems"}
    meta.setdefault(
        "date", time.strftime("%Y%m%d-%H%M%S", time.localtime(summary_path.stat().st_mtime))
    )
    runs = []
    for name in chosen:
        instances = _instances(run_dir / f"instances-{name}.json")
        ours = sorted((r for r in records if r.system == name), key=lambda r: r.arrival_s)
        runs.append(SystemRun(name, document["systems"][name], ours, instances, meta))
    return runs


def _instances(path: Path) -> dict[str, dict[str, Any]]:
    """The instances' reports of one system (none for a run written before they were kept)."""
    if not path.exists():
        return {}
    try:
        instances = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ExportError(f"{path}: not JSON: {error}") from None
    if not isinstance(instances, dict):
        raise ExportError(f"{path}: expected an object of instance reports")
    return instances
