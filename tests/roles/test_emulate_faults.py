"""`pddemu emulate --faults FILE`: link events and instance faults on one timeline from the
replay's start, each with its effect in summary.json and report.md, every request ended and
nothing left behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import require_namespaces
from tests.roles.test_emulate_cli import EMULATE, wait_clean
from tests.run_logs import record_run

FAULTS = """# what the test's run goes through
1    a2b.rate=2gbit       # a bandwidth drop, one direction
2    kill=MD0
3    restart=MD0
5    kill=RLD7            # pdd has no RLD7: skipped, and said so
"""


def test_a_faults_file_runs_on_the_replays_timeline(tmp_path: Path) -> None:
    require_namespaces()
    faults = tmp_path / "faults.txt"
    faults.write_text(FAULTS)
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    done = subprocess.run(
        [
            *EMULATE,
            "--out",
            str(out),
            "--system",
            "pdd",
            "--requests",
            "6",
            "--set",
            "workload.arrival_rate=2.0",
            "--faults",
            str(faults),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads((out / "summary.json").read_text())
    pdd = summary["systems"]["pdd"]
    assert done.returncode == 0, done.stderr[-3000:]  # planned faults: complete, not partial
    assert pdd["requests"]["completed"] == 6 and pdd["token_mismatches"] == 0
    assert summary["faults"] == str(faults)
    kinds = [(f["action"], f["instance"]) for f in pdd["faults"]["scheduled"]]
    assert kinds == [("kill", "MD0"), ("restart", "MD0"), ("kill", "RLD7")]
    assert pdd["faults"]["link_events"][0]["actions"][0]["direction"] == "a2b"
    assert any("RLD7" in reason for reason in pdd["faults"]["skipped"])
    rows = pdd["faults"]["timeline"]
    seen = {(row["instance"], row["what"]) for row in rows}
    assert ("wan.a2b", "rate=2gbit") in seen
    assert {("MD0", "killed"), ("MD0", "restarted"), ("MD0", "router: down")} <= seen
    killed = next(row["at_s"] for row in rows if row["what"] == "killed")
    assert 2.0 <= killed < 3.0  # modelled seconds from the replay's start
    report = (out / "report.md").read_text()
    assert "## Timeline" in report and "router: down" in report
    assert wait_clean(out) == ([], [])
