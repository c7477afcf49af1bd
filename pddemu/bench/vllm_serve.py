"""vLLM's `vllm bench serve` against `pddemu serve`: does vLLM's benchmark client run against it
as its users run it, and what does it measure beside pddemu's records?

`pddemu serve` (pdd, configs/serve.toml: real time, token scale 1) is started on a free port and
`vllm bench serve` (pinned in the Makefile, in its own venv `.venv-vllm`: vLLM without its
dependencies, a CPU torch, and only what its benchmark client imports) drives it with the URLs of
serve's ready line and the exported tokenizer: 16 streamed completions, 4 at a time, random
300-token prompts, 48 output tokens each.

Reported: vLLM's completed and failed requests, its TTFT p50/p99, TPOT and ITL medians (its own
result JSON), and pddemu's records' TTFT p50/p90 over the same requests (serve's last line,
`door`: vLLM's client keeps no per-request record of the server's), both as modelled
(`pddemu_ttft_ms`: first token - arrival) and as served (`pddemu_door_ttft_ms`: the door's,
request received to first chunk written, which vLLM's client measures from outside), with
vLLM's p50 less each (`difference_ms`, `difference_served_ms`, as aiperf.json names them), and
the output length check: each request's output length as vLLM counted it, against 48 and against the
length of its generated text in the model's tokens (one per byte: the text is printable ASCII).
Then a failure midway: serve with a 1 s request timeout, 4 requests of 2,000 tokens each, every
one streams tokens and then fails; vLLM must count each as failed.
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

from pddemu.bench.aiperf import load_average

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ROOT / ".venv-vllm"
REQUESTS, CONCURRENCY, ISL, OSL = 16, 4, 300, 48
STOP_TIMEOUT_S = 60.0  # wall seconds serve has to stop after SIGINT


def vllm_command(
    vllm: Path,
    ready: dict[str, Any],
    results: Path,
    requests: int = REQUESTS,
    output_len: int = OSL,
) -> list[str]:
    """`vllm bench serve` against a `pddemu serve` (its ready line), as the README gives it."""
    return [
        str(vllm), "bench", "serve",
        "--backend", "openai",
        "--base-url", ready["url"],
        "--endpoint", "/v1/completions",
        "--model", ready["model"],
        "--tokenizer", ready["tokenizer"],
        "--dataset-name", "random",
        "--random-input-len", str(ISL),
        "--random-output-len", str(output_len),
        "--num-prompts", str(requests),
        "--max-concurrency", str(CONCURRENCY),
        "--seed", "0",
        "--save-result", "--save-detailed",
        "--result-dir", str(results),
        "--result-filename", "vllm.json",
    ]  # fmt: skip


def run_bench(
    workdir: Path, requests: int = REQUESTS, config: Path | None = None, output_len: int = OSL
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Serve pdd, run vLLM's benchmark against it, stop serve; returns vLLM's result JSON and
    serve's last line."""
    vllm = VLLM_VENV / "bin" / "vllm"
    if not vllm.exists():
        raise FileNotFoundError(
            f"{vllm} is missing: `make bench-vllm` (or `make vllm-client`) installs it"
        )
    serve_command = [sys.executable, "-m", "pddemu.cli", "serve", "--port", "0"]
    serve_command += ["--run-dir", str(workdir / "run")]
    if config is not None:
        serve_command += ["--config", str(config)]
    log = workdir / "serve.stderr"  # a file: a pipe nobody reads while vLLM runs could fill
    with log.open("w") as stderr:
        serve = subprocess.Popen(
            serve_command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its group is killed if it does not stop
        )
    try:
        line = serve.stdout.readline()
        if not line:
            raise RuntimeError(f"pddemu serve did not start: {log.read_text()[-2000:]}")
        ready = json.loads(line)
        command = vllm_command(vllm, ready, workdir, requests, output_len)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=workdir)
        if done.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {(done.stdout + done.stderr)[-2000:]}")
    finally:
        out = stop_serve(serve, log)
    stopped = json.loads(out.splitlines()[-1]) if out.strip() else {}
    return json.loads((workdir / "vllm.json").read_text()), stopped


def stop_serve(serve: subprocess.Popen[str], log: Path, timeout_s: float = STOP_TIMEOUT_S) -> str:
    """SIGINT to serve, then its stdout; one that has not stopped within `timeout_s` is killed
    with its whole process group (its instances) and waited for, and that is an error."""
    serve.send_signal(signal.SIGINT)
    try:
        out, _ = serve.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(serve.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        serve.communicate()
        raise RuntimeError(
            f"pddemu serve did not stop within {timeout_s:g} s of SIGINT and was killed: "
            f"{log.read_text()[-2000:]}"
        ) from None
    return out


def output_lengths(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's count of each request's output against OSL and against its text's length."""
    counted = result["output_lens"]
    texts = result["generated_texts"]
    from_text = [len(text.encode("utf-8")) for text in texts]
    return {
        "counted": sorted(set(counted)),
        "all_equal_requested": all(n == OSL for n in counted),
        "all_equal_text_length": counted == from_text,
        "text_is_ascii": all(text.isascii() for text in texts),
    }


def failing_midway(workdir: Path, requests: int = 4) -> dict[str, Any]:
    """vLLM's count of requests that stream tokens and then fail (serve's request timeout)."""
    config = workdir / "short-timeout.toml"
    config.write_text("request_timeout_s = 1.0\n" + (ROOT / "configs/serve.toml").read_text())
    result, stopped = run_bench(workdir, requests, config, output_len=2000)
    streamed = [ttft for ttft in result["ttfts"] if ttft > 0]
    return {
        "requests": result["num_prompts"],
        "completed": result["completed"],
        "failed": result["failed"],
        "errors": sorted(
            {error.strip().splitlines()[-1][:200] for error in result["errors"] if error}
        ),
        "serve_completed": (stopped.get("door") or {}).get("completed"),
        "tokens_streamed_before": len(streamed),
    }


def run(quick: bool) -> dict[str, Any]:
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="pddemu-vllm-") as tmp:
        result, stopped = run_bench(Path(tmp), REQUESTS // 2 if quick else REQUESTS)
    load_after = load_average()
    with tempfile.TemporaryDirectory(prefix="pddemu-vllm-") as tmp:
        failing = failing_midway(Path(tmp))
    return report(result, stopped, failing, {"before": load_before, "after": load_after})


def records_ttft_ms(door: dict[str, Any], name: str) -> dict[str, float]:
    """The p50 and p90 of serve's `door.<name>_p50_s` and `_p90_s`, in ms (those it has)."""
    found = {q: door.get(f"{name}_p{q}_s") for q in (50, 90)}
    return {f"p{q}": s * 1e3 for q, s in found.items() if s is not None}


def report(
    result: dict[str, Any],
    stopped: dict[str, Any],
    failing: dict[str, Any],
    load: dict[str, list[float]],
) -> dict[str, Any]:
    """vllm_serve.json: vLLM's result beside pddemu's records of the same requests, modelled
    and as served."""
    door = stopped.get("door") or {}
    modelled = records_ttft_ms(door, "ttft")
    served = records_ttft_ms(door, "served_ttft")
    vllm_p50 = result["median_ttft_ms"]
    lengths = output_lengths(result)
    return {
        "what": "vLLM's bench serve against pddemu serve, beside pddemu's records of the same "
        "requests: modelled (first token - arrival) and as served (the door's TTFT)",
        "setup": {
            "system": "pdd",
            "config": "configs/serve.toml",
            "requests": result["num_prompts"],
            "concurrency": CONCURRENCY,
            "input_tokens": ISL,
            "output_tokens": OSL,
            "endpoint": "completions, streamed",
        },
        "completed": result["completed"],
        "failed": result["failed"],
        "vllm_ttft_ms": {"p50": result["median_ttft_ms"], "p99": result["p99_ttft_ms"]},
        "vllm_tpot_ms": {"p50": result["median_tpot_ms"]},
        "vllm_itl_ms": {"p50": result["median_itl_ms"], "p99": result["p99_itl_ms"]},
        "pddemu_ttft_ms": modelled,
        "pddemu_door_ttft_ms": served,
        "difference_ms": {"p50": vllm_p50 - modelled["p50"] if "p50" in modelled else None},
        "difference_served_ms": {"p50": vllm_p50 - served["p50"] if "p50" in served else None},
        "total_input_tokens": result["total_input_tokens"],
        "total_output_tokens": result["total_output_tokens"],
        "output_lengths": lengths,
        "serve": door,
        "serve_timing": {
            key: stopped.get(key) for key in ("valid", "invalid_reason", "lag", "late_requests")
        },
        "load_average": load,
        "failing_midway": failing,
        "targets": {
            "failure_midway_counted_as_failed": failing["failed"] == failing["requests"],
            "every_request_completed": result["completed"] == result["num_prompts"],
            "no_failed_request": result["failed"] == 0,
            "output_length_as_requested_and_as_its_text": lengths["all_equal_requested"]
            and lengths["all_equal_text_length"],
            "pddemu_records_reported": "p50" in modelled and "p50" in served,
        },
    }
