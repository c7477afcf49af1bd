"""`pddemu emulate`'s last step: the files of a run, and an exit status that tells a mismatch
or a partial run."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from metrics_samples import sample_instances, sample_records

from netem.topology import Network
from pddemu.config import load_config
from pddemu.emulate import (
    DEFECT_EXIT,
    INTERRUPTED_EXIT,
    PARTIAL_EXIT,
    WARMUP_FIELDS,
    SystemRun,
    dropped_events,
    dropped_events_warning,
    emulate,
    report,
    workload_of,
    write_outputs,
)
from pddemu.emulated_network import network_for, scale_model, wan_link
from pddemu.metrics.figure_inputs import measured_wan_use, split_warmup, wan_transfers


def write(
    records: list,
    out: Path,
    protocol_errors: int = 0,
    not_run: list[str] | None = None,
    **run_fields,
) -> int:
    config = load_config()
    scale = scale_model(config)
    run = SystemRun("pdd", records, {}, sample_instances(), protocol_errors, **run_fields)
    out.mkdir()
    runs = {"pdd": run}
    summaries, meta = write_outputs(
        config, scale, wan_link(config, scale), runs, not_run or [], out, ()
    )
    return report(summaries, meta, runs, out)


def test_a_token_mismatch_makes_the_exit_status_non_zero(tmp_path: Path) -> None:
    records = sample_records()
    assert sum(r.token_mismatch for r in records) == 1
    assert write(records, tmp_path / "mismatch") == DEFECT_EXIT
    summary = json.loads((tmp_path / "mismatch" / "summary.json").read_text())
    assert summary["systems"]["pdd"]["token_mismatches"] == 1


def test_failed_requests_are_results_not_an_error(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert any(r.state == "failed" for r in records)
    assert write(records, tmp_path / "clean") == 0
    rows = (tmp_path / "clean" / "requests.csv").read_text().splitlines()
    assert len(rows) == 1 + len(records)


def test_an_answer_the_replayer_could_not_read_is_a_defect(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert write(records, tmp_path / "unread", protocol_errors=1) == DEFECT_EXIT


def test_a_partial_run_is_written_marked_and_told_by_its_exit_status(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    reason = "MD0 died 3.0 modelled s into the replay: killed by SIGKILL"
    assert write(records, tmp_path / "partial", partial=[reason]) == PARTIAL_EXIT
    summary = json.loads((tmp_path / "partial" / "summary.json").read_text())
    assert summary["partial"] is True and summary["partial_reasons"] == {"pdd": [reason]}
    assert summary["systems"]["pdd"]["partial"] is True
    assert reason in (tmp_path / "partial" / "report.md").read_text()


def test_systems_not_run_make_the_run_partial(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert write(records, tmp_path / "first", not_run=["naive", "indc"]) == PARTIAL_EXIT
    summary = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert summary["partial"] is True and summary["systems_not_run"] == ["naive", "indc"]


def test_an_interrupted_run_exits_130_with_its_results(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    out = tmp_path / "interrupted"
    assert write(records, out, partial=["interrupted"], interrupted=True) == INTERRUPTED_EXIT
    assert json.loads((out / "summary.json").read_text())["systems"]["pdd"]["partial"] is True
    assert len((out / "requests.csv").read_text().splitlines()) == 1 + len(records)


def test_a_clean_run_is_not_partial(tmp_path: Path) -> None:
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    assert write(records, tmp_path / "clean") == 0
    summary = json.loads((tmp_path / "clean" / "summary.json").read_text())
    assert summary["partial"] is False and summary["systems"]["pdd"]["partial_reasons"] == []
    assert "Partial run" not in (tmp_path / "clean" / "report.md").read_text()


def test_a_timeline_that_dropped_events_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past its bound an instance's timeline drops its oldest events (the WAN figure reads MD's
    kv_transfer events): summary.json and the run's output say so; the exit status is unchanged."""
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    stats = {"MD0": {"events_dropped": 1234}, "P0": {"events_dropped": 0}, "FE0": {}}
    assert dropped_events(stats) == {"MD0": 1234}
    assert write(records, tmp_path / "dropped", events_dropped=dropped_events(stats)) == 0
    summary = json.loads((tmp_path / "dropped" / "summary.json").read_text())
    assert summary["systems"]["pdd"]["events_dropped"] == {"MD0": 1234}
    assert "timelines dropped their oldest events (MD0 1,234;" in capsys.readouterr().err
    assert "- pdd: MD0 dropped 1,234" in (tmp_path / "dropped" / "report.md").read_text()
    assert dropped_events_warning("pdd", {}) is None  # nothing said of a whole timeline


def test_warmup_requests_are_replayed_kept_in_the_csv_and_left_out_of_the_figures(
    tmp_path: Path,
) -> None:
    """The workload's first W requests are the warm-up (records in any order): replayed on top
    of the measured ones, in requests.csv, in no figure of summary.json."""
    synthetic = ['workload.trace="synthetic"']
    warm = load_config(None, [*synthetic, "workload.requests=3", "workload.warmup_requests=2"])
    five = workload_of(load_config(None, [*synthetic, "workload.requests=5"]))
    assert [r.request_id for r in workload_of(warm)] == [r.request_id for r in five]
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    scale = scale_model(warm)
    runs = {"pdd": SystemRun("pdd", records[::-1], {}, sample_instances(), 0)}
    out = tmp_path / "warm"
    out.mkdir()
    summaries, meta = write_outputs(warm, scale, wan_link(warm, scale), runs, [], out, {"r1", "r2"})
    assert meta["warmup_requests"] == 2
    assert summaries["pdd"]["requests"]["total"] == 3  # r3, r4, r5: r1 and r2 are the warm-up
    assert summaries["pdd"]["requests"]["failed"] == 1  # r4
    assert len((out / "requests.csv").read_text().splitlines()) == 1 + 5
    # every figure is the measured requests' alone, the warm-up's own figures are kept apart
    first_two, last_three = sorted(records, key=lambda r: r.arrival_s)[:2], records[2:]
    assert {r.request_id for r in first_two} == {"r1", "r2"}
    alone = {}
    for name, subset in (("alone-measured", last_three), ("alone-warm", first_two)):
        cold = load_config(None, [*synthetic, f"workload.requests={len(subset)}"])
        (tmp_path / name).mkdir()
        runs = {"pdd": SystemRun("pdd", subset, {}, sample_instances(), 0)}
        alone[name] = write_outputs(
            cold, scale, wan_link(cold, scale), runs, [], tmp_path / name, ()
        )
    expected = alone["alone-measured"][0]["pdd"]
    assert expected["warmup"] is None and summaries["pdd"]["warmup"] is not None
    assert {k: v for k, v in summaries["pdd"].items() if k != "warmup"} == {
        k: v for k, v in expected.items() if k != "warmup"
    }
    warm_alone = alone["alone-warm"][0]["pdd"]
    assert summaries["pdd"]["warmup"] == {key: warm_alone[key] for key in WARMUP_FIELDS}
    assert summaries["pdd"]["warmup"]["requests"]["total"] == 2
    saved = json.loads((out / "summary.json").read_text())["systems"]["pdd"]["warmup"]
    assert saved["requests"]["total"] == 2


def test_a_warmup_token_mismatch_is_a_defect_and_kept_in_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wrong token or a failure among the warm-up is no less a defect: the exit status and
    the run's output count it, summary.json's `warmup` holds it with its delivery record."""
    config = load_config(
        None, ['workload.trace="synthetic"', "workload.requests=3", "workload.warmup_requests=2"]
    )
    records = [replace(r, token_mismatch=r.request_id == "r1") for r in sample_records()]
    records[1] = replace(records[1], state="failed", failure_reason="timeout")  # r2
    scale = scale_model(config)
    runs = {"pdd": SystemRun("pdd", records, {}, sample_instances(), 0)}
    out = tmp_path / "warm-mismatch"
    out.mkdir()
    summaries, meta = write_outputs(
        config, scale, wan_link(config, scale), runs, [], out, {"r1", "r2"}
    )
    assert summaries["pdd"]["token_mismatches"] == 0  # the measured r3, r4, r5 are right
    assert report(summaries, meta, runs, out) == DEFECT_EXIT
    assert "2 failed requests (0 of them" in capsys.readouterr().err  # warm-up r2, measured r4
    warmup = json.loads((out / "summary.json").read_text())["systems"]["pdd"]["warmup"]
    assert warmup["token_mismatches"] == 1
    assert warmup["delivery"] == summaries["pdd"]["warmup"]["delivery"]
    assert "failover" in warmup


def test_the_wan_figure_draws_the_measured_requests_transfers_alone() -> None:
    """A warm-up's KV transfers are in no figure: the WAN figure keeps the measured requests'
    (a later leg's too) and times them from the first measured arrival."""
    kv = {"kind": "kv_transfer", "start_s": 0.0, "end_s": 1.0, "genuine_bytes": 10}
    stats = {
        "MD0": {"role": "MD", "events": [{**kv, "rid": "r1"}, {**kv, "rid": "r3~1"}]},
        "P0": {"role": "P", "events": [{**kv, "rid": "r4"}]},
    }
    transfers = wan_transfers(stats)
    assert [t.request_id for t in transfers] == ["r1", "r3"]
    records = [replace(r, token_mismatch=False) for r in sample_records()]
    _, measured = split_warmup(records, {"r1", "r2"})
    wan = measured_wan_use({"pdd": transfers}, {"pdd": measured}, 8e6, 1.0)
    assert [t.request_id for t in wan.transfers["pdd"]] == ["r3"]
    assert wan.origins == {"pdd": 2.0}  # r3's arrival, not r1's


def test_the_warmup_is_the_workloads_first_requests_in_its_own_order() -> None:
    """Not the first by (arrival, id): with equal arrival times "r10" sorts before "r2", and the
    ids need not sort at all; the workload's own order names the warm-up."""
    records = [
        replace(r, request_id=name, arrival_s=0.0)
        for r, name in zip(sample_records(), ["r10", "r2", "r1", "b", "a"], strict=True)
    ]
    workload_order = ["r1", "r2", "r10", "a", "b"]
    warm, measured = split_warmup(records, set(workload_order[:2]))
    assert [r.request_id for r in warm] == ["r2", "r1"]
    assert [r.request_id for r in measured] == ["r10", "b", "a"]
    assert split_warmup(records, ()) == ([], records)


@pytest.fixture
def own_signal_handlers() -> Iterator[None]:
    """emulate sets this process's SIGINT and SIGTERM handlers: put pytest's back."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def fake_system_runs(failing: str | None = None):  # noqa: ANN201 - a run_in_own_network
    """In place of each system's child work: its results, the first system's last (so the
    order they come in is not the systems' order), or `failing`'s exit status 1."""

    def run(system: str, *_args: object) -> SystemRun:
        if system == failing:
            raise SystemExit(1)
        time.sleep({"pdd": 0.6, "naive": 0.3}.get(system, 0.0))
        records = [replace(r, token_mismatch=False, system=system) for r in sample_records()]
        run = SystemRun(system, records, {}, sample_instances())
        run.phases_wall_s = {"replay": 1.0, "child_pid": os.getpid()}
        return run

    return run


def test_all_three_systems_at_once_are_written_in_their_order_as_they_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signal_handlers: None
) -> None:
    """`--system all`: each system's work in a process of its own, each checked and written as
    it comes; summary.json keeps the systems' order and says how they ran."""
    monkeypatch.setattr("pddemu.emulate.run_in_own_network", fake_system_runs())
    monkeypatch.setattr("pddemu.emulate.ReferenceCheck.check", lambda self, run: None)
    out = tmp_path / "at-once"
    assert emulate(load_config(), ["pdd", "naive", "indc"], out, []) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["systems"]) == ["pdd", "naive", "indc"]
    assert summary["systems_at_once"] is True and summary["systems_not_run"] == []
    pids = set()
    for system in summary["systems"].values():
        phases = system["phases_wall_s"]
        assert phases["replay"] == 1.0 and phases["reference_check"] >= 0
        pids.add(phases["child_pid"])
    assert len(pids) == 3 and os.getpid() not in pids


def test_a_system_whose_process_ends_without_results_is_named_and_fails_the_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    own_signal_handlers: None,
) -> None:
    monkeypatch.setattr("pddemu.emulate.run_in_own_network", fake_system_runs("naive"))
    monkeypatch.setattr("pddemu.emulate.ReferenceCheck.check", lambda self, run: None)
    out = tmp_path / "one-failed"
    assert emulate(load_config(), ["pdd", "naive", "indc"], out, []) == 1
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["systems"]) == ["pdd", "indc"]
    assert summary["systems_not_run"] == ["naive"] and summary["partial"] is True
    assert "the naive run ended without results (exit status 1)" in capsys.readouterr().err


class DrawnNetwork:
    """In place of an emulated network (never made): what it was built with, and how many
    replays drew from its WAN's random streams since they last started from its seed."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.seed = network.seed
        self.replays_drawn = 0

    def restart_draws(self) -> None:
        self.replays_drawn = 0


class NoLauncher:
    def __init__(self, *_args: object, **_kwargs: object) -> None: ...

    def __enter__(self) -> NoLauncher:
        return self

    def __exit__(self, *_exc: object) -> None: ...

    def close(self) -> None: ...


@contextmanager
def drawn_network_for(*args: object, **kwargs: object) -> Iterator[DrawnNetwork]:
    yield DrawnNetwork(network_for(*args, **kwargs))  # type: ignore[arg-type]


async def replay_drawing(system: str, _config: object, network: DrawnNetwork, *rest: object):  # noqa: ANN201
    """In place of a system's replay: writes the weather its WAN met (the network's links,
    TCP and seed, and how many replays drew before it), then draws from it."""
    out = rest[1]
    assert isinstance(out, Path)
    made = network.network
    met = {
        "links": repr((made.wan, made.intra, made.tcp, made.schedule, made.cross_traffic)),
        "seed": network.seed,
        "replays_drawn_before": network.replays_drawn,
    }
    network.replays_drawn += 1
    (out / f"weather-{system}.json").write_text(json.dumps(met))
    records = [replace(r, token_mismatch=False, system=system) for r in sample_records()]
    return SystemRun(system, records, {}, sample_instances())


def test_every_system_meets_the_same_wan_weather_at_once_or_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_signal_handlers: None
) -> None:
    """With one seed, each system's WAN (its links, and its loss and jitter draws from the
    seed's start) is the same run at once or one after another on one network, whatever
    systems run with it and in whatever order."""
    monkeypatch.setattr("pddemu.emulate.network_for", drawn_network_for)
    monkeypatch.setattr("pddemu.emulate.run_system", replay_drawing)
    monkeypatch.setattr("pddemu.emulate.Launcher", NoLauncher)
    monkeypatch.setattr("pddemu.emulate.ReferenceCheck.check", lambda self, run: None)
    monkeypatch.setattr("pddemu.emulate.write_outputs", lambda *_args: ({}, {}))  # not asked
    monkeypatch.setattr("pddemu.emulate.report", lambda *_args: 0)
    config = load_config(None, ["wan.jitter=3ms", "wan.loss=0.5%"]).with_workload(seed=7)
    met = {}
    for n, (systems, at_once) in enumerate(
        [
            (["pdd", "naive", "indc"], True),
            (["pdd", "naive", "indc"], False),
            (["indc", "naive", "pdd"], False),
            (["naive", "pdd"], True),
            (["naive"], False),
        ]
    ):
        out = tmp_path / f"run-{n}"
        assert emulate(config, systems, out, [], at_once=at_once) == 0
        for system in systems:
            met[(n, system)] = json.loads((out / f"weather-{system}.json").read_text())
    first = met[(0, "pdd")]
    assert first["seed"] == 7 and first["replays_drawn_before"] == 0
    assert {key: weather for key, weather in met.items() if weather != first} == {}
