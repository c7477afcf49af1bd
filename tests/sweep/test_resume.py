"""Resuming a sweep: finished points are skipped, interrupted and failed ones redone, and
sweep.json / sweep.csv always say where each point stands. The executor here writes what a
`pddemu emulate` would (a summary.json) without emulating, so every path is checked in
milliseconds; tests/sweep/test_sweep_runs.py runs real points."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from pddemu.cli import main
from pddemu.sweep.driver import Sweep
from pddemu.sweep.executors import Job, SweepError
from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.progress import Progress
from pddemu.sweep.restore import Earlier


class ScriptedExecutor:
    """Runs a job by writing a summary.json (or nothing, for the ids in `fail`)."""

    def __init__(self, fail: set[str] = frozenset(), exit_status: int = 0, stop_after=None):
        self.fail = fail
        self.exit_status = exit_status
        self.stop_after = stop_after
        self.ran: list[str] = []

    def run(self, jobs: list[Job], done, tick) -> None:
        for job in jobs:
            if self.stop_after is not None and len(self.ran) == self.stop_after:
                raise KeyboardInterrupt
            tick(1)
            self.ran.append(job.point.id)
            assert job.out.name.endswith(".partial") and not any(job.out.iterdir())
            (job.out / "emulate.log").write_text("emulated\n")
            if job.point.id not in self.fail:
                summary = {
                    "system": job.point.system,
                    "slo_attainment": 1.0,
                    "ttft_s": {"p99": 0.5},
                    "dilation": {"speedup": 0.6, "timeline": [{"modelled_s": 0.0}]},
                }
                (job.out / "summary.json").write_text(
                    json.dumps({"systems": {job.point.system: summary}})
                )
            done(job, self.exit_status if job.point.id not in self.fail else 1, 0.25, None)


def points():
    return expand(None, [], parse_grid(["wan.delay=5ms,50ms"]), 1, ["pdd", "indc"])


def sweep(out: Path, executor: ScriptedExecutor) -> Sweep:
    return Sweep(out, executor, {"grid": {"wan.delay": ["5ms", "50ms"]}}, Progress())


def read(out: Path) -> dict:
    return json.loads((out / "sweep.json").read_text())


def test_finished_points_are_skipped(tmp_path: Path) -> None:
    first = ScriptedExecutor()
    done = sweep(tmp_path, first)
    done.run(points())
    assert len(first.ran) == 4 and done.exit_status() == 0
    result = read(tmp_path)
    assert [e["point"]["status"] for e in result["points"]] == ["done"] * 4
    entry = result["points"][0]
    assert entry["settings"] == {"wan.delay": "5ms"} and entry["values"] == {"wan.delay": 0.005}
    assert entry["system"] == "pdd" and entry["seed"] == 0 and entry["ttft_s"] == {"p99": 0.5}
    assert entry["dilation"] == {"speedup": 0.6}  # its time series stays in summary.json
    assert (tmp_path / entry["point"]["dir"] / "point.json").exists()
    with open(tmp_path / "sweep.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["wan.delay"] for row in rows] == ["5ms", "5ms", "50ms", "50ms"]
    assert rows[1]["system"] == "indc" and rows[1]["ttft_s.p99"] == "0.5"

    again = ScriptedExecutor()
    resumed = sweep(tmp_path, again)
    resumed.run(points())
    assert again.ran == [] and resumed.progress.skipped == 4
    assert read(tmp_path)["points"] == result["points"]


def test_an_interrupted_point_is_redone_from_scratch(tmp_path: Path) -> None:
    sweep(tmp_path, ScriptedExecutor()).run(points())
    interrupted = points()[2]
    finished = tmp_path / "points" / interrupted.id
    partial = finished.with_name(f"{interrupted.id}.partial")
    finished.rename(partial)  # as if the sweep died while this point ran
    (partial / "point.json").unlink()
    (partial / "half-written").write_text("x")
    again = ScriptedExecutor()
    sweep(tmp_path, again).run(points())
    assert again.ran == [interrupted.id]
    assert not partial.exists() and not (finished / "half-written").exists()
    assert (finished / "point.json").exists()


def test_an_interruption_keeps_what_was_measured(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        sweep(tmp_path, ScriptedExecutor(stop_after=1)).run(points())
    statuses = [e["point"]["status"] for e in read(tmp_path)["points"]]
    assert statuses == ["done", "pending", "pending", "pending"]
    again = ScriptedExecutor()
    sweep(tmp_path, again).run(points())
    assert again.ran == [p.id for p in points()[1:]]


def test_a_point_without_results_is_failed_and_redone(tmp_path: Path) -> None:
    broken = points()[1].id
    failing = sweep(tmp_path, ScriptedExecutor(fail={broken}))
    failing.run(points())
    assert failing.exit_status() == 1
    entry = read(tmp_path)["points"][1]
    assert entry["point"]["status"] == "failed" and "emulated" in entry["point"]["log_tail"]
    assert (tmp_path / "points" / f"{broken}.failed" / "emulate.log").exists()
    again = ScriptedExecutor()
    sweep(tmp_path, again).run(points())
    assert again.ran == [broken]
    assert not (tmp_path / "points" / f"{broken}.failed").exists()


def test_a_token_mismatch_is_a_result_and_the_sweep_says_so(tmp_path: Path) -> None:
    mismatched = sweep(tmp_path, ScriptedExecutor(exit_status=3))
    mismatched.run(points())
    assert mismatched.exit_status() == 3
    again = ScriptedExecutor()
    sweep(tmp_path, again).run(points())
    assert again.ran == []


def test_a_token_mismatch_outranks_a_point_that_was_not_valid(tmp_path: Path) -> None:
    """Exit 4 (the emulator's lag over its bound) of an earlier point does not hide a later
    point's mismatch."""
    runs = sweep(tmp_path, ScriptedExecutor(exit_status=4))
    runs.run(points())
    assert runs.exit_status() == 4
    runs.records[points()[-1].id]["exit_status"] = 3
    assert runs.exit_status() == 3


def test_one_emulation_asked_for_twice_runs_once(tmp_path: Path) -> None:
    """10gbit is the default rate: both settings name the same emulation."""
    same = expand(None, [], parse_grid(["wan.rate=10gbit,10000mbit"]), 1, ["naive"])
    executor = ScriptedExecutor()
    sweep(tmp_path, executor).run(same)
    assert len(executor.ran) == 1
    entries = read(tmp_path)["points"]
    assert [e["settings"]["wan.rate"] for e in entries] == ["10gbit", "10000mbit"]
    assert entries[0]["point"]["id"] == entries[1]["point"]["id"]


def test_an_interrupted_provenance_stamp_leaves_the_point_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume stamps points that recorded no code of their own with the sweep-level one,
    rewriting their point.json: interrupted halfway through that write, the next resume still
    finds the point finished, with its record whole."""
    code = {"commit": "1" * 40, "dirty": False}
    Sweep(tmp_path, ScriptedExecutor(), {"code": code}, Progress()).run(points())
    stamped = tmp_path / "points" / points()[0].id / "point.json"
    unstamped = json.loads(stamped.read_text())
    del unstamped["provenance"]
    stamped.write_text(json.dumps(unstamped))  # as a point finished before provenance was kept
    write_text = Path.write_text

    def interrupted(path: Path, text: str, *args, **kwargs) -> int:
        if "point.json" in path.name:
            write_text(path, text[: len(text) // 2], *args, **kwargs)
            raise KeyboardInterrupt
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Sweep(tmp_path, ScriptedExecutor(), {"code": code}, Progress()).run(points())
    monkeypatch.undo()
    again = ScriptedExecutor()
    Sweep(tmp_path, again, {"code": code}, Progress()).run(points())
    assert again.ran == []
    record = json.loads(stamped.read_text())
    assert record["summary"] == unstamped["summary"]
    assert record["provenance"]["code"] == code


@pytest.mark.parametrize("record", ["sweep.json", "point.json"])
def test_an_unreadable_record_is_named_with_what_to_do(tmp_path: Path, record: str) -> None:
    sweep(tmp_path, ScriptedExecutor()).run(points())
    path = (
        tmp_path / record
        if record == "sweep.json"
        else tmp_path / read(tmp_path)["points"][0]["point"]["dir"] / record
    )
    path.write_text('{"sweep": {"code": ')  # cut short by another program
    with pytest.raises(SweepError, match=f"{path}: not a readable record .*; (move|remove) "):
        sweep(tmp_path, ScriptedExecutor()).run(points())


def test_the_command_names_an_unreadable_sweep_json(tmp_path: Path, capsys) -> None:
    (tmp_path / "sweep.json").write_text("not json")
    status = main(["sweep", "--out", str(tmp_path), "--grid", "wan.delay=5ms", "--system", "pdd"])
    assert status == 1
    error = capsys.readouterr().err
    assert f"pddemu sweep: {tmp_path / 'sweep.json'}: not a readable record" in error
    assert not (tmp_path / "points").exists()  # nothing ran


def earlier_sweep(directory: Path, forget: str, same_ids: bool = False) -> list[dict]:
    """A finished sweep of `points()` as code without the config key `forget` had written it:
    each entry's resolved config lacks the key and (unless `same_ids`) its id differs."""
    sweep(directory, ScriptedExecutor()).run(points())
    data = read(directory)
    for entry in data["points"]:
        table, key = forget.rsplit(".", 1)
        node = entry["point"]["resolved"]
        for part in table.split("."):
            node = node[part]
        del node[key]
        if not same_ids:
            entry["point"]["id"] = entry["point"]["id"].replace("-seed0-", "-seed0-old")
    (directory / "sweep.json").write_text(json.dumps(data))
    return data["points"]


def test_an_earlier_sweeps_points_are_kept_where_new_keys_take_their_defaults(
    tmp_path: Path,
) -> None:
    """A key added since (wan.tcp_congestion, at its default) keeps every earlier point; the
    points are restored with their records, and a resumed sweep into the same directory then
    finds them finished."""
    old = earlier_sweep(tmp_path / "old", "wan.tcp_congestion")
    kept = ScriptedExecutor()
    now = Sweep(tmp_path / "new", kept, {}, Progress(), Earlier(tmp_path / "old"))
    now.run(points())
    assert kept.ran == [] and now.progress.skipped == 4 and now.exit_status() == 0
    entries = read(tmp_path / "new")["points"]
    assert [e["point"]["restored_from"]["id"] for e in entries] == [e["point"]["id"] for e in old]
    assert [e["point"]["id"] for e in entries] == [p.id for p in points()]
    assert entries[0]["ttft_s"] == {"p99": 0.5} and entries[0]["point"]["status"] == "done"
    again = ScriptedExecutor()
    sweep(tmp_path / "new", again).run(points())
    assert again.ran == []


def test_an_earlier_point_is_run_again_unless_it_is_the_same_emulation(tmp_path: Path) -> None:
    """A key the earlier entries lack that is not at its default (wan.delay_s, swept to 5 and
    50 ms against 20 ms), or one whose value differs (the jitter), or an entry that recorded no
    resolved config and whose id differs: run again. The same id is kept, recorded or not."""
    earlier_sweep(tmp_path / "delay", "wan.delay_s")
    ran = ScriptedExecutor()
    Sweep(tmp_path / "a", ran, {}, Progress(), Earlier(tmp_path / "delay")).run(points())
    assert ran.ran == [p.id for p in points()]

    earlier_sweep(tmp_path / "unrecorded", "wan.tcp_congestion")
    data = read(tmp_path / "unrecorded")
    for entry in data["points"]:
        del entry["point"]["resolved"]
    data["points"][0]["point"]["id"] = points()[0].id  # this one's id is still the same
    (tmp_path / "unrecorded" / "sweep.json").write_text(json.dumps(data))
    ran = ScriptedExecutor()
    Sweep(tmp_path / "b", ran, {}, Progress(), Earlier(tmp_path / "unrecorded")).run(points())
    assert ran.ran == [p.id for p in points()[1:]]

    earlier_sweep(tmp_path / "changed", "wan.tcp_congestion")
    data = read(tmp_path / "changed")
    for entry in data["points"]:  # a default changed since: the entries hold the old one
        entry["point"]["resolved"]["wan"]["jitter_s"] = 0.005
    (tmp_path / "changed" / "sweep.json").write_text(json.dumps(data))
    ran = ScriptedExecutor()
    Sweep(tmp_path / "c", ran, {}, Progress(), Earlier(tmp_path / "changed")).run(points())
    assert ran.ran == [p.id for p in points()]


def test_resume_from_names_a_missing_sweep(tmp_path: Path, capsys) -> None:
    status = main(
        ["sweep", "--grid", "wan.delay=5ms", "--out", str(tmp_path / "x")]
        + ["--resume-from", str(tmp_path / "nothing")]
    )
    assert status == 2
    assert "--resume-from: cannot read" in capsys.readouterr().err


EXPERIMENT = """
[experiment]
description = "two parts"
systems = ["pdd"]
seeds = 1
[part.first]
grid = { "wan.delay" = ["5ms"] }
[part.second]
grid = { "wan.delay" = ["50ms"] }
"""


def run_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, resume_from: Path
) -> tuple[int, ScriptedExecutor]:
    """`pddemu sweep --experiment` of EXPERIMENT's parts `first` and `second`, each point run
    by a ScriptedExecutor: the exit status and the executor."""
    experiment = tmp_path / "two-parts.toml"
    experiment.write_text(EXPERIMENT)
    executor = ScriptedExecutor()
    monkeypatch.setattr("pddemu.sweep.cli.make_executor", lambda args: executor)
    args = ["sweep", "--experiment", str(experiment), "--out", str(tmp_path / "new")]
    status = main([*args, "--resume-from", str(resume_from)])
    return status, executor


def test_a_part_the_earlier_sweep_lacks_runs_all_its_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """--resume-from DIR of an experiment whose part `second` was added since DIR was written
    (no DIR/second/sweep.json): part `first` is restored, `second` runs every point, and the
    command says so. On the code before, the sweep stopped at `second` (exit 2) after `first`
    had run."""
    old = tmp_path / "old"
    first = expand(None, [], parse_grid(["wan.delay=5ms"]), 1, ["pdd"])
    sweep(old / "first", ScriptedExecutor()).run(first)
    status, executor = run_experiment(tmp_path, monkeypatch, old)
    error = capsys.readouterr().err
    assert status == 0, error
    second = expand(None, [], parse_grid(["wan.delay=50ms"]), 1, ["pdd"])
    assert executor.ran == [p.id for p in second]
    assert f"no {old / 'second' / 'sweep.json'}: part second runs every point" in error
    assert read(tmp_path / "new" / "first")["points"][0]["point"]["restored_from"]


def test_resume_from_is_checked_for_every_part_before_the_first_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A part's earlier sweep.json that is not a sweep's is refused (exit 2) before any part
    runs, as is a --resume-from that is no directory at all. On the code before, part `first`
    (none of whose points the earlier sweep holds) ran, and then the sweep stopped at
    `second`."""
    old = tmp_path / "old"
    sweep(old / "first", ScriptedExecutor()).run(
        expand(None, [], parse_grid(["wan.delay=7ms"]), 1, ["pdd"])
    )
    (old / "second").mkdir()
    (old / "second" / "sweep.json").write_text("not json")
    status, executor = run_experiment(tmp_path, monkeypatch, old)
    error = capsys.readouterr().err
    assert (status, executor.ran) == (2, []), error
    assert f"--resume-from: {old / 'second' / 'sweep.json'} is not a sweep's" in error

    status, executor = run_experiment(tmp_path, monkeypatch, tmp_path / "nothing")
    error = capsys.readouterr().err
    assert (status, executor.ran) == (2, []), error
    assert f"--resume-from: {tmp_path / 'nothing'} is not a directory" in error
