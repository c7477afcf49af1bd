"""The vLLM benchmark's handling of `pddemu serve` (no vLLM needed): serve is stopped by SIGINT,
and one that does not stop is killed with the processes it started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pddemu.bench.vllm_serve import stop_serve

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
