"""The sweep directory: per-point run directories, what resuming skips, sweep.json and sweep.csv.

    DIR/points/<id>/           a finished point: `pddemu emulate`'s files, emulate.log, point.json
    DIR/points/<id>.partial/   a point being run (or interrupted: removed and redone on resume)
    DIR/points/<id>.failed/    a point whose emulation produced no summary (redone on resume)
    DIR/sweep.json, sweep.csv  one entry per point of the latest sweep into DIR

A point's record (`point` in its entry) holds its `provenance`: the code, pddemu version, host
and load average it ran with. sweep.json's sweep-level `code` is the latest run's into DIR (a
resumed sweep's points may have run on other code); `point_codes` lists the code versions its
finished points ran on. A point finished before points recorded their own code takes, on
resume, the sweep-level code recorded until then, with `from` saying so.

A point is finished when its `pddemu emulate` wrote summary.json, whatever its exit status
(a token mismatch, exit 3, is a result to look at, not something to redo); point.json records
the status. The directory is renamed into place only then, so a crash at any moment leaves
either a finished point or one that will be redone.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pddemu.sweep.executors import SweepError
from pddemu.sweep.points import Point
from pddemu.sweep.provenance import code_versions, point_code
from pddemu.sweep.runner import EMULATE_LOG

POINTS_DIR = "points"
POINT_FILE = "point.json"
SWEEP_JSON = "sweep.json"
SWEEP_CSV = "sweep.csv"
SUMMARY_FILE = "summary.json"
LOG_TAIL_CHARS = 2000
FROM_SWEEP_LEVEL = "sweep-level code of an earlier run"
# Per-point time series kept in the point's summary.json only: the shared clock's dilation
# timeline is ~95 % of an entry, and sweep.json is committed (docs/reproduction/).
TIME_SERIES = {"dilation": "timeline"}


class SweepDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.points = root / POINTS_DIR
        self.earlier = _earlier_code(root)  # read before this run rewrites sweep.json

    def finished(self, point: Point) -> dict[str, Any] | None:
        """The record of a finished point, or None. A point finished before points recorded
        their own code is stamped (in point.json too) with the sweep-level code sweep.json
        held then, marked as such: the resumed run is about to overwrite that field."""
        path = self.points / point.id / POINT_FILE
        if not path.exists():
            return None
        record = _read_json(path, f"remove {path.parent} to run the point again")
        if "provenance" not in record and self.earlier is not None:
            record["provenance"] = {**self.earlier, "from": FROM_SWEEP_LEVEL}
            _replace(path, json.dumps(record, indent=1))
        return record

    def begin(self, point: Point) -> Path:
        """A clean directory for `point`'s run; what an earlier attempt left is removed."""
        for leftover in (self.partial(point), self.points / f"{point.id}.failed"):
            if leftover.exists():
                shutil.rmtree(leftover)
        self.partial(point).mkdir(parents=True)
        return self.partial(point)

    def restore(self, point: Point, record: dict[str, Any]) -> dict[str, Any]:
        """Take a finished point's record from elsewhere (an earlier sweep's sweep.json) as
        this directory's: what `finished` reads from now on."""
        directory = self.points / point.id
        directory.mkdir(parents=True, exist_ok=True)
        record = {**record, "dir": f"{POINTS_DIR}/{point.id}"}  # point.json alone
        (directory / POINT_FILE).write_text(json.dumps(record, indent=1))
        return record

    def partial(self, point: Point) -> Path:
        return self.points / f"{point.id}.partial"

    def finish(self, point: Point, exit_status: int, wall_s: float, **about: Any) -> dict[str, Any]:
        """Record the run in `begin`'s directory and move it into place; the point's record."""
        run = self.partial(point)
        summary_path = run / SUMMARY_FILE
        record: dict[str, Any] = {
            "id": point.id,
            "system": point.system,
            "seed": point.seed,
            "config": point.source,
            "exit_status": exit_status,
            "wall_s": wall_s,
            **about,
            "resolved": point.resolved,  # what --resume-from compares (pddemu/sweep/restore.py)
        }
        if summary_path.exists():
            summary = json.loads(summary_path.read_text())["systems"][point.system]
            record.update(status="done", dir=f"{POINTS_DIR}/{point.id}", summary=summary)
            (run / POINT_FILE).write_text(json.dumps(record, indent=1))
            run.rename(self.points / point.id)
        else:
            log = run / EMULATE_LOG
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else ""
            failed = self.points / f"{point.id}.failed"
            run.rename(failed)
            record.update(status="failed", dir=f"{POINTS_DIR}/{failed.name}", log_tail=tail)
        return record

    def write_results(self, meta: dict[str, Any], entries: list[dict[str, Any]]) -> None:
        """sweep.json and sweep.csv, each replaced whole (never half written)."""
        self.root.mkdir(parents=True, exist_ok=True)
        meta = {**meta, "point_codes": code_versions(entries)}
        _replace(self.root / SWEEP_JSON, json.dumps({"sweep": meta, "points": entries}, indent=1))
        rows = [flat_entry(entry) for entry in entries]
        columns = _columns(rows)
        temporary = self.root / f".{SWEEP_CSV}.tmp"
        with temporary.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(temporary, self.root / SWEEP_CSV)


def _earlier_code(root: Path) -> dict[str, Any] | None:
    """{"code": ...} as sweep.json's sweep level holds it, or None (no such field)."""
    path = root / SWEEP_JSON
    if not path.exists():
        return None
    meta = _read_json(path, "move it away to start the record afresh").get("sweep", {})
    return {"code": meta["code"]} if "code" in meta else None


def _read_json(path: Path, remedy: str) -> dict[str, Any]:
    """A record of the directory; SweepError naming the file and what to do when it cannot
    be read (this code writes them whole, but another program or a full disk may not)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SweepError(f"{path}: not a readable record ({error}); {remedy}") from None
    if not isinstance(record, dict):
        raise SweepError(f"{path}: not a record (a JSON object); {remedy}")
    return record


def entry(point: Point, record: dict[str, Any] | None) -> dict[str, Any]:
    """A point's entry in sweep.json: its settings, seed and system, then its summary's fields.
    `point` says how it ran (`status`: done, failed or pending)."""
    about = {"id": point.id, "status": "pending", "config": point.source}
    summary: dict[str, Any] = {}
    if record is not None:
        about.update({k: v for k, v in record.items() if k not in ("summary", "system", "seed")})
        summary = record.get("summary", {})
    return {
        "settings": dict(point.settings),
        "values": dict(point.values),
        "seed": point.seed,
        "system": point.system,
        "point": about,
        **{
            k: _without_time_series(k, v)
            for k, v in summary.items()
            if k not in ("settings", "values", "seed", "point")
        },
    }


def _without_time_series(key: str, value: Any) -> Any:
    if key in TIME_SERIES and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != TIME_SERIES[key]}
    return value


def flat_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """One CSV row: settings as their keys, nested fields as dotted names, lists left out;
    `code` is the code the point ran on (provenance.point_code), the loads are 1-minute ones."""
    row: dict[str, Any] = {key: value for key, value in entry["settings"].items()}
    about = entry["point"]
    provenance = about.get("provenance") or {}
    row.update(
        system=entry["system"],
        seed=entry["seed"],
        status=about["status"],
        exit_status=about.get("exit_status"),
        wall_s=about.get("wall_s"),
        point=about["id"],
        code=None if about["status"] == "pending" else point_code(entry),
        load_before=(provenance.get("load_before") or [None])[0],
        load_after=(provenance.get("load_after") or [None])[0],
    )
    skip = {"settings", "values", "seed", "system", "point"}
    for key, value in entry.items():
        if key not in skip:
            _flatten(key, value, row)
    return row


def metric(entry: dict[str, Any], name: str) -> Any:
    """A dotted field of an entry (`ttft_s.p99`), or None where it is absent."""
    node: Any = entry
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _flatten(prefix: str, value: Any, row: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, row)
    elif not isinstance(value, list):
        row[prefix] = value


def _columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)


def _replace(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
