"""NVIDIA AIPerf, as its users run it, against `pddemu serve` with the exported tokenizer.

AIPerf is installed in its own venv (`.venv-aiperf`, by `make test`'s install step, pinned in
the Makefile) so that its dependencies never touch the project's. It loads the exported
tokenizer with transformers, drives the host-side port, and its TTFT of each request must
contain the emulator's own record of it on the host's one clock (`client_timing`: exact, not a
tolerance that a loaded machine breaks); the tokens it counts in the text it received must equal
what the server's usage says. AIPerf's TTFT p50 is printed beside pddemu's record of the same
requests as served (its door's received and first-chunk instants; the frontend serves the host
port itself, so no forwarding hop lies between them and AIPerf) and the modelled TTFT p50.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from netem.registry import list_namespaces
from pddemu.config import load_config
from pddemu.model import ByteTokenizer
from pddemu.serve import SERVE_CONFIG
from tests.conftest import require_namespaces
from tests.roles.client_timing import outside_the_emulator_s, where_the_difference_goes

ROOT = Path(__file__).resolve().parents[2]
AIPERF_VENV = ROOT / ".venv-aiperf"
REQUESTS, CONCURRENCY, ISL, OSL = 16, 4, 300, 48


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
    assert process.wait(30) == 0
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


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def emulator_record(raw: dict[str, Any]) -> dict[str, Any]:
    """The emulator's record, carried by the last content chunk of a streamed response."""
    for response in reversed(raw["responses"]):
        for packet in response["packets"]:
            if packet["name"] == "data" and packet["value"] and packet["value"] != "[DONE]":
                chunk = json.loads(packet["value"])
                if "pddemu" in chunk:
                    return chunk["pddemu"]
    raise AssertionError("no chunk carried the emulator's record")


def streamed_text(raw: dict[str, Any]) -> str:
    text = ""
    for response in raw["responses"]:
        for packet in response["packets"]:
            if packet["name"] == "data" and packet["value"] and packet["value"] != "[DONE]":
                choices = json.loads(packet["value"]).get("choices") or [{}]
                text += choices[0].get("text") or ""
    return text


def test_aiperf_agrees_with_the_emulator(served: Any, tmp_path: Path) -> None:
    venv, ready = served
    artifacts = tmp_path / "aiperf"
    command = [
        str(venv / "bin" / "aiperf"),
        "profile",
        "--model", ready["model"],
        "--url", ready["url"],
        "--endpoint-type", "completions",
        "--streaming",
        "--tokenizer", ready["tokenizer"],
        "--concurrency", str(CONCURRENCY),
        "--request-count", str(REQUESTS),
        "--isl", str(ISL),
        "--osl", str(OSL),
        "--random-seed", "0",
        "--artifact-dir", str(artifacts),
        "--export-level", "raw",
        "--ui-type", "none",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert summary["request_count"]["avg"] == REQUESTS
    assert summary["request_error_rate"]["avg"] == 0

    measured = {
        r["metadata"]["x_request_id"]: r for r in records(artifacts / "profile_export.jsonl")
    }
    raw = {
        r["metadata"]["x_request_id"]: r for r in records(artifacts / "profile_export_raw.jsonl")
    }
    ours = {rid: emulator_record(r) for rid, r in raw.items()}
    assert set(measured) == set(ours) and len(ours) == REQUESTS
    texts = {rid: streamed_text(r) for rid, r in raw.items()}
    for rid, record in measured.items():
        metrics = record["metrics"]
        assert metrics["usage_completion_tokens"]["value"] == OSL == ours[rid]["output_tokens"]
        assert "\ufffd" not in texts[rid]  # the model generates text ids only (valid UTF-8)
        assert metrics["output_sequence_length"]["value"] == OSL, (rid, texts[rid])
    assert summary.get("osl_mismatch_count", {"avg": 0})["avg"] == 0  # absent when none
    assert summary.get("usage_discrepancy_count", {"avg": 0})["avg"] == 0
    time_scale = load_config(SERVE_CONFIG).scale.time_scale
    outside = []
    for rid, record in ours.items():
        sent = raw[rid]["start_perf_ns"] / 1e9  # AIPerf's TTFT: first content response - this
        first = sent + measured[rid]["metrics"]["time_to_first_token"]["value"] / 1e3
        outside.append(outside_the_emulator_s(sent, first, record, time_scale))
    print(where_the_difference_goes("AIPerf", outside))
    # The bound (AIPerf's TTFT p50 within 5 ms of pddemu's record) is printed, not
    # asserted: what AIPerf measures beyond pddemu's door is AIPerf's own sending and reading on
    # a shared 2-core host, which grows with the host's load (README gives measured figures).
    served_ms = statistics.median(
        (r["door"]["first_chunk_s"] - r["door"]["received_s"]) * 1e3 for r in ours.values()
    )
    modelled_ms = statistics.median(
        (r["first_token_s"] - r["arrival_s"]) / time_scale * 1e3 for r in ours.values()
    )
    aiperf_ms = summary["time_to_first_token"]["p50"]
    print(
        f"TTFT p50: AIPerf {aiperf_ms:.2f} ms, pddemu's door {served_ms:.2f} ms, "
        f"modelled {modelled_ms:.2f} ms"
    )
