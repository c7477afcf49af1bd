"""TUN devices: the userspace shaper reads a namespace's outgoing IP packets from one and
writes them, shaped, into another, where the kernel receives them as incoming packets."""

from __future__ import annotations

import fcntl
import os
import struct

from netem import nsutil

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
DEFAULT_TUN_DEVICE = "/dev/net/tun"


class TunUnavailable(OSError):
    """The TUN clone device cannot be opened (missing module or permissions)."""


def open_tun(ifname: str, netns: str, device: str = DEFAULT_TUN_DEVICE) -> int:
    """Create TUN interface `ifname` inside `netns`; returns its non-blocking fd.

    The interface exists as long as the fd is open: when the shaper dies, the kernel removes
    its interfaces, so a crash leaves no TUN behind.
    """
    try:
        # The interface is created in the namespace the clone device was opened in.
        with nsutil.inside(netns):
            fd = os.open(device, os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise TunUnavailable(
            exc.errno,
            f"cannot open {device}: {exc.strerror}. The userspace shaper needs TUN: load the "
            f"'tun' module, and when not root make the device usable (Debian's default is "
            f"'chmod 0666 {device}'), or run as root",
        ) from None
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    except BaseException:
        os.close(fd)
        raise
    return fd
