"""A real run is judged by the WAN's packets per TCP flow (`pddemu.metrics.wan_flows`): six
concurrent naive transfers on a 1 Gbit/s WAN, whose emulated path holds 4.2 packets, leave their
flows a fair share under the 4 packets fast retransmit needs while the queue drops: not valid
(exit 4, summary.json's `wan_flows` and `invalid_reason` say so); the same requests on the
default 10 Gbit/s WAN (41.7 packets) fit, and the run is valid. Lag is not judged here
(`scale.max_lag` 1000): only the flows decide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_namespaces
from tests.run_logs import record_run

SIX_AT_ONCE = [
    "--system=naive",
    "--trace=synthetic",
    "--requests=6",
    "--set=workload.arrival_rate=6",
    "--set=workload.synthetic_input_tokens=4096",
    "--set=workload.synthetic_output_tokens=16",
    "--set=workload.synthetic_hit_rate=0",
    "--set=policy.drc=false",
    "--set=scale.max_lag=1000",
    "--set=scale.frozen_share=0.5",
]


@pytest.mark.parametrize(("rate", "flagged"), [("1gbit", True), ("10gbit", False)])
def test_a_run_whose_wan_starves_its_flows_is_not_valid(
    tmp_path: Path, rate: str, flagged: bool
) -> None:
    require_namespaces()
    out = tmp_path / "run"
    record_run(out)  # a failure shows its role logs (tests/run_logs.py)
    done = subprocess.run(
        [sys.executable, "-m", "pddemu.cli", "emulate", f"--out={out}", *SIX_AT_ONCE]
        + [f"--set=wan.rate={rate}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = json.loads((out / "summary.json").read_text())["systems"]["naive"]
    flows = summary["wan_flows"]
    assert done.returncode == (4 if flagged else 0), done.stderr
    assert flows["directions"]["a2b"]["flows_peak"] >= (2 if flagged else 1)
    assert (flows["starved_share"] > flows["starved_share_max"]) is flagged
    assert summary["valid"] is not flagged
    if flagged:
        assert flows["path_packets"] == pytest.approx(4.17, abs=0.01)
        assert summary["invalid_reason"].startswith("the emulated WAN left TCP too few packets")
        assert "the emulated WAN left TCP too few packets per flow" in done.stderr
    else:
        assert flows["path_packets"] == pytest.approx(41.67, abs=0.01)
        assert flows["share_min_packets"] >= 4 and summary["invalid_reason"] is None
    windows = json.loads((out / "wan-flows-naive.json").read_text())
    assert max(windows["a2b"]["flows"]) == flows["directions"]["a2b"]["flows_peak"]
