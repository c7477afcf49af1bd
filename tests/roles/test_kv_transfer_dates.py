"""A KV transfer is dated by when its parts reached the host, not by when the receiver read
them: read late, its first chunk is still dated before its end (MD's kv_transfer event and
the router's note of the transfer's time)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from netem.clock import SharedClock
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.transfer import first_chunk_end
from pddemu.runtime.channel import Channel, Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import KvLinkEnd, instance, keep_in_drc, match_naming_every_page
from tests.runtime.test_dated_reads import _connected, _until_the_kernel_dates

GAP_S = 0.2  # wall seconds between the chunk's sending and kv_end's, and before MD reads


def test_a_first_chunk_read_late_is_dated_by_its_arrival_before_the_transfers_end(
    tmp_path: Path,
) -> None:
    SharedClock.create(tmp_path / "clock", rate=1.0)
    md = instance(MainDecodeInstance, "MD", clock=str(tmp_path / "clock"))

    async def scenario() -> tuple[dict, dict, float]:
        sender, accepted = await _connected()
        reader = Channel.dated(accepted, peer="P0", purpose="kv")
        reader.modelled_at = md.modelled_at
        writer = Channel.dated(sender, peer="MD0", purpose="kv")
        writer.stamp = md.clock.now  # the sender's send times, on the same clock
        await _until_the_kernel_dates(writer, reader)
        prompt = list(range(1, 2 * md.page_tokens + 1))
        kv, _ = md.model.prefill(prompt, None, len(prompt))
        meta = {
            "input_tokens": 2048,
            "output_tokens": 64,
            "predicted_output_tokens": 64,
            "pipeline": "P-RLD-MD",
            "frontend": "FE0",
            "rld": "RLD0",
        }
        begin = {"rid": "r1", "prompt_tokens": len(prompt), "offset": 0, "meta": meta, "p": "P0"}
        await writer.control("kv_begin", begin, TokenIds.from_ints("r1", 0, prompt))
        await writer.send(kv_chunk_from_tensor("r1", 0, 0, kv.tensor))
        await asyncio.sleep(GAP_S)
        await writer.control("kv_end", {"rid": "r1", "first_token": 7, "ready": md.clock.now()})
        await asyncio.sleep(GAP_S)
        read_from = md.clock.now()  # MD comes to the transfer only now: all of it waits
        for _ in range(3):
            await md._dispatch(await reader.receive(), reader)
        await asyncio.sleep(0.05)  # the arrival's bookkeeping runs beside
        writer.close()
        reader.close()
        (event,) = [e for e in md.events.events if e["kind"] == "kv_transfer"]
        (arrived,) = [body for _, kind, body in md.told if kind == "kv_arrived"]
        return event, arrived, read_from

    try:
        event, arrived, read_from = asyncio.run(scenario())
    finally:
        md.clock.close()
    assert md.errors == []
    ((first_chunk_at, _size),) = event["chunks"]
    assert event["start_s"] <= first_chunk_at <= event["end_s"], event
    # its arrival (a read that takes what waits is dated by its last segment, here kv_end's,
    # a GAP_S before MD read it), not its reading
    assert first_chunk_at < read_from - GAP_S / 2
    # what the router learns of the transfer's time on the WAN (frontend.on_kv_arrived)
    assert arrived["first_chunk_at"] == first_chunk_at and arrived["at"] == event["end_s"]


def test_the_first_chunk_ends_at_ps_first_chunk_boundary_past_the_offset() -> None:
    """MD's DRC holds the prompt up to a page past P's first chunk boundary (P computes from
    its hit, 0 here, in chunks): the first chunk MD receives is the rest of P's second chunk,
    a partial one, and it is dated when that had arrived (P's boundary, `first_chunk_end`),
    not when a whole chunk past the offset had (in P's third chunk, a step later)."""

    async def scenario() -> tuple[dict, float, float]:
        md = instance(MainDecodeInstance, "MD")
        chunk, page = md.chunk_genuine, md.page_tokens
        prompt = [1 + i % 200 for i in range(3 * chunk)]
        offset = chunk + page  # not on P's boundaries (0, chunk, 2 chunks, 3 chunks)
        assert first_chunk_end(offset, 0, chunk, len(prompt)) == 2 * chunk
        kv, _ = md.model.prefill(prompt, None, len(prompt))
        keep_in_drc(md, prompt[:offset], kv.token_slice(0, offset).clone())
        link = KvLinkEnd()
        await md.on_match(match_naming_every_page(md, "r1", prompt, link))
        meta = {
            "input_tokens": 32 * len(prompt),
            "output_tokens": 64,
            "predicted_output_tokens": 64,
            "pipeline": "P-RLD-MD",
            "frontend": "FE0",
            "rld": "RLD0",
        }
        begin = {"rid": "r1", "prompt_tokens": len(prompt), "offset": offset, "p_hit": 0}
        ids = [TokenIds.from_ints("r1", offset, prompt[offset:])]
        await md.on_kv_begin(Envelope("kv_begin", {**begin, "meta": meta, "seq": 1}, ids, link))
        await link.admitted("r1")
        dated = {}
        for begin_at, end_at in ((offset, 2 * chunk), (2 * chunk, 3 * chunk)):  # P's steps
            await asyncio.sleep(0.05)
            part = kv_chunk_from_tensor("r1", 0, begin_at, kv.token_slice(begin_at, end_at).tensor)
            await md.on_kv_chunk(part, link)
            dated[end_at] = md.clock.now()
        end = {"rid": "r1", "seq": 1, "first_token": 7, "ready": md.clock.now()}
        await md.on_kv_end(Envelope("kv_end", end, [], link))
        await asyncio.sleep(0.05)  # the arrival's bookkeeping runs beside
        (arrived,) = [body for _, kind, body in md.told if kind == "kv_arrived"]
        assert md.errors == [], md.errors
        return arrived, dated[2 * chunk], dated[3 * chunk]

    arrived, boundary_at, next_at = asyncio.run(scenario())
    # dated by the partial chunk up to P's boundary; on the code before, by the next one
    assert arrived["first_chunk_at"] <= boundary_at < next_at - 0.03, (arrived, boundary_at)


@pytest.mark.parametrize(
    ("offset", "p_hit", "expected"),
    [
        (0, 0, 64),  # nothing held anywhere: P's first chunk
        (64, 0, 128),  # on a boundary of P's: the next whole chunk
        (128, 0, 192),
        (96, 32, 160),  # on a boundary of P's counted from its hit
        (32, 32, 96),  # at P's hit: the first chunk P computes
        (0, 32, 32),  # before P's hit: its cached KV, up to the hit
        (0, 100, 64),  # before P's hit by more than a chunk: a chunk's worth of it
        (80, 100, 100),
        (160, 0, 192),
        (192, 0, 200),  # on P's last boundary: its last chunk, ending at the prompt's end
        (200, 0, 200),  # at the prompt's end: nothing is sent
        (200, 200, 200),
        (40, 200, 104),  # P holds it all: its cached KV a chunk at a time
    ],
)
def test_the_first_chunk_end_on_and_off_ps_boundaries(
    offset: int, p_hit: int, expected: int
) -> None:
    """`first_chunk_end` with chunks of 64 genuine tokens and a prompt of 200, the offset on
    P's chunk boundaries (p_hit + k chunks), at its hit, at 0 and at the prompt's end."""
    assert first_chunk_end(offset, p_hit, 64, 200) == expected
