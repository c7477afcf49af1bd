"""An instance's stop, as its process does it (`Instance.run`, then the loop closed without
cancelling what is left): no task serving a connection is left pending."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import pytest
import uvloop

from pddemu.roles.relay import RelayInstance
from tests.roles.in_process import instance


def test_an_instance_stopping_leaves_no_connection_task_pending(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three peers connected, each connection's task waiting for its hello (a relay's
    connections are read by the stream transport, not dated): closed and awaited at the stop,
    none is destroyed pending with the loop. On the code before, each was."""

    async def scenario() -> list[socket.socket]:
        rld = instance(RelayInstance, "RLD")
        server = await asyncio.start_server(rld._accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        while len(rld._accepting) < len(clients):
            await asyncio.sleep(0.01)
        await rld.close_connections(server)
        assert not rld._accepting
        return clients

    loop = uvloop.new_event_loop()
    try:
        clients = loop.run_until_complete(scenario())
    finally:
        loop.close()
    gc.collect()
    for client in clients:
        client.close()
    noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not noise, noise
