"""The trace replay's metered UDP flow leaves no socket open when it cannot start."""

from __future__ import annotations

import contextlib
import errno
import socket
from types import SimpleNamespace

import pytest

from netem import bench_wan


def test_the_metered_flow_closes_its_receiver_when_the_sender_cannot_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Creating the sender's socket fails (too many open files): the receiver's, opened first,
    is closed, not leaked."""
    opened: list[socket.socket] = []
    real_socket = socket.socket

    def second_fails(*args: object) -> socket.socket:
        if opened:
            raise OSError(errno.EMFILE, "Too many open files")
        opened.append(real_socket(socket.AF_INET, socket.SOCK_DGRAM))
        return opened[-1]

    monkeypatch.setattr(bench_wan.nsutil, "inside", lambda _netns: contextlib.nullcontext())
    monkeypatch.setattr(bench_wan.socket, "socket", second_fails)
    net = SimpleNamespace(a=SimpleNamespace(netns="a"), b=SimpleNamespace(netns="b"))
    with pytest.raises(OSError, match="Too many open files"):
        bench_wan._metered_udp_flow(net, 0.1)  # type: ignore[arg-type]
    assert opened and opened[0].fileno() == -1, "the receiver's socket was left open"
