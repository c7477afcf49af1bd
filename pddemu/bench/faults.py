"""`make bench-faults`: what each fault of issue 13's list does to a short pdd run.

Each scenario is one `pddemu emulate --system pdd` run, as a user starts it, of the same
workload with a faults file (`--faults`, modelled times from the replay's start) or a Ctrl-C:
the WAN down for 5 s mid-transfer, 5 % bursty (Gilbert-Elliott) loss, a 10x bandwidth drop,
SIGKILL of P, RLD and MD mid-run, SIGSTOP of MD for 3 s, and a Ctrl-C. Each is judged against
the same run without a fault: requests completed, failed (with their reasons) and lost (no end
state: must be 0), the modelled time from the fault to the router's first change of view
(detect) and to its first failover action, whether summary.json, requests.csv and report.md
were written, the processes and namespaces the run left (must be 0), and TTFT p99.
"""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from netem.registry import list_namespaces

REQUESTS = 12
ARRIVAL_RATE = 1.0  # requests per modelled second: the replay lasts about 12 modelled s
FAULT_AT_S = 4.0  # modelled seconds from the replay's start: requests are in flight
GE_LOSS = "gemodel:1.05%,20%"  # Gilbert-Elliott: mean loss p/(p+r) = 5 %, bursts of 1/r = 5
SCENARIOS: dict[str, str] = {
    "no fault": "",
    "WAN down 5 s mid-transfer": f"{FAULT_AT_S:g} link=down\n{FAULT_AT_S + 5:g} link=up\n",
    "5 % bursty loss": f"{FAULT_AT_S:g} loss={GE_LOSS}\n",
    "10x bandwidth drop": f"{FAULT_AT_S:g} rate=1gbit\n",  # the default WAN is 10 Gbit/s
    "SIGKILL of P": f"{FAULT_AT_S:g} kill=P0\n",
    "SIGKILL of RLD": f"{FAULT_AT_S:g} kill=RLD0\n",
    "SIGKILL of MD": f"{FAULT_AT_S:g} kill=MD0\n",
    "SIGSTOP of MD for 3 s": f"{FAULT_AT_S:g} pause=MD0,3s\n",
    "Ctrl-C": "",
}
CTRL_C_AFTER_REQUESTS = 4  # the Ctrl-C comes once this many requests are done
DONE = re.compile(r"(\d+)/\d+ done")  # the progress line
NOT_SENT = re.compile(r"(\d+) requests not sent")  # an interrupted replay's partial reason


def emulate(out: Path, faults: Path | None, interrupt: bool) -> tuple[int, float, str]:
    """One run; its exit status, wall seconds and the tail of its stderr."""
    command = [
        sys.executable,
        "-m",
        "pddemu.cli",
        "emulate",
        "--out",
        str(out),
        "--system",
        "pdd",
        "--requests",
        str(REQUESTS),
        "--set",
        f"workload.arrival_rate={ARRIVAL_RATE}",
        "--set",
        "request_timeout_s=120",
        *(["--faults", str(faults)] if faults else []),
    ]
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        done = DONE.search(line)
        if interrupt and done and int(done.group(1)) >= CTRL_C_AFTER_REQUESTS:
            process.send_signal(signal.SIGINT)
            interrupt = False
    status = process.wait()
    return status, time.monotonic() - started, "".join(seen)[-2000:]


def role_processes(out: Path) -> int:
    """Instance processes of the run writing to `out` still alive."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            count += b"pddemu.roles" in cmdline and str(out).encode() in cmdline
    return count


def left_behind(out: Path, timeout_s: float = 20.0) -> tuple[int, int]:
    """Processes and namespaces of the run still there (waiting up to `timeout_s` for them to
    go, as a kernel may take a moment to reap)."""
    namespaces = {json.loads(p.read_text())["netns"] for p in out.glob("specs/*/*.json")}
    deadline = time.monotonic() + timeout_s
    while True:
        left = (role_processes(out), len(namespaces & set(list_namespaces())))
        if left == (0, 0) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def first_after(rows: list[dict[str, Any]], at_s: float, prefix: str) -> float | None:
    """Modelled seconds from `at_s` to the first timeline row whose `what` starts with
    `prefix` (at or after it)."""
    times = [r["at_s"] for r in rows if r["what"].startswith(prefix) and r["at_s"] >= at_s]
    return round(min(times) - at_s, 3) if times else None


def judge(name: str, out: Path, status: int, wall_s: float) -> dict[str, Any]:
    written = {f: (out / f).is_file() for f in ("summary.json", "requests.csv", "report.md")}
    processes, namespaces = left_behind(out)
    result: dict[str, Any] = {
        "exit_status": status,
        "wall_s": round(wall_s, 1),
        "results_written": all(written.values()),
        "processes_left": processes,
        "namespaces_left": namespaces,
    }
    if not written["summary.json"]:
        return result
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["systems"]["pdd"]
    with (out / "requests.csv").open() as file:
        rows = list(csv.DictReader(file))
    reasons = Counter(r["failure_reason"] for r in rows if r["state"] != "completed")
    not_sent = sum(
        int(m.group(1))
        for reason in pdd["partial_reasons"]
        if (m := NOT_SENT.search(reason)) is not None
    )
    timeline = pdd.get("faults", {}).get("timeline", [])
    faults = [r for r in timeline if r["what"] in ("killed", "paused") and r["instance"]]
    links = [r for r in timeline if r["instance"].startswith(("wan", "intra"))]
    fault_at = faults[0]["at_s"] if faults else links[0]["at_s"] if links else None
    result.update(
        {
            "partial": summary["partial"],
            "requests": REQUESTS,
            "recorded": len(rows),
            "completed": pdd["requests"]["completed"],
            "failed": pdd["requests"]["failed"],
            "failure_reasons": dict(reasons),
            "not_sent": not_sent,  # a Ctrl-C came before their arrival time: never started
            "lost": REQUESTS - len(rows) - not_sent,
            "token_mismatches": pdd["token_mismatches"],
            "ttft_p99_s": pdd["ttft_s"]["p99"],
            "failover": pdd.get("failover"),
            "fault_at_s": fault_at,
            "detect_s": first_after(timeline, fault_at, "router:")
            if fault_at is not None
            else None,
            "fail_over_s": (
                first_after(timeline, fault_at, "failover:") if fault_at is not None else None
            ),
            "timeline": timeline,
        }
    )
    return result


def run(quick: bool = False) -> dict[str, Any]:
    """Every scenario (`quick`: the baseline, one kill and the Ctrl-C)."""
    names = list(SCENARIOS)
    if quick:
        names = ["no fault", "SIGKILL of MD", "Ctrl-C"]
    scenarios: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pddemu-bench-faults-") as scratch:
        for index, name in enumerate(names):
            out = Path(scratch) / f"run{index}"
            faults = None
            if SCENARIOS[name]:
                faults = Path(scratch) / f"faults{index}.txt"
                faults.write_text(SCENARIOS[name])
            print(f"bench faults: {name} ...", file=sys.stderr, flush=True)
            status, wall_s, tail = emulate(out, faults, interrupt=name == "Ctrl-C")
            scenarios[name] = judge(name, out, status, wall_s)
            scenarios[name]["faults_file"] = SCENARIOS[name]
            if not scenarios[name]["results_written"]:
                scenarios[name]["stderr_tail"] = tail
    baseline = scenarios["no fault"].get("ttft_p99_s")
    for result in scenarios.values():
        p99 = result.get("ttft_p99_s")
        result["ttft_p99_vs_no_fault"] = (
            round(p99 / baseline, 2) if p99 is not None and baseline else None
        )
    targets = {
        "lost_0": all(r.get("lost") == 0 for r in scenarios.values() if "lost" in r),
        "results_written": all(r["results_written"] for r in scenarios.values()),
        "nothing_left": all(
            r["processes_left"] == 0 and r["namespaces_left"] == 0 for r in scenarios.values()
        ),
        "instance_faults_detected_within_1_s": all(
            r.get("detect_s") is not None and r["detect_s"] <= 1.0
            for name, r in scenarios.items()
            if name.startswith(("SIGKILL", "SIGSTOP"))
        ),
    }
    return {
        "method": (
            f"pddemu emulate --system pdd --requests {REQUESTS} (default config, arrival rate "
            f"{ARRIVAL_RATE:g}/modelled s), a faults file per scenario at {FAULT_AT_S:g} modelled "
            f"s from the replay's start; the Ctrl-C once {CTRL_C_AFTER_REQUESTS} requests are "
            "done; run under the CPU lock (flock /work/.cpu.lock or CI's single job)"
        ),
        "scenarios": scenarios,
        "targets": targets,
    }
