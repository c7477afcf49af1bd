"""`pddemu export` on a run directory built from the hand-computed sample records: vLLM's result
keys and units, AIPerf's export layout (checked with AIPerf's own models when it is installed),
and a Perfetto timeline whose tracks nest."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pddemu.cli import main
from pddemu.metrics import summarize, write_requests_csv, write_summary_json
from tests.metrics.metrics_samples import (
    SAMPLE_SCALE,
    SAMPLE_SLO,
    SAMPLE_WAN_RATE,
    sample_instances,
    sample_records,
)
from tests.metrics.trace_events import check_opens

ROOT = Path(__file__).resolve().parents[2]

# The keys `vllm bench serve --save-result --save-detailed` writes (vllm/benchmarks/serve.py:
# the result of benchmark() and main_async's result_json), with the default percentile metrics.
VLLM_KEYS = {
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts",
    "request_rate", "burstiness", "max_concurrency", "duration", "completed", "failed",
    "total_input_tokens", "total_output_tokens", "request_throughput", "request_goodput",
    "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
    "latencies", "start_times", "queue_times", "generated_texts", "errors",
    "max_output_tokens_per_s", "max_concurrent_requests", "rtfx",
    *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99") for m in ("ttft", "tpot", "itl")),
}  # fmt: skip

# What the instances of the sample run recorded (modelled seconds), consistent with the records:
# r2 arrives at 1.0, is prefilled in two chunks (the second in one step with r3's), relayed by
# RLD0 and handed to MD0 at position 3.
EVENTS = {
    "P0": [
        {"kind": "prefill_chunk", "rid": "r2", "start_s": 1.2, "end_s": 1.5, "tokens": 64},
        {"kind": "prefill_chunk", "rid": "r1", "start_s": 0.2, "end_s": 0.6, "tokens": 32},
        {"kind": "prefill_chunk", "rid": "r3", "start_s": 2.0, "end_s": 2.3, "tokens": 16},
        {"kind": "prefill_chunk", "rid": "r2", "start_s": 2.0, "end_s": 2.3, "tokens": 36},
    ],
    "RLD0": [
        {"kind": "kv_transfer", "rid": "r2", "start_s": 1.3, "end_s": 2.1, "source": "P0"},
        {"kind": "decode", "rid": "r2", "start_s": 3.0, "end_s": 4.1},
    ],
    "MD0": [
        {"kind": "kv_transfer", "rid": "r2", "start_s": 1.3, "end_s": 3.2, "source": "P0"},
        {"kind": "decode", "rid": "r2", "start_s": 5.9, "end_s": 6.0},
        {"kind": "decode", "rid": "r1", "start_s": 1.0, "end_s": 1.3},
    ],
}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    records = sample_records()
    summary = summarize(
        "pdd", records, sample_instances(), SAMPLE_SLO, SAMPLE_SCALE, SAMPLE_WAN_RATE
    )
    summary["faults"] = {  # the run's fault timeline: its 0 is the replay's start, at 0.5
        "replay_start_s": 0.5,
        "timeline": [
            {"at_s": 2.0, "instance": "MD0", "what": "killed", "detail": "scheduled"},
            {"at_s": 2.1, "instance": "MD0", "what": "router: down", "detail": "closed"},
        ],
    }
    write_requests_csv(tmp_path / "requests.csv", records)
    write_summary_json(tmp_path / "summary.json", {"pdd": summary}, {"arrival_rate": 0.5})
    roles = {"P0": "P", "RLD0": "RLD", "MD0": "MD"}
    instances = {name: {"role": roles[name], "events": EVENTS[name]} for name in EVENTS}
    (tmp_path / "instances-pdd.json").write_text(json.dumps(instances))
    return tmp_path


def export(run_dir: Path, kind: str, out: Path) -> None:
    assert main(["export", str(run_dir), "--format", kind, "--out", str(out)]) == 0


def test_vllm_result_has_its_keys_and_units(run_dir: Path, tmp_path: Path) -> None:
    export(run_dir, "vllm", tmp_path / "vllm.json")
    result = json.loads((tmp_path / "vllm.json").read_text())
    assert VLLM_KEYS <= set(result)
    assert (result["completed"], result["failed"], result["num_prompts"]) == (4, 1, 5)
    # TTFTs of the completed requests 1.0, 2.0, 0.5, 1.0 s: vLLM's statistics are in ms
    assert result["mean_ttft_ms"] == pytest.approx(1125.0)
    assert result["median_ttft_ms"] == pytest.approx(1000.0)
    assert result["ttfts"] == pytest.approx([1.0, 2.0, 0.5, 0.0, 1.0])  # seconds, failed: 0
    assert result["errors"][3] == "timeout" and result["errors"][0] == ""
    # vLLM's client-side wait for a concurrency slot: the replayer sends each at its arrival
    assert result["queue_times"] == [0.0] * 5 and result["rtfx"] == 0.0
    assert result["itls"][0] == pytest.approx([0.1, 0.1, 0.1])
    assert result["total_output_tokens"] == 12 and result["duration"] == pytest.approx(6.0)
    assert result["output_throughput"] == pytest.approx(2.0)
    assert result["request_goodput"] == pytest.approx(0.5)
    # vLLM's peaks count successful requests: at most two at once (r4, failed, is not one)
    assert result["max_concurrent_requests"] == 2
    assert result["max_output_tokens_per_s"] == 4.0  # r1's four tokens in its second second


def test_aiperf_export_layout(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "aiperf"
    export(run_dir, "aiperf", out)
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    assert summary["schema_version"] == "1.4"
    assert summary["request_count"] == {"unit": "requests", "avg": 4.0}
    assert summary["error_request_count"]["avg"] == 1.0
    assert summary["time_to_first_token"]["unit"] == "ms"
    assert summary["time_to_first_token"]["avg"] == pytest.approx(1125.0)
    # AIPerf's inter_token_latency is pddemu's TPOT: r1, r2, r5 = 100, 1000, 200 ms
    assert summary["inter_token_latency"]["count"] == 3
    assert summary["inter_token_latency"]["p50"] == pytest.approx(200.0)
    # AIPerf's system throughputs: the completed requests' tokens over the run's duration
    duration = summary["benchmark_duration"]["avg"]
    isl, osl = summary["total_isl"]["avg"], summary["total_osl"]["avg"]
    assert summary["input_token_throughput"] == {"unit": "tokens/sec", "avg": isl / duration}
    total = summary["total_token_throughput"]
    assert total == {"unit": "tokens/sec", "avg": pytest.approx((isl + osl) / duration)}
    ours = json.loads((run_dir / "summary.json").read_text())["systems"]["pdd"]
    assert total["avg"] == pytest.approx(ours["total_token_throughput_tps"])
    assert len(records) == 5 and records[3]["error"]["message"] == "timeout"
    assert records[0]["metrics"]["inter_chunk_latency"]["value"] == pytest.approx([100.0] * 3)
    venv = ROOT / ".venv-aiperf" / "bin" / "python"
    if not venv.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("AIPerf is not installed: `make test` installs it in .venv-aiperf")
        pytest.skip("AIPerf is not installed: its models cannot check the layout")
    check = (
        "import sys\n"
        "from aiperf.common.models.export_models import JsonExportData\n"
        "from aiperf.common.models.record_models import MetricRecordInfo\n"
        "d = JsonExportData.model_validate_json(open(sys.argv[1]).read())\n"
        "assert d.time_to_first_token.unit == 'ms'\n"
        "for line in open(sys.argv[2]):\n"
        "    MetricRecordInfo.model_validate_json(line)\n"
    )
    subprocess.run(
        [venv, "-c", check, out / "profile_export_aiperf.json", out / "profile_export.jsonl"],
        check=True,
    )


def test_perfetto_tracks_nest_and_show_each_phase(run_dir: Path, tmp_path: Path) -> None:
    export(run_dir, "perfetto", tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    check_opens(trace)
    events = trace["traceEvents"]
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    spans: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            spans[threads[(event["pid"], event["tid"])]].append(event)
    for track, slices in spans.items():  # on one track, slices follow one another
        ordered = sorted(slices, key=lambda e: e["ts"])
        for before, after in zip(ordered, ordered[1:], strict=False):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-6, track
    r2 = {e["name"]: e for e in spans["r2 P-RLD-MD"]}
    assert list(r2) == [
        "queued",
        "prefill",
        "relay decode on RLD0",
        "handoff",
        "main decode on MD0",
    ]
    assert (r2["queued"]["ts"], r2["queued"]["dur"]) == (1.0e6, pytest.approx(0.2e6))
    assert r2["handoff"]["ts"] == 4.0e6 and r2["handoff"]["dur"] == pytest.approx(2.0e6)
    assert r2["prefill"]["args"]["tokens"] == 100
    assert {s["name"] for s in spans["r2 P-RLD-MD KV to MD0"]} == {"KV P0 → MD0"}
    steps = spans["P0 prefill steps"]
    assert [s["args"] for s in steps] == [{"r1": 32}, {"r2": 64}, {"r3": 16, "r2": 36}]
    tokens = [e for e in events if e["ph"] == "i" and e["name"] == "token"]
    assert len(tokens) == sum(len(r.token_times_s) for r in sample_records())
    assert any(e["ph"] == "i" and e["name"] == "failed" for e in events)
    faults = [(threads[(e["pid"], e["tid"])], e["name"], e["ts"]) for e in events if e["ph"] == "i"]
    assert ("MD0", "killed", 2.5e6) in faults and ("MD0", "router: down", 2.6e6) in faults
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"MD0 decoding", "MD0 KV arriving", "RLD0 decoding"} <= counters


@pytest.mark.parametrize(
    "damage",
    [
        lambda e: e.pop("dur") if e["ph"] == "X" else None,  # a complete event without its length
        lambda e: e.update(ts="1.0") if e["ph"] == "X" else None,  # a time as a string
        lambda e: e.update(args={"value": "3"}) if e["ph"] == "C" else None,  # a counter's text
        lambda e: e.update(dur=e["dur"] + 0.25e6) if e.get("name") == "queued" else None,  # overlap
    ],
)
def test_the_trace_check_finds_what_perfetto_refuses(
    run_dir: Path, tmp_path: Path, damage: Any
) -> None:
    export(run_dir, "perfetto", tmp_path / "trace.json")
    trace = json.loads((tmp_path / "trace.json").read_text())
    for event in trace["traceEvents"]:
        damage(event)
    with pytest.raises((AssertionError, jsonschema.ValidationError)):
        check_opens(trace)


def test_a_run_of_several_systems_needs_one_named(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["export", str(run_dir), "--format", "vllm", "--system", "naive", "--out", "x"]) == 2
    )
    assert "has no system 'naive'; it has pdd" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("instances-pdd.json", "{truncated", "instances-pdd.json: not JSON"),
        ("summary.json", "[]", "summary.json: no 'systems' object"),
    ],
)
def test_a_damaged_run_file_is_one_line(
    run_dir: Path, name: str, content: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / name).write_text(content)
    assert main(["export", str(run_dir), "--format", "perfetto", "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
