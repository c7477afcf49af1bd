"""NVIDIA AIPerf, as its users run it, against `pddemu serve` with the exported tokenizer.

AIPerf is installed in its own venv (`.venv-aiperf`, by `make test`'s install step, pinned in
the Makefile) so that its dependencies never touch the project's. It loads the exported
tokenizer with transformers, drives the host-side port, and its TTFT of each request must
contain the emulator's own record of it on the host's one clock (`client_timing`: exact, not a
tolerance that a loaded machine breaks); the tokens it counts in the text it received must equal
what the server's usage says. Each record says what its client was served beside what was
modelled (`door`: the door's TTFT, the first token's lateness beyond its modelled time, of which
its instance sent it late, as a step's genuine work outlasting its modelled length does in real
time).

The issue's bound, AIPerf's TTFT p50 within 5 ms of pddemu's records, is asserted with both
timed from the same instant, where AIPerf's clock starts: its stamp of each request
(`start_perf_ns`, on the host's one clock) to the door's record of writing that request's first
chunk (`door.first_chunk_s`), whose p50 is compared with AIPerf's TTFT p50
(`difference_from_send_ms`). The wait before the door (AIPerf's taking a connection and writing
the request, the loopback, the frontend's reading of it: aiohttp reads the connection without
the kernel's receive time, so no record of pddemu's can date it) is then in both figures alike,
however long a loaded host makes it, and so are the modelled TTFT and the first token's
lateness: what the bound judges is whether the records date the first token where AIPerf got it,
the chunk's way from the door's write to AIPerf's read (the frontend's write, the loopback,
AIPerf's reading and parsing). What lies between AIPerf's stamp and the door's write is judged
exactly, request by request, not by a bound: the door received the request after AIPerf stamped
it and wrote the first chunk no earlier than the modelled TTFT after. The door's own TTFT
(`door.ttft_s`, receipt to first write) against AIPerf's is printed (`difference_served_ms`),
not asserted: it also carries the wait before the door, and the p50s' difference is what the
requests at the median's rank waited there: beside two processes spinning one core each it was
over 5 ms in 5 of 6 runs (4.7-43.9 ms) where the bound asserted here held in all 6 (0.2-4.2 ms;
README, "Benchmark clients against `pddemu serve`"). The modelled TTFT's p50 is printed beside
it, not asserted: in real time a step whose genuine work outlasts its modelled length sends its
token late, which the client sees and the modelled TTFT does not.
Asserted exactly as well: each client's TTFT contains the door's, and the first token's instance
sent it no later than the door wrote it, beyond its modelled time (that the door's TTFT is the
modelled one plus that lateness is tests/roles/test_openai_front_door.py's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from netem.registry import list_namespaces
from pddemu.bench.aiperf import (
    CONCURRENCY,
    OSL,
    REQUESTS,
    TARGET_MS,
    WARMUP,
    Profile,
    aiperf_command,
    compare,
    run_aiperf,
    streamed_text,
)
from pddemu.config import load_config
from pddemu.model import ByteTokenizer
from pddemu.serve import SERVE_CONFIG
from tests.conftest import require_namespaces
from tests.roles.client_timing import (
    ROUNDING_S,
    outside_the_emulator_s,
    where_the_difference_goes,
)

ROOT = Path(__file__).resolve().parents[2]
AIPERF_VENV = ROOT / ".venv-aiperf"


def aiperf_venv() -> Path:
    if (AIPERF_VENV / "bin" / "aiperf").exists():
        return AIPERF_VENV
    if os.environ.get("CI") == "true":
        pytest.fail("AIPerf is not installed: `make test` installs it in .venv-aiperf")
    pytest.skip("AIPerf is not installed (make aiperf)")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    require_namespaces()
    venv = aiperf_venv()
    run_dir = tmp_path_factory.mktemp("serve")
    process = subprocess.Popen(
        [sys.executable, "-m", "pddemu.cli", "serve", "--port", "0", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line, process.stderr.read()
    ready = json.loads(line)
    yield venv, ready
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    stopped = json.loads(out.splitlines()[-1])  # judged as emulate judges its lag
    assert stopped["valid"] == (stopped["invalid_reason"] is None)
    served = REQUESTS + WARMUP  # AIPerf's warm-up requests are served too
    assert 0 <= stopped["late_requests"]["count"] <= stopped["late_requests"]["of"] == served
    run = ready["netns"].rsplit("-", 1)[0]  # this run's namespaces: <run>-a, <run>-b, ...
    assert not [n for n in list_namespaces() if n.startswith(run + "-")], "serve left some"


def test_the_exported_tokenizer_loads_offline_in_transformers(tmp_path: Path) -> None:
    """Needs AIPerf's venv (for transformers), not a server: runs without namespaces too."""
    venv = aiperf_venv()
    directory = tmp_path / "tokenizer"
    subprocess.run(
        [sys.executable, "-m", "pddemu.cli", "tokenizer", "export", str(directory)], check=True
    )
    samples = ["abc", "héllo wörld ✓ 日本語", " two  spaces\n\ttab", "<|bos|> as text"]
    script = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "t = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "samples = json.loads(sys.argv[2])\n"
        "print(json.dumps([t.encode(s) for s in samples]))\n"
        "print(json.dumps([t.decode(t.encode(s), skip_special_tokens=True) for s in samples]))\n"
    )
    offline = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [venv / "bin" / "python", "-c", script, str(directory), json.dumps(samples)],
        capture_output=True,
        text=True,
        env=offline,
        check=True,
    ).stdout.splitlines()
    ours = ByteTokenizer()
    assert json.loads(out[0]) == [ours.encode(s) for s in samples]
    assert json.loads(out[1]) == samples


def test_aiperf_agrees_with_the_emulator(served: Any, tmp_path: Path) -> None:
    """What AIPerf counts and times contains pddemu's records, request by request, the records
    account for the TTFT they served, and AIPerf's TTFT p50 is within the issue's 5 ms of the
    records' first writes timed from AIPerf's stamps (see the module's docstring)."""
    venv, ready = served
    artifacts = tmp_path / "aiperf"
    command = aiperf_command(venv / "bin" / "aiperf", ready, artifacts)
    done, left = run_aiperf(command)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    profile = Profile(artifacts)
    # AIPerf's scratch directory was made in the run's own TMPDIR (removed with it), not here
    scratch = f"aiperf_mmap_{profile.summary['benchmark_id']}"
    assert scratch in left and not (Path(tempfile.gettempdir()) / scratch).exists()
    summary, ours = profile.summary, profile.ours
    assert summary["request_count"]["avg"] == REQUESTS
    assert summary["request_error_rate"]["avg"] == 0
    assert set(profile.measured) == set(ours) and len(ours) == REQUESTS
    # the warm-up opened the pool's connections: without it each of the first CONCURRENCY
    # profiled requests opens one (all of them were open already in every run measured; fewer
    # only if the host staggered the warm-up's requests so that they did not overlap)
    assert compare(profile, 1.0)["connections_opened"] < CONCURRENCY
    for rid, record in profile.measured.items():
        metrics = record["metrics"]
        text = streamed_text(profile.raw[rid])
        assert metrics["usage_completion_tokens"]["value"] == OSL == ours[rid]["output_tokens"]
        assert "\ufffd" not in text  # the model generates text ids only (valid UTF-8)
        assert metrics["output_sequence_length"]["value"] == OSL, (rid, text)
    assert summary.get("osl_mismatch_count", {"avg": 0})["avg"] == 0  # absent when none
    assert summary.get("usage_discrepancy_count", {"avg": 0})["avg"] == 0
    time_scale = load_config(SERVE_CONFIG).scale.time_scale
    outside = []
    for rid, record in ours.items():
        sent, first = profile.client_ttft_s(rid)
        outside.append(outside_the_emulator_s(sent, first, record, time_scale))
        door = record["door"]
        assert 0 <= door["late_writes"] <= OSL  # counted, never more than written
        # the instance's lateness in sending the first token is within the door's in writing it
        assert 0 <= door["first_token_sent_late_s"] <= door["first_token_late_s"] + ROUNDING_S
        assert door["ttft_s"] == door["first_chunk_s"] - door["received_s"]
    print(where_the_difference_goes("AIPerf", outside))
    compared = compare(profile, time_scale)
    shown = (
        "aiperf_ttft_ms",
        "pddemu_door_ttft_ms",
        "pddemu_ttft_ms",
        "difference_served_ms",
        "pddemu_first_chunk_from_send_ms",
        "difference_from_send_ms",
        "first_token_late_median_ms",
        "difference_p50_steps_ms",
    )
    print(json.dumps({k: compared[k] for k in shown}))
    gap = compared["difference_from_send_ms"]["p50"]
    assert abs(gap) <= TARGET_MS, f"AIPerf's TTFT p50 is {gap:.2f} ms from the records'"
