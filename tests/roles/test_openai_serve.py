"""`pddemu serve` driven by the official `openai` client: streamed completions whose
client-measured TTFT contains the emulator's own record of each request (`client_timing`), and
OpenAI-style errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest

from netem.registry import list_namespaces
from pddemu.config import load_config
from pddemu.serve import SERVE_CONFIG
from tests.conftest import require_namespaces
from tests.roles.client_timing import outside_the_emulator_s, where_the_difference_goes


def user_namespaces() -> dict[int, str]:
    """Every process on the host: pid -> its user namespace."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found[int(entry)] = os.readlink(f"/proc/{entry}/ns/user")
            except OSError:  # ended meanwhile
                pass
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A rootless serve (as root, --rootless: the path a non-root user takes): the emulated
    network lives in a private namespace, and the host port, made before entering it, serves
    the host's clients. Its namespaces are never on the host: on its exit, no process is left
    in its private user namespace (the namespaces made inside go with the last of them). That
    a serve as root removes the namespaces it made is tests/roles/test_aiperf_serve.py's and
    test_serve_schedule.py's."""
    require_namespaces()
    run_dir = tmp_path_factory.mktemp("serve")
    process = subprocess.Popen(
        [sys.executable, "-m", "pddemu.cli", "serve", "--port", "0", "--rootless"]
        + ["--run-dir", str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line, process.stderr.read()
    ready = json.loads(line)
    run = ready["netns"].rsplit("-", 1)[0]  # this run's namespaces: <run>-a, <run>-b, ...
    private = os.readlink(f"/proc/{process.pid}/ns/user")
    try:
        assert not [n for n in list_namespaces() if n.startswith(run + "-")], "on the host"
        assert private != os.readlink("/proc/self/ns/user"), "serve has no user namespace"
        inside = [pid for pid, ns in user_namespaces().items() if ns == private]
        assert len(inside) > 1, "no instance in serve's user namespace"
        yield ready
    finally:
        process.send_signal(signal.SIGINT)
        exit_code = process.wait(30)
    assert exit_code == 0
    left = [pid for pid, ns in user_namespaces().items() if ns == private]
    assert not left, f"processes left in serve's user namespace: {left}"
    # the last line's verdict, the WAN's flows judged round by round from the shaper's count
    # (`RunningFlows`) when the userspace shaper carries the WAN (no sch_netem on the host)
    last = json.loads(process.stdout.read().splitlines()[-1])
    assert "flow count could not be read" not in process.stderr.read()
    if last["wan_flows"] is not None:
        assert last["wan_flows"]["directions"]["a2b"]["windows_active"] > 0  # P's KV to MD


def test_streamed_ttft_contains_the_emulator_record(server) -> None:
    client = openai.OpenAI(base_url=server["base_url"], api_key="unused")
    time_scale = load_config(SERVE_CONFIG).scale.time_scale
    outside = []
    for i in range(12):
        sent = time.monotonic()
        first = None
        last = None
        text = ""
        for chunk in client.completions.create(
            model="pddemu", prompt=f"Request {i}: tell me about PDD.", max_tokens=12, stream=True
        ):
            if first is None:
                first = time.monotonic()
            text += chunk.choices[0].text
            last = chunk
        record = last.model_extra["pddemu"]
        assert record["state"] == "completed" and record["output_tokens"] == 12
        assert last.choices[0].finish_reason == "length"
        outside.append(outside_the_emulator_s(sent, first, record, time_scale))
    print(where_the_difference_goes("the openai client", outside))


def test_chat_completion_whole_and_streamed(server) -> None:
    client = openai.OpenAI(base_url=server["base_url"], api_key="unused")
    reply = client.chat.completions.create(
        model="pddemu", messages=[{"role": "user", "content": "hello"}], max_tokens=6
    )
    assert reply.usage.completion_tokens == 6 and reply.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model="pddemu",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=6,
            stream=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert [m.id for m in client.models.list()] == ["pddemu"]


def test_the_host_port_serves_only_the_api_and_health(server) -> None:
    assert server["base_url"] == server["url"] + "/v1"
    assert server["url"].startswith("http://127.0.0.1:")
    with urllib.request.urlopen(server["url"] + "/health", timeout=10) as reply:
        assert reply.status == 200
    for path in ("/shutdown", "/admin/policy", "/stats"):
        request = urllib.request.Request(server["url"] + path, data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code in (404, 405), path
    with urllib.request.urlopen(server["url"] + "/health", timeout=10) as reply:
        assert json.loads(reply.read())["ok"]  # still up: /shutdown never reached it


def post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("completions", b"{not json", 400, None),
        ("completions", b"[1, 2]", 400, None),
        ("completions", b'{"prompt": "x"}', 400, "model"),
        ("completions", b'{"model": "gpt-4", "prompt": "x"}', 404, "model"),
        ("completions", b'{"model": "pddemu"}', 400, "prompt"),
        ("completions", b'{"model": "pddemu", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        ("completions", b'{"model": "pddemu", "prompt": "x", "stream": "yes"}', 400, "stream"),
        ("completions", b'{"model": "pddemu", "prompt": "x", "n": 3}', 400, "n"),
        ("chat/completions", b'{"model": "pddemu", "messages": []}', 400, "messages"),
        (
            "chat/completions",
            b'{"model": "pddemu", "messages": [{"content": "x"}]}',
            400,
            "messages[0]",
        ),
    ],
)
def test_malformed_requests_get_openai_errors(
    server, path: str, body: bytes, status: int, param: str | None
) -> None:
    code, reply = post(f"{server['base_url']}/{path}", body)
    assert code == status
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
