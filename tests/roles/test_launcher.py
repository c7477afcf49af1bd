"""Instances forked from the launcher (`pddemu.roles.launcher`) are what a deployment started
itself before: its children (their exit status read), named `python -m pddemu.roles SPEC` in
/proc, their stderr in their file, ended with the process that made them; and an instance that
stops ends at once, its files flushed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from pddemu.config import config_to_json, load_config
from pddemu.roles import launcher as launcher_module
from pddemu.roles.launcher import Launcher
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.auth import RunSecret

START_TIMEOUT_S = 60.0  # wall seconds: the launcher imports torch first, on a busy host


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def frontend_spec(directory: Path) -> tuple[Path, str]:
    """A frontend alone, in this process's namespace, on real time: its spec's path and URL."""
    me = Address("FE0", "FE", "127.0.0.1", free_port(), free_port())
    spec = InstanceSpec(
        me,
        "pdd",
        "/proc/self/ns/net",
        {"FE0": me},
        config_to_json(load_config()),
        time.monotonic(),
        log_path=str(directory / "FE0.log"),
    )
    path = directory / "FE0.json"
    path.write_text(spec.to_json())
    return path, f"http://127.0.0.1:{me.http_port}"


def wait_healthy(url: str, pid: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert Path(f"/proc/{pid}").exists(), "the instance has exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise AssertionError("the instance did not answer")


def state_of(pid: int) -> str | None:
    """The process's state letter (Z: ended, not yet reaped), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    made = Launcher(tmp_path_factory.mktemp("launcher") / "launcher.err")
    try:
        yield made
    finally:
        made.close()


def test_a_forked_instance_is_this_process_child_named_as_one_started_and_stops_at_once(
    launcher: Launcher, tmp_path: Path
) -> None:
    spec_path, url = frontend_spec(tmp_path)
    secret = RunSecret.new()
    process = asyncio.run(launcher.launch(spec_path, tmp_path / "FE0.err", secret.line()))
    try:
        wait_healthy(url, process.pid)
        assert parent_of(process.pid) == os.getpid()
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        assert cmdline == [os.fsencode(a) for a in (sys.executable, "-m", "pddemu.roles")] + [
            os.fsencode(spec_path)
        ]
        assert process.poll() is None
        shutdown = urllib.request.Request(
            url + "/shutdown", method="POST", headers=secret.headers(), data=b""
        )
        with urllib.request.urlopen(shutdown, timeout=10) as reply:
            assert reply.status == 200
        assert process.wait(30) == 0
    finally:
        process.kill()
        process.wait(30)


def test_an_instance_that_cannot_start_exits_with_the_reason_in_its_stderr(
    launcher: Launcher, tmp_path: Path
) -> None:
    absent = launcher.launch(tmp_path / "absent.json", tmp_path / "P0.err", RunSecret.new().line())
    process = asyncio.run(absent)
    assert process.wait(30) == 1
    assert "absent.json" in (tmp_path / "P0.err").read_text()


def test_forked_instances_die_with_the_process_that_launched_them(tmp_path: Path) -> None:
    """The orchestrator SIGKILLed (nothing of it runs after): the instance and the launcher
    end too."""
    spec_path, url = frontend_spec(tmp_path)
    orchestrator = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import asyncio, json, sys, time
                from pathlib import Path
                from pddemu.roles.launcher import Launcher
                from pddemu.runtime.auth import RunSecret
                launcher = Launcher(Path({str(tmp_path / "launcher.err")!r}))
                process = asyncio.run(launcher.launch(
                    Path({str(spec_path)!r}), Path({str(tmp_path / "FE0.err")!r}),
                    RunSecret.new().line(),
                ))
                print(json.dumps([launcher.process.pid, process.pid]), flush=True)
                time.sleep(600)
                """
            ),
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert orchestrator.stdout is not None
        launcher_pid, instance_pid = json.loads(orchestrator.stdout.readline())
        wait_healthy(url, instance_pid)
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if state_of(instance_pid) in (None, "Z") and state_of(launcher_pid) in (None, "Z"):
                break
            time.sleep(0.05)
        assert state_of(instance_pid) in (None, "Z")
        assert state_of(launcher_pid) in (None, "Z")
    finally:
        orchestrator.kill()
        orchestrator.wait()


def test_an_instance_ends_at_once_with_its_log_written(tmp_path: Path) -> None:
    """`exit_at_once`: the exit status given, the log flushed, no interpreter finalization
    (an exit handler does not run)."""
    log = tmp_path / "instance.log"
    script = textwrap.dedent(
        f"""
        import atexit, logging
        from pddemu.roles.__main__ import exit_at_once
        logging.basicConfig(filename={str(log)!r})
        logging.getLogger("pddemu").warning("the last line")
        atexit.register(print, "finalized")
        exit_at_once(3)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 3
    assert "the last line" in log.read_text()
    assert "finalized" not in done.stdout


def test_a_command_line_that_cannot_be_written_is_said_and_kept(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host that does not let a process write its own memory: the instance runs on under the
    launcher's command line (the write raised before, and ended the instance)."""
    before = Path("/proc/self/cmdline").read_bytes()

    def refused(path: str, *args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(launcher_module, "open", refused, raising=False)
    launcher_module.set_command_line(["python", "-m", "pddemu.roles", "FE0.json"])
    assert "FE0.json was not set: [Errno 13] Permission denied" in capsys.readouterr().err
    assert Path("/proc/self/cmdline").read_bytes() == before


def test_a_launcher_that_does_not_answer_is_said_stuck_and_the_loop_runs_on(
    tmp_path: Path,
) -> None:
    """A stopped launcher never answers: the launch ends in a clear error within its timeout,
    the event loop having run on meanwhile, and the launcher is ended."""
    stuck = Launcher(tmp_path / "launcher.err")
    try:
        stuck.process.send_signal(signal.SIGSTOP)
        ticks = 0

        async def launch_while_ticking() -> str:
            nonlocal ticks

            async def tick() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            ticking = asyncio.ensure_future(tick())
            try:
                spec, err = tmp_path / "P0.json", tmp_path / "P0.err"
                await stuck.launch(spec, err, b"x\n", timeout_s=0.5)
            except launcher_module.LaunchError as error:
                return str(error)
            finally:
                ticking.cancel()
            return "launched"

        began = time.monotonic()
        error = asyncio.run(asyncio.wait_for(launch_while_ticking(), 10))
        assert "did not answer" in error and "P0" in error, error
        assert time.monotonic() - began < 5
        assert ticks >= 10  # the loop ran while the launcher was waited for
        assert stuck.process.wait(5) is not None  # the stuck launcher was ended
    finally:
        stuck.close()


def test_an_instance_started_after_a_setting_changed_has_the_setting(
    launcher: Launcher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher started before the deployment's settings: an instance still gets the
    orchestrator's environment as of its launch. Here a malformed PDDEMU_STALL (set after the
    launcher started) reaches the frontend, which ends on it, saying so."""
    monkeypatch.setenv("PDDEMU_STALL", "FE0")
    spec_path, _ = frontend_spec(tmp_path)
    err = tmp_path / "FE0.err"
    process = asyncio.run(launcher.launch(spec_path, err, RunSecret.new().line()))
    try:
        assert process.wait(START_TIMEOUT_S) == 1
        assert "PDDEMU_STALL: 'FE0' is not" in err.read_text()
    finally:
        process.kill()
        process.wait(30)


def test_an_instance_not_adopted_says_why_in_its_stderr(tmp_path: Path) -> None:
    """An instance whose orchestrator never became its parent exits without its descriptors:
    its .err file says why."""
    err = tmp_path / "P0.err"
    request = {"spec": str(tmp_path / "P0.json"), "stderr": str(err), "keep_fds": []}
    script = (
        "from pddemu.roles.launcher import become_instance\n"
        f"become_instance({request!r}, orchestrator=1, middle=-1)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == launcher_module.NOT_ADOPTED_EXIT
    assert "not adopted by its orchestrator (pid 1)" in err.read_text()


def test_an_instance_that_runs_after_its_middle_process_ended_starts_at_once(
    tmp_path: Path,
) -> None:
    """The instance forked by a middle process that has already exited when the instance first
    runs (its parent the orchestrator by then: on 2 busy cores, the order of one point in three)
    goes on at once, not after REPARENT_TIMEOUT_S (it took the orchestrator for the middle)."""
    err = tmp_path / "P0.err"
    absent = tmp_path / "P0.json"  # the instance ends at its spec, once it has been adopted
    script = textwrap.dedent(
        f"""
        import os, time
        from pddemu.roles import launcher
        from pddemu.runtime.auth import RunSecret

        launcher._prctl(launcher.PR_SET_CHILD_SUBREAPER, 1)  # adopts, as the orchestrator
        real_fork = os.fork

        def child_runs_late():
            pid = real_fork()
            if pid == 0:
                time.sleep(0.3)  # the new process runs after its parent: the middle has exited
            return pid

        os.fork = child_runs_late
        request = {{"spec": {str(absent)!r}, "stderr": {str(err)!r}, "keep_fds": [],
                   "environ": dict(os.environ), "secret": RunSecret.new().line().decode()}}
        started = time.monotonic()
        instance = launcher.fork_instance(request, os.getpid())
        os.waitpid(instance, 0)
        print(time.monotonic() - started)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert str(absent) in err.read_text()  # it went past the adoption to its spec
    assert float(done.stdout) < launcher_module.REPARENT_TIMEOUT_S / 2


def test_a_failed_fork_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """In a process of one thread, as the launcher is: os.fork raising leaves the pipe closed."""
    script = textwrap.dedent(
        """
        import os
        from pddemu.roles import launcher

        def refused():
            raise BlockingIOError(11, "Resource temporarily unavailable")

        os.fork = refused
        before = sorted(os.listdir("/proc/self/fd"))
        try:
            launcher.fork_instance({}, os.getppid())
        except BlockingIOError:
            pass
        print(before == sorted(os.listdir("/proc/self/fd")))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "True", done.stderr


def test_an_instance_forked_for_a_cancelled_launch_is_ended(
    launcher: Launcher, tmp_path: Path
) -> None:
    """A deployment's start cancelled (Ctrl-C) while the launcher forks: the instance it
    forked for no one (a child of this process) is killed once the answer comes. A launch
    asked after it is answered after it."""
    spec_path, _ = frontend_spec(tmp_path)

    def live_children() -> set[int]:
        return {
            int(entry.name)
            for entry in Path("/proc").iterdir()
            if entry.name.isdigit()
            and state_of(int(entry.name)) not in (None, "Z")
            and parent_of_or_none(int(entry.name)) == os.getpid()
        }

    before = live_children()

    async def cancel_a_launch() -> set[int]:
        secret = RunSecret.new().line()
        launching = asyncio.ensure_future(launcher.launch(spec_path, tmp_path / "FE0.err", secret))
        await asyncio.sleep(0)  # asked
        launching.cancel()
        after = await launcher.launch(tmp_path / "absent.json", tmp_path / "P0.err", secret)
        assert after.wait(30) == 1
        deadline = time.monotonic() + 10
        while live_children() - before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return live_children() - before

    left = asyncio.run(cancel_a_launch())
    for pid in left:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert left == set()


def parent_of_or_none(pid: int) -> int | None:
    try:
        return parent_of(pid)
    except (OSError, IndexError, ValueError):
        return None


def test_an_orphan_of_another_process_is_not_left_a_zombie_of_this_one(
    launcher: Launcher, tmp_path: Path
) -> None:
    """The orchestrator adopts orphans only while a launch waits for its instance: a process
    orphaned afterwards (here a shell's background `sleep`, as an emulate killed by a test
    leaves its launcher and instances) goes to an ancestor that reaps it. On the code before,
    the orchestrator stayed a child subreaper from its first launcher on: the orphan became
    its child, and a zombie of it once ended (it reaps its instances only)."""
    launched = asyncio.run(
        launcher.launch(tmp_path / "absent.json", tmp_path / "P0.err", RunSecret.new().line())
    )
    assert launched.wait(30) == 1  # adopted and reaped: the launch itself still works
    shell = subprocess.run(
        ["sh", "-c", "sleep 0.2 & echo $!"], capture_output=True, text=True, check=True
    )
    orphan = int(shell.stdout)
    deadline = time.monotonic() + 10
    while state_of(orphan) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    adopted = parent_of_or_none(orphan) == os.getpid()
    if adopted:
        os.waitpid(orphan, 0)  # not left behind, whatever the verdict
    assert not adopted
