"""`pddemu emulate` on a WAN with a scheduled outage and other tenants' traffic: every request
ends (completed, or failed with its reason), summary.json reports the cross-traffic, and
nothing of the run is left behind."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

from pddemu.deployment import HOST_OF_ROLE
from tests.roles.test_emulate_cli import (  # noqa: F401
    EMULATE_UNJUDGED,
    clean_start,
    role_processes,
    wait_clean,
)
from tests.run_logs import record_run

MARK = "PDDEMU_TEST_RUN"
SILENT = ("router: suspect", "router: down")  # the timeline's rows of an instance not heard


def across_the_wan(instance: str) -> bool:
    """Whether a timeline row's instance runs in the other DC than the router (a host's DC is
    its name's letter: hosts a and a2 are in A, b in B)."""
    role = instance.rstrip("0123456789")
    return role in HOST_OF_ROLE and HOST_OF_ROLE[role][0] != HOST_OF_ROLE["FE"][0]


def generators_of(run: str) -> set[int]:
    """Cross-traffic generators this run made: every process of the run inherits its
    environment, so the run's mark tells them from another run's on the same machine."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if b"netem.crosstraffic.generator" not in cmdline:
                    continue
                if f"{MARK}={run}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_an_outage_mid_replay_ends_every_request_and_leaves_nothing(
    clean_start: None,  # noqa: F811
    tmp_path: Path,
) -> None:
    schedule = tmp_path / "outage.schedule"
    # modelled seconds from the replay's start: the WAN is down from 1 s to 4 s, while the
    # first requests' KV is crossing it. Holds slow the clock past 1 % of frozen time: a clock
    # that holds let run fast meets TCP's wall-time timeouts across the outage (a lost SYN's
    # 1 s) as tens of modelled seconds of step lag (mean 16.9 s in one CI run at share 0.5)
    schedule.write_text("1 link=down\n4 link=up\n")
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    run = uuid.uuid4().hex
    stderr = tmp_path / "stderr"
    seen: set[int] = set()  # the run's generators, watched while it runs
    with stderr.open("w") as errors:
        emulate = subprocess.Popen(
            [
                *EMULATE_UNJUDGED,
                "--out",
                str(out),
                "--system",
                "pdd",
                "--requests",
                "4",
                "--set",
                "workload.arrival_rate=2.0",
                "--set",
                "scale.frozen_share=0.01",
                "--set",
                f"wan.schedule={str(schedule)!r}",
                "--set",
                "wan.cross_traffic.utilisation=0.3",
                "--set",
                'wan.cross_traffic.arrivals="paced"',
                "--set",
                'wan.cross_traffic.mean_size="20mb"',
            ],
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env={**os.environ, MARK: run},
        )
        try:
            deadline = time.monotonic() + 600
            while emulate.poll() is None and time.monotonic() < deadline:
                seen |= generators_of(run)
                time.sleep(0.2)
        finally:
            if emulate.poll() is None:
                emulate.kill()
            emulate.wait()
    assert emulate.returncode == 0, stderr.read_text()[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["systems"]["pdd"]
    assert pdd["requests"]["total"] == 4
    assert pdd["requests"]["completed"] + pdd["requests"]["failed"] == 4
    with open(out / "requests.csv") as handle:
        for row in csv.DictReader(handle):
            assert row["state"] in ("completed", "failed")
            assert row["state"] == "completed" or row["failure_reason"], row
    assert pdd["token_mismatches"] == 0
    # the outage is seen (1 s to 4 s of the replay): the router stopped hearing the instances
    # across the WAN while it was down, and heard from each again only once it was back. With
    # no outage the timeline has no row of the router's; a long request's e2e latency could
    # not show it (with no outage these four ran 6.7-17.0 s in one run). Only the instances
    # across the WAN are judged: one on the router's side may miss heartbeats on a slow host
    # (and be heard again) at any time, outage or not.
    timeline = pdd["faults"]["timeline"]
    across = [r for r in timeline if across_the_wan(r["instance"])]
    missed = [r for r in across if r["what"] in SILENT and 1.0 <= r["at_s"] < 4.0]
    assert missed, f"the router missed no instance across the WAN while it was down: {timeline}"
    heard = {}  # each instance across the WAN: when the router first heard it again after 1 s
    for r in across:
        if r["what"] == "router: up" and r["at_s"] >= 1.0:
            heard.setdefault(r["instance"], r["at_s"])
    assert heard, f"no instance across the WAN was heard from again: {timeline}"
    early = {name: at for name, at in heard.items() if at < 4.0}
    assert not early, f"heard from again before the WAN was back: {early}: {timeline}"
    cross = pdd["cross_traffic"]
    assert cross["flows"] > 0 and cross["bytes_genuine"] > 0 and cross["utilisation"] > 0
    assert cross["target_utilisation"] == 0.3
    assert summary["wan_modelled"]["schedule"] == str(schedule)
    assert wait_clean(out) == ([], [])
    assert seen, "the run's cross-traffic generator was never seen: the check would be blind"
    assert generators_of(run) == set()
