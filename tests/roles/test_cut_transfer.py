"""A KV transfer cut mid-way (its sender died, or cancelled it) is cleaned up on the receiving
side: its memory is released, it is counted, and what arrived of the prompt stays in MD's DRC."""

from __future__ import annotations

import asyncio

from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import instance


class Connection:
    """Stands for a connection: its identity (a transfer's own) and the replies sent on it."""

    def __init__(self) -> None:
        self.replies: list[tuple[str, dict]] = []

    async def control(self, kind: str, body: dict) -> None:
        self.replies.append((kind, body))


def test_a_transfer_cut_mid_way_is_released_counted_and_its_prefix_kept() -> None:
    async def scenario() -> tuple[MainDecodeInstance, int]:
        md = instance(MainDecodeInstance, "MD")
        page = md.page_tokens
        prompt = list(range(1, 4 * page + 1))
        connection = Connection()
        ids = [TokenIds.from_ints("r1", 0, prompt)]
        await md.on_match(Envelope("match", {"rid": "r1"}, ids, Connection()))
        meta = {"input_tokens": 4096, "output_tokens": 512, "genuine_output_tokens": 16}
        begin = {"rid": "r1", "prompt_tokens": len(prompt), "offset": 0, "meta": meta}
        await md.on_kv_begin(Envelope("kv_begin", begin, [], connection))
        reserved = md.kv_reserved
        kv, _ = md.model.prefill(prompt[: 2 * page], None, 2 * page)
        await md.on_kv_chunk(kv_chunk_from_tensor("r1", 0, 0, kv.tensor), connection)
        md.channel_closed(connection)  # the sender is gone before its kv_end
        await asyncio.sleep(0.05)  # the release runs beside
        return md, reserved

    md, reserved = asyncio.run(scenario())
    assert reserved == 4096 + 512
    assert md.kv_reserved == 0 and md.receiving == {} and md.transfers_cut == 1
    assert md.stats()["transfers_cut"] == 1
    hit, _node, _handles = md.store.match(list(range(1, 4 * md.page_tokens + 1)))
    assert hit == 2 * md.page_tokens  # the pages that arrived stay in the DRC
