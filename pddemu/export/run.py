"""A finished run's directory, read back for exports and plots: summary.json, requests.csv and
the instances' reports (instances-<system>.json, with their timeline events); requests.csv and
the instances' reports are read gzipped too (`run_file`)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pddemu.metrics.errors import MetricsError
from pddemu.metrics.outputs import (
    GZIP_DAMAGE,
    GZIP_SUFFIX,
    REQUESTS_FILE,
    SUMMARY_FILE,
    open_run_file,
    read_requests_csv,
)
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
    requests = run_file(run_dir, REQUESTS_FILE)
    if requests is None:
        raise ExportError(f"{run_dir / REQUESTS_FILE} is missing (nor is there a gzipped copy)")
    try:
        records = read_requests_csv(requests)
    except MetricsError as error:
        raise ExportError(str(error)) from None
    meta = {k: v for k, v in document.items() if k != "systems"}
    meta.setdefault(
        "date", time.strftime("%Y%m%d-%H%M%S", time.localtime(summary_path.stat().st_mtime))
    )
    runs = []
    for name in chosen:
        instances = _instances(run_file(run_dir, instances_file(name)))
        ours = sorted((r for r in records if r.system == name), key=lambda r: r.arrival_s)
        runs.append(SystemRun(name, document["systems"][name], ours, instances, meta))
    return runs


def instances_file(system: str) -> str:
    """The name of the file that keeps a system's instance reports."""
    return f"instances-{system}.json"


def run_file(run_dir: Path, name: str) -> Path | None:
    """The run directory's file `name`, else its gzipped copy (`name`.gz), else None."""
    for path in (run_dir / name, run_dir / f"{name}{GZIP_SUFFIX}"):
        if path.exists():
            return path
    return None


def _instances(path: Path | None) -> dict[str, dict[str, Any]]:
    """The instances' reports of one system (none for a run written before they were kept)."""
    if path is None:
        return {}
    try:
        with open_run_file(path) as handle:
            instances = json.load(handle)
    except json.JSONDecodeError as error:
        raise ExportError(f"{path}: not JSON: {error}") from None
    except GZIP_DAMAGE as error:
        raise ExportError(f"{path}: not a whole gzip file ({error})") from None
    except UnicodeDecodeError as error:
        raise ExportError(f"{path}: not UTF-8 text ({error})") from None
    if not isinstance(instances, dict):
        raise ExportError(f"{path}: expected an object of instance reports")
    return instances
