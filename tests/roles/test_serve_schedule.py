"""`pddemu serve` with `[wan] schedule`: the scheduled outage happens on serve's own timeline
(time 0 is when it is ready, printed as `time_zero_s`; real time, so modelled seconds are wall
seconds). A naive request sent during the outage gets no token before the link is up again: its
KV and its tokens cross the WAN."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai

from netem.registry import list_namespaces
from pddemu.serve import SERVE_CONFIG
from tests.conftest import require_namespaces

DOWN_S, UP_S = 1.0, 2.0  # modelled seconds from serve's time 0


def streamed(client: openai.OpenAI, prompt: str) -> tuple[float, dict]:
    """(when the first chunk arrived, the emulator's record) of one streamed completion."""
    first = None
    last = None
    for chunk in client.completions.create(
        model="pddemu", prompt=prompt, max_tokens=4, stream=True
    ):
        first = time.monotonic() if first is None else first
        last = chunk
    assert first is not None and last is not None
    return first, last.model_extra["pddemu"]


def test_a_scheduled_outage_happens_on_serves_timeline(tmp_path: Path) -> None:
    require_namespaces()
    schedule = tmp_path / "outage.schedule"
    schedule.write_text(f"{DOWN_S} link=down\n{UP_S} link=up\n")
    config = tmp_path / "serve.toml"
    text = SERVE_CONFIG.read_text()
    config.write_text(text.replace("[wan]\n", f"[wan]\nschedule = {json.dumps(str(schedule))}\n"))
    assert str(schedule) in config.read_text()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "pddemu.cli", "serve", "--port", "0"),
            *("--system", "naive", "--config", str(config), "--run-dir", str(tmp_path / "run")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line, process.stderr.read()
        ready = json.loads(line)
        zero = ready["time_zero_s"]
        client = openai.OpenAI(base_url=ready["base_url"], api_key="unused")
        time.sleep(max(0.0, zero + DOWN_S + 0.2 - time.monotonic()))
        sent = time.monotonic()
        assert sent < zero + UP_S - 0.3, "the request was not sent during the outage"
        first, record = streamed(client, "sent while the WAN is down")
        assert record["state"] == "completed"
        # nothing crossed the WAN before it came back up, on serve's clock
        assert record["door"]["first_chunk_s"] >= zero + UP_S
        assert first >= zero + UP_S
        # and once it is up, a request is served without waiting for anything
        again_sent = time.monotonic()
        again_first, again = streamed(client, "sent after the outage")
        assert again["state"] == "completed"
        assert again_first - again_sent < first - sent
    finally:
        process.send_signal(signal.SIGINT)
        try:
            exit_code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()  # a hung serve must not outlive the test (its guardian then removes the namespaces)
            process.wait()
            raise
    assert exit_code == 0
    run = ready["netns"].rsplit("-", 1)[0]
    assert not [n for n in list_namespaces() if n.startswith(run + "-")], "serve left some"
