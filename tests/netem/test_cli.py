"""The `netem` command: one-line errors, the ready line, and teardown on every way out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from netem.registry import Registry, list_namespaces

NETEM = [sys.executable, "-m", "netem.cli"]


def ping_from_a(run_name: str, address: str, *options: str) -> subprocess.CompletedProcess:
    """Two pings from DC A to `address`, through `netem exec` (what a user would type)."""
    command = ["ping", "-n", "-c", "2", "-i", "0.1", *options, address]
    return subprocess.run(
        [*NETEM, "exec", "--name", run_name, "--host", "a", "--", *command],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--delay", "-5ms"], "negative"),
        (["up", "--loss", "150%"], "over 100%"),
        (["up", "--rate", "10furlongs"], "unknown rate unit"),
        (["up", "--delay", "20"], "unknown time unit"),
        (["up", "--a2b", "speed=1mbit"], "unknown link field"),
        (["up", "--backend", "magic"], "invalid choice"),
        (["up", "--name", "Bad_Name"], "bad run name"),
        (["bench", "--only", "delay,warp", "--out", os.devnull], "no step warp"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args: list[str], needle: str) -> None:
    done = subprocess.run(NETEM + args, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [["set", "--rate", "10mbit"], ["link", "down"], ["link", "--link", "intra", "up"]],
)
def test_changing_a_run_that_does_not_exist_is_one_line(args: list[str]) -> None:
    name = f"absent-{os.getpid()}"
    done = subprocess.run(
        [*NETEM, args[0], "--name", name, *args[1:]], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert done.stderr.strip() == f"netem: no run named {name!r} (netem ls lists the runs)"


def start(name: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    process = subprocess.Popen(
        [*NETEM, "up", "--name", name, "--delay", "5ms", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    assert line, process.stderr.read()
    return process, json.loads(line)


def gone(name: str, pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        namespaces = [ns for ns in list_namespaces() if ns.startswith(f"netem-{name}-")]
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]
        if not namespaces and not alive and name not in Registry().names():
            return True
        time.sleep(0.1)
    return False


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_ready_line_matches_the_interface(run_name: str) -> None:
    process, ready = start(run_name)
    try:
        assert ready["ready"] is True and ready["backend"] in ("userspace", "kernel")
        for side in ("a", "b"):
            assert ready[side]["netns"] in list_namespaces()
            assert ready[side]["addr"].startswith(("198.18.", "198.19."))
        listing = subprocess.run(
            [*NETEM, "ls", "--json"], capture_output=True, text=True, check=True
        )
        assert run_name in [r["name"] for r in json.loads(listing.stdout)]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(15) == 0
    assert gone(run_name, [])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_removes_everything(run_name: str, signum: int) -> None:
    process, ready = start(run_name)
    shaper = Registry().load(run_name).shaper_pid
    process.send_signal(signum)
    assert process.wait(15) == 0
    assert gone(run_name, [shaper])


def test_sigkill_of_the_controller_is_cleaned_up_by_the_guardian(run_name: str) -> None:
    process, ready = start(run_name)
    record = Registry().load(run_name)
    inside = subprocess.Popen(
        [*NETEM, "exec", "--name", run_name, "--host", "b", "--", "sleep", "300"],
    )
    time.sleep(0.5)
    process.kill()
    process.wait()
    assert gone(run_name, [record.shaper_pid, inside.pid])
    inside.wait(5)


def test_down_stale_removes_dead_runs_only(run_name: str) -> None:
    process, ready = start(run_name)
    record = Registry().load(run_name)
    guardian = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and f"netem.guardian\0{run_name}".encode() in open(f"/proc/{p}/cmdline", "rb").read()
    ]
    for pid in guardian:  # a crash that takes the guardian along: only `down` is left
        os.kill(pid, signal.SIGKILL)
    process.kill()
    process.wait()
    time.sleep(0.3)
    assert [ns for ns in list_namespaces() if ns.startswith(f"netem-{run_name}-")]
    live, _ = start(run_name + "live")
    try:
        done = subprocess.run(
            [*NETEM, "down", "--stale"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert gone(run_name, [record.shaper_pid])
        assert live.poll() is None and run_name + "live" in Registry().names()  # live runs stay
    finally:
        live.terminate()
        live.wait(15)


def test_live_change_from_another_process(run_name: str) -> None:
    process, ready = start(run_name)
    try:
        done = subprocess.run(
            [*NETEM, "set", "--name", run_name, "--delay", "30ms", "--dir", "a2b"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["a2b"]["delay_s"] == pytest.approx(0.03)
        out = ping_from_a(run_name, ready["b"]["addr"]).stdout
        assert "time=3" in out  # 30 + 5 ms
        down = subprocess.run(
            [*NETEM, "link", "--name", run_name, "down"], capture_output=True, text=True
        )
        assert down.returncode == 0, down.stderr
        lost = ping_from_a(run_name, ready["b"]["addr"], "-W", "1")
        assert lost.returncode != 0 and " 0 received" in lost.stdout
        missing = subprocess.run(
            [*NETEM, "link", "--name", run_name, "--link", "intra", "down"],
            capture_output=True,
            text=True,
        )
        assert (
            missing.returncode == 1
            and missing.stderr.count("\n") == 1
            and "no link 'intra'" in missing.stderr
        )
    finally:
        process.terminate()
        process.wait(15)


def test_rootless_mode_in_a_user_namespace(run_name: str, tmp_path) -> None:
    """The code path a non-root user takes, exercised as root with --rootless: the run lives
    in a private user+net+mount namespace and its links carry traffic."""
    script = tmp_path / "rootless_check.py"
    script.write_text(
        "import json, subprocess, sys\n"
        "from netem import rootless\n"
        "rootless.enter_user_namespace()\n"
        "from netem.topology import Network, LinkConfig\n"
        "from netem.spec import LinkSpec\n"
        "from netem.nsexec import command_in\n"
        f"with Network(LinkConfig.symmetric(LinkSpec(delay_s=0.005)), name='{run_name}', backend='userspace') as net:\n"
        "    out = subprocess.run(command_in(net.a.netns, ['ping', '-n', '-c', '3', '-i', '0.1', net.b.addr]),\n"
        "                         capture_output=True, text=True).stdout\n"
        "    print(json.dumps({'uid_map': open('/proc/self/uid_map').read().split(), 'ping': out}))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["uid_map"] == ["0", "0", "1"]
    assert "3 received" in result["ping"]
    assert not [
        ns for ns in list_namespaces() if ns.startswith(f"netem-{run_name}-")
    ]  # never on the host


def test_disciplines_schedules_and_cross_traffic_from_the_command_line(
    run_name: str, tmp_path
) -> None:
    schedule = tmp_path / "wan.schedule"
    schedule.write_text("0.3 b2a.link=down\n60 b2a.link=up\n")
    process, ready = start(
        run_name,
        "--rate",
        "20mbit",
        "--qdisc",
        "fq_codel",
        "--schedule",
        str(schedule),
        "--cross-traffic",
        "utilisation=0.2,mean=20kb,arrivals=paced,dir=a2b",
    )
    try:
        assert ready["cross_traffic"]["a"].startswith("198.18.")
        # from the schedule's 0.3 s on, replies cannot return (ready can come before it)
        deadline = time.monotonic() + 10.0
        while ping_from_a(run_name, ready["b"]["addr"]).returncode == 0:
            assert time.monotonic() < deadline, "the b2a outage never stopped the replies"
        changed = subprocess.run(
            [*NETEM, "set", "--name", run_name, "--dir", "a2b", "--qdisc", "prio:fq"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert changed.returncode == 0, changed.stderr
        assert json.loads(changed.stdout)["a2b"]["qdisc"] == "prio:fq"
        stats = json.loads(
            subprocess.run(
                [*NETEM, "ls", "--json"], capture_output=True, text=True, check=True
            ).stdout
        )
        assert run_name in [r["name"] for r in stats]
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    report = json.loads(err.split("netem: cross-traffic: ", 1)[1].splitlines()[0])
    assert report["directions"]["a2b"]["flows"] > 0  # flows start; the b2a outage stalls them
    assert gone(run_name, [])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--qdisc", "red"], "unknown qdisc"),
        (["up", "--cross-traffic", "utilisation=2"], "in [0, 1]"),
        (["up", "--schedule", "/nonexistent/schedule"], "cannot read schedule"),
    ],
)
def test_bad_wan_options_get_one_line(args: list[str], needle: str) -> None:
    done = subprocess.run(NETEM + args, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
