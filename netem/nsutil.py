"""Entering network namespaces from Python (3.11 has no os.setns) and per-namespace sysctls.

`setns` moves only the calling thread, so callers keep namespace work on one thread and go
back when done (`inside`). Processes that should live in a namespace enter it once at start.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), "setns")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def netns_path(name: str) -> Path:
    """Path of a named namespace, or the name itself when it is already a path."""
    return Path(name) if "/" in name else NETNS_DIR / name


def enter(name: str) -> None:
    """Move the calling thread (for good) into the named network namespace."""
    fd = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd, CLONE_NEWNET)
    finally:
        os.close(fd)


@contextmanager
def inside(name: str) -> Iterator[None]:
    """Run a block in the named network namespace, then return to where the thread was."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        enter(name)
        try:
            yield
        finally:
            setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


def write_sysctl(netns: str, key: str, value: str) -> None:
    """Set a network sysctl (e.g. 'net.ipv4.ip_forward') inside a namespace."""
    with inside(netns):
        Path("/proc/sys", *key.split(".")).write_text(value)
