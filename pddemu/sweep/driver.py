"""Running points through an executor into a sweep directory, and the goodput search's rounds.

Points already finished in the directory are skipped; each point that ends is recorded at once
and sweep.json / sweep.csv rewritten, so an interrupted sweep keeps what it measured and a
rerun of the same command carries on where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import Any

from pddemu.sweep.executors import Job
from pddemu.sweep.points import Point, make_point
from pddemu.sweep.progress import Progress
from pddemu.sweep.restore import Earlier
from pddemu.sweep.search import GoodputSearch
from pddemu.sweep.store import SweepDir, entry

SEARCH_JSON = "search.json"
RATE_KEY = "workload.arrival_rate"
MISMATCH_EXIT = 3  # pddemu emulate's DEFECT_EXIT: a stream differs from the reference


class Sweep:
    def __init__(
        self,
        out: Path,
        executor: Any,
        meta: dict[str, Any],
        progress: Progress,
        earlier: Earlier | None = None,
    ) -> None:
        self.store = SweepDir(out)
        self.earlier = earlier  # --resume-from: an earlier sweep's finished points
        self.executor = executor
        self.meta = meta
        self.progress = progress
        self.order: list[Point] = []
        self.records: dict[str, dict[str, Any]] = {}

    def run(self, points: list[Point]) -> list[dict[str, Any] | None]:
        """Run what is not finished yet; every point's record (None: it never ran)."""
        jobs: dict[str, Job] = {}
        skipped = 0
        for point in points:
            if point.id in self.records or point.id in jobs:
                continue
            record = self.store.finished(point)
            if record is None and self.earlier is not None:
                earlier = self.earlier.record_for(point)
                record = None if earlier is None else self.store.restore(point, earlier)
            if record is not None:
                self.records[point.id] = record
                skipped += 1
            else:
                jobs[point.id] = Job(point, self.store.begin(point))
        self.order.extend(points)
        self.progress.add(len(jobs) + skipped, skipped)
        self.write()
        self.executor.run(list(jobs.values()), self._done, self._tick)
        return [self.records.get(point.id) for point in points]

    def _done(
        self, job: Job, exit_status: int, wall_s: float, provenance: dict[str, Any] | None
    ) -> None:
        record = self.store.finish(job.point, exit_status, wall_s, provenance=provenance)
        self.records[job.point.id] = record
        self.progress.point_done(failed=record["status"] == "failed")
        self.write()

    def _tick(self, running: int) -> None:
        if running != self.progress.running:
            self.progress.running = running
            self.progress.show()
        else:
            self.progress.tick()

    def write(self) -> None:
        self.store.write_results(self.meta, self.entries())

    def entries(self) -> list[dict[str, Any]]:
        return [entry(point, self.records.get(point.id)) for point in self.order]

    def exit_status(self) -> int:
        """1 when a point produced no results; else 3 when a point's emulation found a token
        mismatch (a defect outranks the rest); else the first non-zero exit status of a point
        (4: not valid, the emulator's lag over its bound, requests routed unmatched or the WAN
        too few packets per TCP flow; 5: partial results); else 0."""
        records = [self.records.get(point.id) for point in self.order]
        if any(record is None or record["status"] != "done" for record in records):
            return 1
        statuses = [r["exit_status"] for r in records if r and r["exit_status"]]
        return MISMATCH_EXIT if MISMATCH_EXIT in statuses else next(iter(statuses), 0)


@dataclass
class SearchGroup:
    """One search: a system under one combination of the grid's settings."""

    settings: dict[str, str]
    system: str
    search: GoodputSearch
    probe_points: dict[float, list[Point]]
    error: str = ""


def run_searches(
    sweep: Sweep,
    groups: list[SearchGroup],
    config_path: Path | None,
    base_overrides: list[str],
    seeds: list[int | None],
) -> list[dict[str, Any]]:
    """Probe every group's next rate (all groups' probes at once, so an executor with room
    runs them side by side) until every search is over; each group's result."""
    while True:
        round_points: list[Point] = []
        for group in groups:
            rate = None if group.error else group.search.next_rate()
            if rate is None:
                continue
            settings = {**group.settings, RATE_KEY: f"{rate:g}"}
            points = [
                make_point(config_path, base_overrides, settings, group.system, seed)
                for seed in seeds
            ]
            group.probe_points[rate] = points
            round_points += points
        if not round_points:
            break
        sweep.run(round_points)
        for group in groups:
            for rate, points in group.probe_points.items():
                if any(p.rate == rate for p in group.search.probes) or group.error:
                    continue
                records = [sweep.records.get(point.id) for point in points]
                if any(r is None or r["status"] != "done" for r in records):
                    group.error = f"the probe at {rate:g} req/s produced no results"
                    continue
                group.search.record(rate, mean(_attainment(r) for r in records))
        _write_search(sweep, groups)
    return _write_search(sweep, groups)


def _attainment(record: dict[str, Any]) -> float:
    value = record["summary"].get("slo_attainment")
    return 0.0 if value is None else float(value)


def group_result(sweep: Sweep, group: SearchGroup) -> dict[str, Any]:
    search = group.search
    result: dict[str, Any] = {
        "system": group.system,
        "settings": group.settings,
        "status": "error" if group.error else search.status,
        "error": group.error or None,
        "slo_attainment_target": search.target,
        "rate_start": search.start,
        "rate_lower": search.lower,
        "arrival_rate": search.passing,
        "bracket": [search.passing, search.failing],
        "probes": [
            {
                "arrival_rate": probe.rate,
                "slo_attainment": probe.attainment,
                "passed": probe.passed,
                "points": [point.id for point in group.probe_points[probe.rate]],
                "points_not_valid": sum(
                    sweep.records[point.id]["summary"].get("valid") is False
                    for point in group.probe_points[probe.rate]
                ),
            }
            for probe in sorted(search.probes, key=lambda p: p.rate)
        ],
    }
    if search.passing is not None:
        summaries = [
            sweep.records[point.id]["summary"] for point in group.probe_points[search.passing]
        ]
        for key in ("slo_attainment", "goodput_rps", "bcr", "cost_per_hour"):
            values = [s[key] for s in summaries if s.get(key) is not None]
            result[key] = mean(values) if values else None
            result[f"{key}_range"] = [min(values), max(values)] if values else None
    return result


def _write_search(sweep: Sweep, groups: list[SearchGroup]) -> list[dict[str, Any]]:
    results = [group_result(sweep, group) for group in groups]
    path = sweep.store.root / SEARCH_JSON
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(
        json.dumps({"search": sweep.meta.get("search"), "results": results}, indent=1)
    )
    temporary.replace(path)
    return results
