"""The vLLM benchmark's handling of `pddemu serve` (no vLLM needed): serve is stopped by SIGINT,
and one that does not stop is killed with the processes it started; its result sets vLLM's TTFT
beside pddemu's records, modelled and as served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pddemu.bench.vllm_serve import report, stop_serve

# A serve that prints its last line when interrupted.
STOPS = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGINT, lambda *_: (print('{\"door\": {}}', flush=True), sys.exit(0)))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)

# A serve that ignores SIGINT, with a child of its own (an instance).
STUCK = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "print(child.pid, flush=True)\n"
    "time.sleep(60)\n"
)


def start(program: str, log: Path) -> subprocess.Popen[str]:
    with log.open("w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-c", program],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
        )


def test_serve_stops_on_sigint_and_its_last_line_is_read(tmp_path: Path) -> None:
    serve = start(STOPS, tmp_path / "serve.stderr")
    assert serve.stdout.readline().strip() == "ready"
    assert stop_serve(serve, tmp_path / "serve.stderr").strip() == '{"door": {}}'
    assert serve.returncode == 0


def test_a_serve_that_does_not_stop_is_killed_with_its_group(tmp_path: Path) -> None:
    log = tmp_path / "serve.stderr"
    serve = start(STUCK, log)
    child = int(serve.stdout.readline())
    with pytest.raises(RuntimeError, match="did not stop within 1 s of SIGINT and was killed"):
        stop_serve(serve, log, timeout_s=1.0)
    assert serve.returncode is not None
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("serve's child outlived it")


def alive(pid: int) -> bool:
    """Running (a killed process nobody has reaped yet is a zombie: dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def vllm_result(ttft_p50_ms: float) -> dict:
    """The part of `vllm bench serve`'s result JSON the benchmark reads: 2 requests of 48 tokens."""
    return {
        "num_prompts": 2, "completed": 2, "failed": 0,
        "median_ttft_ms": ttft_p50_ms, "p99_ttft_ms": 300.0, "median_tpot_ms": 8.3,
        "median_itl_ms": 8.2, "p99_itl_ms": 14.0, "total_input_tokens": 600,
        "total_output_tokens": 96, "output_lens": [48, 48], "generated_texts": ["a" * 48] * 2,
    }  # fmt: skip


def test_vllms_ttft_is_set_beside_the_records_modelled_and_as_served() -> None:
    door = {"ttft_p50_s": 0.128, "ttft_p90_s": 0.295, "served_ttft_p50_s": 0.1285}
    door["served_ttft_p90_s"] = 0.296
    failing = {"requests": 4, "failed": 4}
    result = report(vllm_result(130.0), {"door": door}, failing, {"before": [1.0], "after": [1.0]})
    assert result["pddemu_ttft_ms"] == pytest.approx({"p50": 128.0, "p90": 295.0})
    assert result["pddemu_door_ttft_ms"] == pytest.approx({"p50": 128.5, "p90": 296.0})
    assert result["difference_ms"]["p50"] == pytest.approx(2.0)
    assert result["difference_served_ms"]["p50"] == pytest.approx(1.5)
    assert all(result["targets"].values())


def test_records_without_the_served_ttft_are_not_reported_as_compared() -> None:
    """A serve whose last line lacks the door's TTFT misses the target, whatever else it has."""
    stopped = {"door": {"ttft_p50_s": 0.128, "ttft_p90_s": 0.295}}
    result = report(vllm_result(130.0), stopped, {"requests": 4, "failed": 4}, {})
    assert result["pddemu_door_ttft_ms"] == {}
    assert result["difference_served_ms"]["p50"] is None
    assert not result["targets"]["pddemu_records_reported"]
