"""A connection whose hello cannot be sent (it failed, or its connect was cancelled while it
waited: the open's bound passed, the instance stopped) is closed by `Channel.connect`: its
caller never gets it, so no one else would close it. On the code before, it was left to the
garbage collector (a ResourceWarning, and the far end open until a collection found it)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import pytest

from pddemu.runtime.auth import RunSecret
from pddemu.runtime.channel import Channel


@pytest.mark.parametrize("dated", [False, True])
@pytest.mark.parametrize("error", [ConnectionResetError, asyncio.CancelledError])
def test_a_connection_whose_hello_is_not_sent_is_closed(
    dated: bool, error: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def not_sent(_channel: Channel, *_args: Any, **_kwargs: Any) -> int:
        raise error("the hello was not sent")

    monkeypatch.setattr(Channel, "send", not_sent)

    async def scenario() -> bytes:
        accepted: asyncio.Queue[asyncio.StreamReader] = asyncio.Queue()
        writers: list[asyncio.StreamWriter] = []

        async def peer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.append(writer)  # kept open: only the connecting side may close it
            await accepted.put(reader)

        server = await asyncio.start_server(peer, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            with pytest.raises(error):
                await Channel.connect(
                    "127.0.0.1", port, "P0", "MD0", "kv", RunSecret.new(), dated=dated
                )
            reader = await accepted.get()
            try:  # the far end reads the close (b""); on the code before, nothing, ever
                return await asyncio.wait_for(reader.read(1), 2.0)
            finally:
                for writer in writers:
                    writer.close()

    gc.collect()  # earlier tests' garbage: its warnings are not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        read = asyncio.run(scenario())
        gc.collect()
    assert read == b""
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
