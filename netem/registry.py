"""Book-keeping of runs, so that nothing a run made outlives it.

Each run has a directory under the state dir (`/run/netem/runs/<name>`) recording its
controller pid, its namespaces, its host link and its address slot. Cleanup works from that
record alone, so it can be done by the run itself, by its guardian after the controller was
killed, by `netem down --name`, or by `netem down --all`. Address slots are claimed with an
atomic mkdir so that parallel runs never share addresses.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError

from netem import nsutil

NAMESPACE_PREFIX = "netem-"
HOST_LINK_PREFIX = "nmh"
MAX_SLOT = 8191  # /29 blocks in 198.18.0.0/16 (slot 0 unused)
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789-")
MAX_NAME = 24


class RunError(RuntimeError):
    """A run that cannot be claimed, found or stopped."""


def state_dir() -> Path:
    """Where run records live: /run/netem for root (including root of a private user
    namespace, whose /run is its own), a per-user directory otherwise."""
    if os.geteuid() == 0:
        return Path("/run/netem")
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/netem-{os.getuid()}"
    return Path(base) / "netem"


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME or not set(name) <= NAME_CHARS or name[0] == "-":
        raise RunError(
            f"bad run name {name!r}: use 1-{MAX_NAME} characters from a-z, 0-9 and '-', "
            "not starting with '-'"
        )
    return name


def namespace_name(run: str, host: str) -> str:
    return f"{NAMESPACE_PREFIX}{run}-{host}"


def process_start(pid: int) -> int | None:
    """Start time of a process (to tell a live controller from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_alive(pid: int, start: int | None) -> bool:
    current = process_start(pid)
    return current is not None and (start is None or current == start)


@dataclass
class RunRecord:
    name: str
    slot: int
    pid: int
    pid_start: int | None
    backend: str = ""
    namespaces: list[str] = field(default_factory=list)
    host_link: str = ""  # recorded once created, so cleanup never removes someone else's
    shaper_pid: int | None = None
    shaper_start: int | None = None
    control: str = ""
    links: dict[str, dict] = field(default_factory=dict)  # name -> {"a2b", "b2a", "shaper"}
    created: float = field(default_factory=time.time)

    @property
    def alive(self) -> bool:
        return process_alive(self.pid, self.pid_start)


def run_of_namespace(ns: str) -> str | None:
    """The run a namespace of ours belongs to (`netem-<run>-<host>`; run names may hold '-')."""
    if not ns.startswith(NAMESPACE_PREFIX):
        return None
    run, _, host = ns[len(NAMESPACE_PREFIX) :].rpartition("-")
    return run if run and host else None


class Registry:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()
        self.runs = self.root / "runs"
        self.slots = self.root / "slots"

    def run_dir(self, name: str) -> Path:
        return self.runs / name

    def claim(self, name: str) -> RunRecord:
        """Reserve a run name and an address slot for the calling process.

        The run's directory appears complete with its record (built under a private name,
        then renamed into place), so another process never sees a run without an owner.
        """
        check_name(name)
        self.runs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.slots.mkdir(parents=True, exist_ok=True, mode=0o700)
        slot = self._claim_slot(name)
        record = RunRecord(
            name=name, slot=slot, pid=os.getpid(), pid_start=process_start(os.getpid())
        )
        staging = self.runs / f".claim-{os.getpid()}-{secrets.token_hex(4)}"
        staging.mkdir()
        self._write(staging / "run.json", record)
        try:
            for _attempt in range(2):
                # rename() would replace an empty directory: look first; a run created between
                # the look and the rename holds its record, so the rename then fails instead.
                if not self.run_dir(name).exists():
                    try:
                        staging.rename(self.run_dir(name))
                        return record
                    except OSError as exc:
                        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                            raise
                existing = self.load(name)
                if existing is None or existing.alive:
                    owner = f" (controller pid {existing.pid})" if existing else ""
                    raise RunError(f"run {name!r} is already up{owner}") from None
                self.cleanup(name)
            raise RunError(f"run {name!r} could not be claimed")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(self.slots / str(slot), ignore_errors=True)
            raise

    def _claim_slot(self, name: str) -> int:
        for slot in range(1, MAX_SLOT + 1):
            path = self.slots / str(slot)
            try:
                path.mkdir()
            except FileExistsError:
                continue
            (path / "run").write_text(name)
            return slot
        raise RunError(
            f"all {MAX_SLOT} address slots are taken: `netem down --stale` frees stale ones"
        )

    def save(self, record: RunRecord) -> None:
        self._write(self.run_dir(record.name) / "run.json", record)

    @staticmethod
    def _write(path: Path, record: RunRecord) -> None:
        """Write through a private temporary file and rename: readers never see half a record."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        tmp.write_text(json.dumps(asdict(record), indent=1))
        tmp.replace(path)

    @contextmanager
    def locked(self, name: str) -> Iterator[None]:
        """Serialise read-modify-write of a run's record between processes (`netem set`)."""
        if not self.run_dir(name).is_dir():
            raise RunError(f"no run named {name!r} (netem ls lists the runs)")
        with open(self.run_dir(name) / "lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def load(self, name: str) -> RunRecord | None:
        try:
            data = json.loads((self.run_dir(name) / "run.json").read_text())
        except (OSError, ValueError):
            return None
        return RunRecord(**data)

    def names(self) -> list[str]:
        if not self.runs.is_dir():
            return []
        return sorted(
            p.name for p in self.runs.iterdir() if p.is_dir() and not p.name.startswith(".")
        )

    def cleanup(self, name: str, owner: tuple[int, int | None] | None = None) -> list[str]:
        """Remove everything run `name` made; safe to call twice. Returns what it removed.

        With `owner` (pid, start time), only a run that controller owned is touched: a guardian
        arriving late must not remove a new run that took the name meanwhile. Every step is
        tried whatever happened to the ones before it.
        """
        record = self.load(name)
        if owner is not None and record is not None and (record.pid, record.pid_start) != owner:
            return []
        removed: list[str] = []
        failures: list[str] = []

        def step(what: str, action: Callable[[], bool]) -> None:
            try:
                if action():
                    removed.append(what)
            except (OSError, NetlinkError) as exc:
                failures.append(f"{what}: {exc}")

        if record and record.shaper_pid and process_alive(record.shaper_pid, record.shaper_start):
            step(f"process {record.shaper_pid}", lambda: _kill(record.shaper_pid))
        if record and record.host_link:
            step(f"link {record.host_link}", lambda: remove_host_link(record.host_link))
        namespaces = set(record.namespaces if record else [])
        namespaces |= {ns for ns in list_namespaces() if run_of_namespace(ns) == name}
        for ns in sorted(namespaces):
            removed += [f"process {pid}" for pid in kill_namespace_processes(ns)]
            step(f"netns {ns}", lambda ns=ns: remove_namespace(ns))
        if record:
            shutil.rmtree(self.slots / str(record.slot), ignore_errors=True)
        else:
            for slot in self.slots.glob("*/run") if self.slots.is_dir() else []:
                if slot.read_text() == name:
                    shutil.rmtree(slot.parent, ignore_errors=True)
        shutil.rmtree(self.run_dir(name), ignore_errors=True)
        if failures:
            raise RunError(f"cleanup of run {name!r} incomplete: {'; '.join(failures)}")
        return removed

    def orphans(self) -> tuple[list[str], list[str]]:
        """Namespaces and host links that look like ours but belong to no recorded run."""
        live = set(self.names())
        namespaces = [
            ns for ns in list_namespaces() if (run := run_of_namespace(ns)) and run not in live
        ]
        with IPRoute() as ipr:
            links = [
                link.get("ifname")
                for link in ipr.get_links()
                if str(link.get("ifname", "")).startswith(HOST_LINK_PREFIX)
            ]
        recorded = {r.host_link for r in (self.load(n) for n in live) if r}
        claimed = {str(slot) for slot in self._slot_numbers()}
        return namespaces, [
            link
            for link in links
            if link not in recorded and link[len(HOST_LINK_PREFIX) :] not in claimed
        ]

    def _slot_numbers(self) -> list[int]:
        if not self.slots.is_dir():
            return []
        return [int(p.name) for p in self.slots.iterdir() if p.name.isdigit()]


def list_namespaces() -> list[str]:
    try:
        return sorted(netns.listnetns())
    except OSError:
        return []


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False


def kill_namespace_processes(ns: str) -> list[int]:
    """SIGKILL every process whose network namespace is `ns` (left by a crashed run)."""
    try:
        target = os.stat(nsutil.netns_path(ns))
    except OSError:
        return []
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            info = os.stat(entry / "ns" / "net")
        except OSError:
            continue
        if (info.st_ino, info.st_dev) == (target.st_ino, target.st_dev) and _kill(int(entry.name)):
            killed.append(int(entry.name))
    return killed


def remove_namespace(ns: str) -> bool:
    try:
        netns.remove(ns)
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.EINVAL):
            return False
        raise


def remove_host_link(ifname: str) -> bool:
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return False
        try:
            ipr.link("del", index=found[0])
        except NetlinkError as exc:
            if exc.code == errno.ENODEV:  # gone with its namespace meanwhile
                return False
            raise
        return True
