"""Instance processes forked from one launcher that has imported the roles' code once.

An instance started by `python -m pddemu.roles` spends seconds of CPU importing torch and the
roles before it can answer; a deployment's six instances starting at once on two cores paid
that six times over, and it was most of a short run's wall time. The launcher
(`python -m pddemu.roles.launcher`: `pddemu emulate` and `pddemu validate` start one before
their own imports, for all their deployments; any other deployment starts its own) imports it
all once and forks each instance from itself on request, single-threaded (nothing of torch
runs in it before a fork).

Each instance is forked twice, the middle process exiting at once, so that it becomes a child
of the orchestrator (a child subreaper, PR_SET_CHILD_SUBREAPER, only while a launch waits for
its answer: an orphan adopted at any other time, not an instance, would be left a zombie of
it, which reaps its instances only): the deployment waits for it,
reads its exit status and signals it as it did a process it had started itself
(`InstanceProcess`), and it dies with the orchestrator (PR_SET_PDEATHSIG, set once it is the
orchestrator's child). Its command line reads `python -m pddemu.roles SPEC.json`, as an
instance's started by itself, so `ps` tells the instances apart.

The launcher reads one request a line on its standard input (JSON: the spec's path, the
instance's stderr file, the run's secret, the descriptors it keeps, the orchestrator's
environment as of the launch) and answers the forked
instance's pid, or an error, a line on its standard output. It exits when its input closes,
or is killed by its orchestrator when no longer needed.
"""

from __future__ import annotations

import asyncio
import ctypes
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# Room the launcher's command line keeps for an instance's (`python -m pddemu.roles SPEC`):
# a process's command line is the memory its arguments were given in, never longer.
TITLE_ROOM = 4096
REPARENT_TIMEOUT_S = 10.0  # wall seconds a forked instance waits to become the orchestrator's
NOT_ADOPTED_EXIT = 1  # the exit status of a forked instance that never became its child
LAUNCH_TIMEOUT_S = 120.0  # wall seconds for an answer, the first after torch's import


class LaunchError(RuntimeError):
    """The launcher could not start an instance, or is gone."""


def _prctl(option: int, value: int | ctypes.c_int) -> None:
    argument = ctypes.byref(value) if isinstance(value, ctypes.c_int) else value
    if ctypes.CDLL(None, use_errno=True).prctl(option, argument, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl({option}): {os.strerror(error)}")


class _Adoption:
    """This process a child subreaper while any launch waits for its answer (by then the
    instance's middle process has exited and the instance is this process's child), and as it
    was before the rest of the time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launches = 0
        self._before = 0

    def __enter__(self) -> None:
        with self._lock:
            if self._launches == 0:
                before = ctypes.c_int()
                _prctl(PR_GET_CHILD_SUBREAPER, before)
                self._before = before.value
                _prctl(PR_SET_CHILD_SUBREAPER, 1)
            self._launches += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._launches -= 1
            if self._launches == 0 and not self._before:
                _prctl(PR_SET_CHILD_SUBREAPER, 0)


_adoption = _Adoption()


# -- the orchestrator's side ---------------------------------------------------------------


class InstanceProcess:
    """A forked instance, as `subprocess.Popen` is to a started one (the calls a deployment
    makes): it is this process's child, so its exit status is read with waitpid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if timeout is not None and not self._ends_within(timeout):
                raise subprocess.TimeoutExpired(f"instance {self.pid}", timeout)
            self._reap(0)
        assert self.returncode is not None
        return self.returncode

    def _ends_within(self, timeout: float) -> bool:
        try:
            fd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # reaped elsewhere: not ours to wait for
            return True
        try:
            return bool(select.select([fd], [], [], max(0.0, timeout))[0])
        finally:
            os.close(fd)

    def _reap(self, options: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, options)
        except ChildProcessError:  # never this process's: it gave up before it became one
            self.returncode = NOT_ADOPTED_EXIT
            return
        if pid == self.pid:
            self.returncode = os.waitstatus_to_exitcode(status)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Launcher:
    """The orchestrator's handle on a launcher process: `launch` forks an instance from it."""

    def __init__(self, log_path: Path | None = None, pass_fds: Sequence[int] = ()) -> None:
        """`pass_fds`: descriptors an instance may keep (`launch`'s `keep_fds`), handed to
        the launcher at their numbers. The launcher's errors go to `log_path` (None: this
        process's stderr)."""
        self.log_path = log_path
        self._asking = threading.Lock()  # a request's answer is the next line read
        log = None if log_path is None else open(log_path, "a")  # noqa: SIM115 - closed below
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "pddemu.roles.launcher", " " * TITLE_ROOM],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                pass_fds=tuple(pass_fds),
            )
        finally:
            if log is not None:
                log.close()

    async def launch(
        self,
        spec_path: Path,
        stderr_path: Path,
        secret_line: bytes,
        keep_fds: Sequence[int] = (),
        timeout_s: float = LAUNCH_TIMEOUT_S,
    ) -> InstanceProcess:
        """Fork the instance `spec_path` describes; its stderr appends to `stderr_path`.
        The launcher's answer (its first waits for its imports) is waited for off the event
        loop, which runs on meanwhile (a fault replayed mid-run restarts an instance); a
        launcher that does not answer within `timeout_s` is stuck: it is ended, and said so."""
        request = {
            "spec": str(spec_path),
            "stderr": str(stderr_path),
            "secret": secret_line.decode(),
            "keep_fds": list(keep_fds),
            "environ": dict(os.environ),  # as of the launch: a started instance's
        }
        asking = asyncio.get_running_loop().run_in_executor(None, self._ask, request)
        try:
            answer = await asyncio.wait_for(asyncio.shield(asking), timeout_s)
        except asyncio.CancelledError:
            asking.add_done_callback(_end_unclaimed)  # forked for no one: no leftover
            raise
        except TimeoutError:
            self.process.kill()  # its pipe closes: the read waiting for it ends
            asking.add_done_callback(_end_unclaimed)  # an answer sent just before: no leftover
            raise LaunchError(
                f"the instance launcher did not answer within {timeout_s:.0f} s"
                f" to start {spec_path.stem}{self._error_tail()}"
            ) from None
        if not answer:
            raise LaunchError(f"the instance launcher has exited{self._error_tail()}")
        reply = json.loads(answer)
        if "error" in reply:
            raise LaunchError(
                f"the instance launcher could not start {spec_path.stem}: " + reply["error"]
            )
        return InstanceProcess(int(reply["pid"]))

    def _ask(self, request: dict[str, Any]) -> bytes:
        """One request and its answer line (empty: the launcher is gone), one at a time."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        with self._asking, _adoption:
            try:
                stdin.write(json.dumps(request).encode() + b"\n")
                stdin.flush()
            except BrokenPipeError:
                pass  # the launcher is gone: its answer below is empty
            return stdout.readline()

    def _error_tail(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""  # on this process's stderr
        text = self.log_path.read_text(errors="replace").strip()
        return f": {text.splitlines()[-1]}" if text else ""

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the launcher at once, whatever it is doing (still importing, when a command
        ends before it deployed anything): it holds nothing of a run, the instances it forked
        being this process's."""
        self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass


def _end_unclaimed(asking: asyncio.Future[bytes]) -> None:
    """The instance a cancelled launch forked (the launcher's answer came after): killed and
    reaped, as the deployment that asked for it would have."""
    if asking.cancelled() or asking.exception() is not None:
        return
    answer = json.loads(asking.result() or b"{}")
    if "pid" in answer:
        unclaimed = InstanceProcess(int(answer["pid"]))
        unclaimed.kill()
        unclaimed.wait()


# -- the launcher process ------------------------------------------------------------------


def serve_requests(requests: IO[bytes], answers: IO[bytes]) -> None:
    """Fork an instance for each request line until `requests` ends."""
    from pddemu.roles.__main__ import role_class

    for role in ("FE", "P", "RLD", "MD"):
        role_class(role)  # the roles' modules, torch with them: imported once, here
    import uvloop  # noqa: F401 - every instance's loop

    orchestrator = os.getppid()
    for line in requests:
        try:
            pid = fork_instance(json.loads(line), orchestrator)
            answer: dict[str, Any] = {"pid": pid}
        except Exception as error:  # noqa: BLE001 - reported to the deployment, which raises
            answer = {"error": f"{type(error).__name__}: {error}"}
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()


def fork_instance(request: dict[str, Any], orchestrator: int) -> int:
    """Fork the instance twice over and return its pid, once the middle process has exited
    (so the instance is the orchestrator's child by then)."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1 or threading.active_count() != 1:
        raise LaunchError(f"the launcher runs {threads} threads: a fork would copy their locks")
    read_end, write_end = os.pipe()
    try:
        middle = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        raise
    if middle == 0:
        os.close(read_end)
        try:
            # the middle's pid taken here, not by the instance: the middle may have exited by
            # the time the instance runs, its parent the orchestrator already, and the instance
            # would then wait out REPARENT_TIMEOUT_S for a reparenting that has happened
            me = os.getpid()
            instance = os.fork()
            if instance == 0:
                os.close(write_end)
                become_instance(request, orchestrator, me)
            os.write(write_end, str(instance).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        text = pipe.read()
    os.waitpid(middle, 0)
    if not text:
        raise LaunchError("the fork failed")
    return int(text)


def become_instance(request: dict[str, Any], orchestrator: int, middle: int) -> None:
    """In the forked process: wait to be the orchestrator's child, take the instance's
    descriptors and command line, and run it. Never returns."""
    try:
        deadline = time.monotonic() + REPARENT_TIMEOUT_S
        while os.getppid() == middle and time.monotonic() < deadline:
            time.sleep(0.0005)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != orchestrator:  # the orchestrator has gone, or reaps no orphans
            with open(request["stderr"], "a") as err:
                err.write(
                    f"pddemu: the forked instance was not adopted by its orchestrator"
                    f" (pid {orchestrator}) within {REPARENT_TIMEOUT_S:.0f} s: it has gone,"
                    " or does not reap orphans (PR_SET_CHILD_SUBREAPER)\n"
                )
            os._exit(NOT_ADOPTED_EXIT)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        take_descriptors(Path(request["stderr"]), request["keep_fds"])
        take_environment(request["environ"])
        spec_path = request["spec"]
        set_command_line([sys.executable, "-m", "pddemu.roles", spec_path])
        from pddemu.roles.__main__ import exit_at_once, serve_instance
        from pddemu.roles.spec import InstanceSpec
        from pddemu.runtime.auth import RunSecret

        secret = RunSecret.read(io.StringIO(request["secret"]))
        serve_instance(InstanceSpec.from_json(Path(spec_path).read_text()), secret)
        exit_at_once(0)
    except BaseException:  # noqa: BLE001 - the instance's end: its stderr says why
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(1)


def take_descriptors(stderr_path: Path, keep: Sequence[int]) -> None:
    """stdin and stdout on /dev/null, stderr on the instance's file, and no descriptor of the
    launcher's left but `keep` (as a started process has)."""
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(stderr_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    kept = sorted({2, *keep})
    low = 3
    for fd in kept:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def take_environment(environ: dict[str, str]) -> None:
    """The orchestrator's environment at the launch (a started instance's would be: the
    launcher's is of when it started, before a deployment's own settings, `PDDEMU_STALL`
    among them), and the intra-op threads it asks for (OMP_NUM_THREADS; unset: one, as
    `python -m pddemu.roles` runs)."""
    os.environ.clear()
    os.environ.update(environ)
    asked = os.environ.setdefault("OMP_NUM_THREADS", "1")
    if asked != "1":
        import torch

        torch.set_num_threads(int(asked))


def set_command_line(argv: Sequence[str]) -> None:
    """Write `argv` over this process's command line (/proc/self/cmdline), within the room
    its arguments were given in; too long, it is cut. A host that does not let a process
    write its own memory keeps the launcher's (said on stderr): only `ps` is the poorer."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        text = b"".join(arg.encode() + b"\0" for arg in argv)[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as memory:
            memory.seek(start)
            memory.write(text.ljust(end - start, b"\0"))
    except OSError as error:
        print(f"pddemu: the command line {' '.join(argv)} was not set: {error}", file=sys.stderr)


def main() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orchestrator ends it (its input closed)
    set_command_line([sys.executable, "-m", "pddemu.roles.launcher"])
    serve_requests(sys.stdin.buffer, sys.stdout.buffer)
    from pddemu.roles.__main__ import exit_at_once

    exit_at_once(0)  # no finalization of what it imported for the instances


if __name__ == "__main__":
    # torch starts OpenMP's threads as it loads unless told to run one; a fork copies no
    # thread. So the launcher loads it with one, and each instance takes the intra-op threads
    # asked for once forked (`take_environment`).
    os.environ["OMP_NUM_THREADS"] = "1"
    main()
