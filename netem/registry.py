"""Book-keeping of runs, so that nothing a run made outlives it.

Each run has a directory under the state dir (`/run/netem/runs/<name>`) recording its
controller pid, its namespaces, its host link and its address slot. Cleanup works from that
record alone, so it can be done by the run itself, by its guardian after the controller was
killed, by `netem down --name`, or by `netem down --all`. Address slots are claimed with an
atomic mkdir so that parallel runs never share addresses.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyroute2 import IPRoute, netns

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


def _process_start(pid: int) -> int | None:
    """Start time of a process (to tell a live controller from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_alive(pid: int, start: int | None) -> bool:
    current = _process_start(pid)
    return current is not None and (start is None or current == start)


@dataclass
class RunRecord:
    name: str
    slot: int
    pid: int
    pid_start: int | None
    backend: str = ""
    namespaces: list[str] = field(default_factory=list)
    host_link: str = ""
    shaper_pid: int | None = None
    control: str = ""
    endpoints: dict[str, dict[str, str]] = field(default_factory=dict)
    links: dict[str, dict] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def alive(self) -> bool:
        return process_alive(self.pid, self.pid_start)


class Registry:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state_dir()
        self.runs = self.root / "runs"
        self.slots = self.root / "slots"

    def run_dir(self, name: str) -> Path:
        return self.runs / name

    def claim(self, name: str) -> RunRecord:
        """Reserve a run name and an address slot for the calling process."""
        check_name(name)
        self.runs.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.slots.mkdir(parents=True, exist_ok=True, mode=0o700)
        for _attempt in range(2):
            try:
                self.run_dir(name).mkdir()
                break
            except FileExistsError:
                record = self.load(name)
                if record is not None and record.alive:
                    raise RunError(
                        f"run {name!r} is already up (controller pid {record.pid})"
                    ) from None
                self.cleanup(name)
        else:
            raise RunError(f"run {name!r} could not be claimed")
        slot = self._claim_slot(name)
        record = RunRecord(
            name=name, slot=slot, pid=os.getpid(), pid_start=_process_start(os.getpid())
        )
        self.save(record)
        return record

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
            f"all {MAX_SLOT} address slots are taken: `netem down --all` frees stale ones"
        )

    def save(self, record: RunRecord) -> None:
        path = self.run_dir(record.name) / "run.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record), indent=1))
        tmp.replace(path)

    def load(self, name: str) -> RunRecord | None:
        try:
            data = json.loads((self.run_dir(name) / "run.json").read_text())
        except (OSError, ValueError):
            return None
        return RunRecord(**data)

    def names(self) -> list[str]:
        if not self.runs.is_dir():
            return []
        return sorted(p.name for p in self.runs.iterdir() if p.is_dir())

    def cleanup(self, name: str) -> list[str]:
        """Remove everything run `name` made; safe to call twice. Returns what it removed."""
        removed: list[str] = []
        record = self.load(name)
        namespaces = set(record.namespaces if record else [])
        namespaces |= {ns for ns in list_namespaces() if ns.startswith(namespace_name(name, ""))}
        if record and record.shaper_pid and _kill(record.shaper_pid):
            removed.append(f"process {record.shaper_pid}")
        for ns in sorted(namespaces):
            removed += [f"process {pid}" for pid in kill_namespace_processes(ns)]
            if remove_namespace(ns):
                removed.append(f"netns {ns}")
        if record and record.host_link and remove_host_link(record.host_link):
            removed.append(f"link {record.host_link}")
        if record:
            shutil.rmtree(self.slots / str(record.slot), ignore_errors=True)
        else:
            for slot in self.slots.glob("*/run") if self.slots.is_dir() else []:
                if slot.read_text() == name:
                    shutil.rmtree(slot.parent, ignore_errors=True)
        shutil.rmtree(self.run_dir(name), ignore_errors=True)
        return removed

    def orphans(self) -> tuple[list[str], list[str]]:
        """Namespaces and host links that look like ours but belong to no recorded run."""
        live = set(self.names())
        namespaces = [
            ns
            for ns in list_namespaces()
            if ns.startswith(NAMESPACE_PREFIX)
            and ns[len(NAMESPACE_PREFIX) :].rsplit("-", 1)[0] not in live
        ]
        with IPRoute() as ipr:
            links = [
                link.get("ifname")
                for link in ipr.get_links()
                if str(link.get("ifname", "")).startswith(HOST_LINK_PREFIX)
            ]
        recorded = {r.host_link for r in (self.load(n) for n in live) if r}
        return namespaces, [link for link in links if link not in recorded]


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
        ipr.link("del", index=found[0])
        return True
