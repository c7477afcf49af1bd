"""Running without root: move this process into a private user + network + mount namespace.

Inside, the process is root over namespaces it owns, so it can make the run's namespaces,
links and TUN devices; a private tmpfs on /run holds their names. Everything the run makes
lives inside and disappears with the last process, so nothing can leak to the real host.
Must be called before any thread starts (the kernel refuses a new user namespace otherwise).
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

from netem import nsutil

MS_REC = 0x4000
MS_PRIVATE = 1 << 18


class RootlessError(RuntimeError):
    """No way to get the privileges the network needs."""


def enter_user_namespace() -> None:
    threads = len(os.listdir("/proc/self/task"))  # native ones too (BLAS, torch), not just Python's
    if threads > 1:
        raise RootlessError(
            f"a user namespace must be entered before any thread starts ({threads} are running)"
        )
    uid, gid = os.geteuid(), os.getegid()
    try:
        nsutil.unshare(nsutil.CLONE_NEWUSER | nsutil.CLONE_NEWNS | nsutil.CLONE_NEWNET)
    except OSError as exc:
        raise RootlessError(
            "cannot create an unprivileged user namespace "
            f"({os.strerror(exc.errno or 0)}); run as root, "
            "or allow user namespaces (sysctl user.max_user_namespaces=15000, and on Debian/Ubuntu "
            "kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0)"
        ) from None
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        raise RootlessError(f"cannot make mounts private: {os.strerror(ctypes.get_errno())}")
    if libc.mount(b"tmpfs", b"/run", b"tmpfs", 0, b"mode=0755") != 0:
        err = ctypes.get_errno()
        raise RootlessError(
            f"cannot mount a private /run: {os.strerror(err)} ({errno.errorcode.get(err)})"
        )
    nsutil.NETNS_DIR.mkdir(parents=True, exist_ok=True)
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")


def needed() -> bool:
    """Whether this process lacks the privileges to make namespaces itself."""
    return os.geteuid() != 0


def ensure_network_privileges(force: bool = False) -> None:
    """Root, or root of a private user namespace (always one when `force`: the non-root path,
    taken as root); RootlessError naming the fix where the kernel refuses."""
    if force or needed():
        try:
            enter_user_namespace()
        except RootlessError as error:
            raise RootlessError(f"not root, and {error}" if needed() else str(error)) from None
