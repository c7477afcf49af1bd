"""NVIDIA AIPerf against `pddemu serve`: does what a benchmark client measures equal what pddemu
records, request by request?

`pddemu serve` (pdd, configs/serve.toml: real time, token scale 1) is started on a free port and
AIPerf (pinned in the Makefile, in its own venv `.venv-aiperf`) profiles it as its users run it:
streamed completions, the exported tokenizer, 16 requests at concurrency 2 (`CONCURRENCY`: why
not 4, below), 300-token synthetic prompts, 48 output tokens, after 2 warm-up requests (`WARMUP`:
they open AIPerf's connections).
Each streamed response's last chunk carries pddemu's record of the request; the records are
matched to AIPerf's per-request TTFT by AIPerf's request id.

Reported: AIPerf's TTFT p50 and p90 (its own summary, and the same percentiles computed here over
its per-request values), pddemu's modelled TTFT (first token - arrival, the record) and the TTFT
it served (the record's `door.ttft_s`: request received to first chunk written) at the same
percentiles, the differences, the records' own account of the served TTFT beyond the modelled
one (how late the first chunk went out; of that, how late its instance sent the token), where
the difference goes (medians of: AIPerf's send to the door's receipt, the door's TTFT beyond the
record, the door's first write to AIPerf's receipt: every process reads one CLOCK_MONOTONIC),
AIPerf's own time to connect and write each request (its `http_req_sending`, median), how many
profiled requests opened a connection, serve's late writes (chunks written later than their
tokens' modelled times), serve's verdict on its own lag (`serve_timing`: emulate's rule, and the
requests carrying more lag than its bound) and the host's load before and after. Target:
AIPerf's TTFT p50 within 5 ms of pddemu's records (issue 14), of what serve served, both timed
from where AIPerf's clock starts (`difference_from_send_ms`: AIPerf's stamp of each request to
the door's record of writing its first chunk): the wait before the door, which no record of
pddemu's can date and a loaded host stretches, is then in both alike. In real time a step whose
genuine work outlasts its modelled length sends its token late, which the client sees and the
modelled TTFT does not; the record holds both (`difference_ms` is the modelled one's
difference, `difference_served_ms` the door's own TTFT's, wait before the door left in).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
AIPERF_VENV = ROOT / ".venv-aiperf"
REQUESTS, ISL, OSL = 16, 300, 48
# Concurrency 2, not the 4 of the first trial: at 4, on 2 cores (AIPerf's worker and the
# frontend then each carry 4 streams of a chunk every 8 ms while the instances compute), in 3 of
# 7 runs of the serve test under the CPU lock (816b1e5) the requests at the median's rank waited
# 5-6 ms between AIPerf's stamp and the door's receipt, where no record of pddemu's can see it:
# the TTFT p50s were 6.0-7.9 ms apart. At 2 they were at most 2.4 ms apart in every run measured
# (README, "Benchmark clients against `pddemu serve`").
CONCURRENCY = 2
# AIPerf times a request from before it takes a connection from its pool, so a request that
# opens one carries a TCP connect and a first write no server sees (3-16 ms each, measured). The
# warm-up requests open the pool's connections; the profiled ones then all run on open ones.
WARMUP = CONCURRENCY
TARGET_MS = 5.0


def aiperf_command(
    aiperf: Path, ready: dict[str, Any], artifacts: Path, requests: int = REQUESTS
) -> list[str]:
    """AIPerf's profile of a `pddemu serve` (its ready line), as a user runs it."""
    return [
        str(aiperf),
        "profile",
        "--model", ready["model"],
        "--url", ready["url"],
        "--endpoint-type", "completions",
        "--streaming",
        "--tokenizer", ready["tokenizer"],
        "--concurrency", str(CONCURRENCY),
        "--request-count", str(requests),
        "--warmup-request-count", str(WARMUP),
        "--isl", str(ISL),
        "--osl", str(OSL),
        "--random-seed", "0",
        "--artifact-dir", str(artifacts),
        "--export-level", "raw",
        "--ui-type", "none",
    ]  # fmt: skip


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def profiled(path: Path) -> list[dict[str, Any]]:
    """AIPerf's records of the profiled requests (not the warm-up's)."""
    return [r for r in records(path) if r["metadata"].get("benchmark_phase") == "profiling"]


def data_chunks(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON chunks of one streamed response, as AIPerf received them."""
    return [
        json.loads(packet["value"])
        for response in raw["responses"]
        for packet in response["packets"]
        if packet["name"] == "data" and packet["value"] and packet["value"] != "[DONE]"
    ]


def emulator_record(raw: dict[str, Any]) -> dict[str, Any]:
    """pddemu's record, carried by the last content chunk of a streamed response."""
    for chunk in reversed(data_chunks(raw)):
        if "pddemu" in chunk:
            return chunk["pddemu"]
    raise ValueError("no chunk carried the emulator's record")


def streamed_text(raw: dict[str, Any]) -> str:
    return "".join(
        (chunk.get("choices") or [{}])[0].get("text") or "" for chunk in data_chunks(raw)
    )


class Profile:
    """One AIPerf profile's outputs, matched to pddemu's records by AIPerf's request id."""

    def __init__(self, artifacts: Path) -> None:
        self.summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
        rid = lambda r: r["metadata"]["x_request_id"]  # noqa: E731
        self.measured = {rid(r): r for r in profiled(artifacts / "profile_export.jsonl")}
        self.raw = {rid(r): r for r in profiled(artifacts / "profile_export_raw.jsonl")}
        self.ours = {key: emulator_record(r) for key, r in self.raw.items()}

    def client_ttft_s(self, key: str) -> tuple[float, float]:
        """AIPerf's send instant and its first content response's (CLOCK_MONOTONIC seconds)."""
        sent = self.raw[key]["start_perf_ns"] / 1e9
        return sent, sent + self.measured[key]["metrics"]["time_to_first_token"]["value"] / 1e3


def percentile_ms(values_s: list[float], q: float) -> float:
    return float(np.percentile(np.array(values_s) * 1e3, q))


def p50_steps_ms(parts: list[tuple[float, float, float, float]]) -> dict[str, float]:
    """Where the difference of the two TTFT p50s goes, exactly: each request's (record, in the
    frontend, after the door, before the door), seconds, are added one part at a time and the
    p50 is taken after each, so the steps sum to p50(client) - p50(record). The medians of the
    parts do not: the p50s' difference is decided by the requests at the median's rank, and
    one of them held up by a few milliseconds moves it by as much."""
    record, inside, after, before = (np.array(part) for part in zip(*parts, strict=True))
    sums = np.cumsum([record, inside, after, before], axis=0)
    p50s = [float(np.percentile(total, 50)) * 1e3 for total in sums]
    steps = np.diff(p50s)
    return {
        "in_the_frontend": float(steps[0]),
        "after_the_door": float(steps[1]),
        "before_the_door": float(steps[2]),
    }


def compare(profile: Profile, time_scale: float) -> dict[str, Any]:
    """AIPerf's TTFT against pddemu's records of the same requests."""
    keys = sorted(profile.ours)
    client, modelled, door, parts, sending, opened = [], [], [], [], [], 0
    late, sent_late, written_from_send = [], [], []
    for key in keys:
        record = profile.ours[key]
        metrics = profile.measured[key]["metrics"]
        sending.append(metrics["http_req_sending"]["value"])  # AIPerf's own: connect + write
        opened += metrics["http_req_connection_reused"]["value"] == 0
        sent, first = profile.client_ttft_s(key)
        received, first_chunk = record["door"]["received_s"], record["door"]["first_chunk_s"]
        ttft = (record["first_token_s"] - record["arrival_s"]) / time_scale
        client.append(first - sent)
        modelled.append(ttft)
        door.append(record["door"]["ttft_s"])
        written_from_send.append(first_chunk - sent)
        late.append(record["door"]["first_token_late_s"] / time_scale)
        sent_late.append(record["door"]["first_token_sent_late_s"] / time_scale)
        parts.append((ttft, (first_chunk - received) - ttft, first - first_chunk, received - sent))
    aiperf = profile.summary["time_to_first_token"]
    ours = {q: percentile_ms(modelled, q) for q in (50, 90)}
    served = {q: percentile_ms(door, q) for q in (50, 90)}
    mine = {q: percentile_ms(client, q) for q in (50, 90)}
    written = {q: percentile_ms(written_from_send, q) for q in (50, 90)}
    _, inside, after, before = (statistics.median(p) * 1e3 for p in zip(*parts, strict=True))
    return {
        "aiperf_ttft_ms": {"p50": aiperf["p50"], "p90": aiperf["p90"]},
        "aiperf_ttft_per_request_ms": {"p50": mine[50], "p90": mine[90]},
        "pddemu_ttft_ms": {"p50": ours[50], "p90": ours[90]},
        # the records' TTFT as served: the door's, from its receipt to the first chunk written
        "pddemu_door_ttft_ms": {"p50": served[50], "p90": served[90]},
        "difference_ms": {"p50": aiperf["p50"] - ours[50], "p90": aiperf["p90"] - ours[90]},
        "difference_served_ms": {
            "p50": aiperf["p50"] - served[50],
            "p90": aiperf["p90"] - served[90],
        },
        # the door's record of its first chunk's write, timed from where AIPerf's clock starts
        # (its stamp of the request): the served TTFT with AIPerf's own wait before the door
        "pddemu_first_chunk_from_send_ms": {"p50": written[50], "p90": written[90]},
        "difference_from_send_ms": {
            "p50": aiperf["p50"] - written[50],
            "p90": aiperf["p90"] - written[90],
        },
        # the records' own account of the door's TTFT beyond the modelled one, medians: how
        # late the first chunk went out, and of that how late its instance sent the token
        "first_token_late_median_ms": {
            "written": statistics.median(late) * 1e3,
            "sent": statistics.median(sent_late) * 1e3,
        },
        "difference_medians_ms": {
            "before_the_door": before,
            "in_the_frontend": inside,
            "after_the_door": after,
        },
        "difference_p50_steps_ms": p50_steps_ms(parts),
        # AIPerf's own account of the part before the door: its connect and write of the request
        "aiperf_sending_median_ms": statistics.median(sending),
        "connections_opened": opened,
        "pipelines": sorted({profile.ours[k]["pipeline"] for k in keys}),
        "late_writes": sum(profile.ours[k]["door"].get("late_writes", 0) for k in keys),
    }


def load_average() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def run_aiperf(
    command: list[str], timeout_s: float = 600
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run AIPerf with a temporary directory of its own, removed after (also on failure): each
    run leaves an empty `aiperf_mmap_<benchmark id>` directory in its TMPDIR. A fresh directory
    in the system's, not one in the run's: AIPerf puts its ZeroMQ sockets there, and a socket's
    path must fit in 107 bytes. AIPerf runs in a session of its own, so a timeout (or any
    error) kills its service processes too, not only the one started. Returns the finished run
    and the names it left there."""
    scratch = Path(tempfile.mkdtemp(prefix="pddemu-aiperf-"))
    env = {**os.environ, "TMPDIR": str(scratch), "AIPERF_DATASET_MMAP_BASE_PATH": str(scratch)}
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        done = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
        return done, sorted(entry.name for entry in scratch.iterdir())
    finally:
        if process.returncode is None or _group_alive(process.pid):
            _kill_group(process)
        shutil.rmtree(scratch, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL to AIPerf's whole session (its services outlive the main process otherwise)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.communicate()


def run_profile(workdir: Path, requests: int = REQUESTS) -> tuple[Profile, dict[str, Any]]:
    """Serve pdd, profile it with AIPerf, stop serve; returns the profile and serve's last line."""
    aiperf = AIPERF_VENV / "bin" / "aiperf"
    if not aiperf.exists():
        raise FileNotFoundError(f"{aiperf} is missing: `make aiperf` installs it")
    serve = subprocess.Popen(
        [sys.executable, "-m", "pddemu.cli", "serve", "--port", "0", "--run-dir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = serve.stdout.readline()
        if not line:
            raise RuntimeError(f"pddemu serve did not start: {serve.stderr.read()[-2000:]}")
        ready = json.loads(line)
        artifacts = workdir / "aiperf"
        done, _ = run_aiperf(aiperf_command(aiperf, ready, artifacts, requests))
        if done.returncode != 0:
            raise RuntimeError(f"aiperf failed: {(done.stdout + done.stderr)[-2000:]}")
    finally:
        serve.send_signal(signal.SIGINT)
        out, _ = serve.communicate(timeout=60)
    stopped = json.loads(out.splitlines()[-1]) if out.strip() else {}
    return Profile(artifacts), stopped


def run(quick: bool) -> dict[str, Any]:
    from pddemu.config import load_config
    from pddemu.serve import SERVE_CONFIG

    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="pddemu-aiperf-") as tmp:
        profile, stopped = run_profile(Path(tmp), REQUESTS // 2 if quick else REQUESTS)
    load_after = load_average()
    result = compare(profile, load_config(SERVE_CONFIG).scale.time_scale)
    mismatches = profile.summary.get("osl_mismatch_count", {"avg": 0})["avg"]
    errors = profile.summary["request_error_rate"]["avg"]
    within = abs(result["difference_from_send_ms"]["p50"]) <= TARGET_MS
    within_served = abs(result["difference_served_ms"]["p50"]) <= TARGET_MS
    within_modelled = abs(result["difference_ms"]["p50"]) <= TARGET_MS
    return {
        "what": "AIPerf's TTFT against pddemu's records of the same requests (pddemu serve)",
        "setup": {
            "system": "pdd",
            "config": "configs/serve.toml",
            "requests": len(profile.ours),
            "concurrency": CONCURRENCY,
            "input_tokens": ISL,
            "output_tokens": OSL,
            "endpoint": "completions, streamed",
        },
        **result,
        "serve": stopped.get("door"),
        "serve_timing": {
            key: stopped.get(key) for key in ("valid", "invalid_reason", "lag", "late_requests")
        },
        "osl_mismatch_count": mismatches,
        "request_error_rate": errors,
        "load_average": {"before": load_before, "after": load_after},
        "target": f"AIPerf's TTFT p50 within {TARGET_MS:g} ms of pddemu's records of what it "
        "served (the door's first chunk written), both timed from AIPerf's stamp of the request",
        "targets": {
            "ttft_p50_within_5_ms": within,
            "served_ttft_p50_within_5_ms": within_served,
            "modelled_ttft_p50_within_5_ms": within_modelled,
            "no_output_length_mismatch": mismatches == 0,
            "no_failed_request": errors == 0,
        },
    }
