"""The relay-to-MD handover, driven in-process (a frontend, a relay and an MD wired together
with a WAN delay): at every switch position of a catch-up round, and with the relay finishing
first, the user gets every position exactly once, in the reference's tokens, and MD takes over
exactly where the relay's final part said. Also: MD's extend runs inside its batched step and
costs what `CostModel.forward_step` says for that step."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from pddemu.config import load_config
from pddemu.model import ModelConfig, greedy
from pddemu.reference import reference_outputs
from pddemu.roles.decode import DecodeRequest
from pddemu.roles.frontend import Frontend
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.relay import Handoff, RelayInstance
from pddemu.workload.expansion import genuine_output_length
from tests.roles.in_process import instance, wire

CONFIG = load_config(
    None, ["scale.time_scale=20", "decode.max_batch=64", "policy.handoff_mode=catch-up"]
)
G = CONFIG.scale.token_scale
OUTPUT = 400  # modelled: genuine outputs 0..13
WAN_S = 0.002  # wall-clock one way, relay <-> MD and MD -> frontend


PACE_S = 0.03  # modelled: the planned pace of a quarter of the requests' leads
TOO_FAST_S = 0.001  # ... and of another quarter's: far faster than MD can follow


class SteeredRelay(RelayInstance):
    """A relay whose final part names the first position from its own on that lies at a
    chosen offset inside its genuine output's group of G modelled positions (or the end); odd
    offsets' leads are paced, planned at PACE_S or (offsets 3 mod 4) far too fast."""

    offsets: dict[str, int]
    finals: dict[str, int]  # the relay's position when it sent the final part

    def switch_position(self, request: DecodeRequest, handoff: Any) -> tuple[int, float]:
        offset = self.offsets[request.rid]
        self.finals[request.rid] = request.position
        if offset < 0:  # the switch as far as the relay expects the request to go
            return request.planned, 0.0
        switch = request.position + (offset - (request.position - 1)) % G
        return switch, (PACE_S if offset % 4 == 1 else TOO_FAST_S) if offset % 2 else 0.0


def prompt(rid: str) -> list[int]:
    rng = random.Random(rid)
    return [rng.randrange(256) for _ in range(24)]


async def serve(offsets: dict[str, int]) -> tuple[dict[str, Any], list[str], dict, dict]:
    """Every request of `offsets` through FE, the relay and MD; their final records."""
    epoch = time.monotonic()
    fe = instance(Frontend, "FE", CONFIG, epoch)
    rld = instance(SteeredRelay, "RLD", CONFIG, epoch)
    md = instance(MainDecodeInstance, "MD", CONFIG, epoch)
    rld.offsets, rld.finals = offsets, {}
    relayed: dict[str, dict[int, tuple[float, float]]] = {}  # rid -> position -> (time, sent)
    receive = fe.on_tokens

    async def on_tokens(message: Any) -> None:
        body = message.body
        if body["role"] == "RLD":
            for position, at in enumerate(body["times"], start=body["first"]):
                relayed.setdefault(body["rid"], {})[position] = (at, body["sent"])
        await receive(message)

    fe.on_tokens = on_tokens
    wire(
        {"FE0": fe, "RLD0": rld, "MD0": md},
        {("RLD0", "MD0"): WAN_S, ("MD0", "RLD0"): WAN_S, ("MD0", "FE0"): WAN_S},
    )
    await rld.start()
    await md.start()
    flights = {}
    for rid in offsets:
        ids = prompt(rid)
        flights[rid] = fe.admit(
            {"rid": rid, "prompt_ids": ids, "input_tokens": len(ids) * G, "output_tokens": OUTPUT}
        )
        meta = {
            "input_tokens": len(ids) * G,
            "output_tokens": OUTPUT,
            "predicted_output_tokens": OUTPUT,
            "frontend": "FE0",
            "pipeline": "P-RLD-MD",
            "rld": "RLD0",
            "md": "MD0",
        }
        for made in (rld, md):
            kv, logits = made.model.prefill(ids, None, 64)
            request = DecodeRequest(rid, dict(meta), kv, len(ids))
            await made.reserve_memory(request)
            begin = {"offset": 0, "ended_at": 0.0, "first_chunk_at": 0.0}
            if made is rld:
                await rld.kv_arrived(request, greedy(logits), begin, 0)
            else:
                later = md.kv_arrived(request, greedy(logits), begin, 0)
                md.spawn(after(0.05 + 0.01 * len(flights), later), f"MD ready for {rid}")
    await asyncio.wait_for(asyncio.gather(*(f.done.wait() for f in flights.values())), 60)
    await asyncio.sleep(0.05)  # anything a broken handover would still send
    records = {}
    for rid, flight in flights.items():
        fe.finish_record(flight)
        records[rid] = (flight.record, flight.output_ids)
    return records, rld.errors + md.errors + fe.errors, relayed, rld.finals


async def after(delay: float, coroutine: Any) -> None:
    await asyncio.sleep(delay)
    await coroutine


def reference(rids: list[str]) -> dict[str, list[int]]:
    requests = [
        SimpleNamespace(
            request_id=rid,
            prompt_ids=prompt(rid),
            genuine_output_tokens=genuine_output_length(OUTPUT, G),
        )
        for rid in rids
    ]
    return reference_outputs(requests, ModelConfig(**CONFIG.model), 64)


def test_handover_at_every_position_of_a_group_and_relay_finishing_first() -> None:
    offsets = {f"offset{offset}": offset for offset in range(G)}
    offsets["finishes-first"] = -1  # the switch would come with the last token
    records, errors, relayed, finals = asyncio.run(serve(offsets))
    assert errors == []
    expected = reference(list(offsets))
    switches = set()
    for rid, (record, outputs) in records.items():
        assert outputs == expected[rid], rid
        assert (record.duplicate_tokens, record.gap_tokens, record.token_mismatch) == (0, 0, False)
        assert record.output_tokens == OUTPUT and len(record.token_times_s) == OUTPUT
        if rid == "finishes-first":
            assert (record.rld_tokens, record.md_tokens, record.handoff_switch) == (OUTPUT, 0, None)
            continue
        assert record.handoff_switch is not None and record.handoff_mode == "catch_up"
        assert record.handoff_position == record.handoff_switch
        assert record.rld_tokens == record.handoff_switch
        assert record.md_tokens == OUTPUT - record.handoff_switch
        offset = (record.handoff_switch - 1) % G  # inside its genuine group
        switches.add(offset)
        if offset % 2 and record.handoff_switch > finals[rid]:
            # a paced lead, re-paced on MD's word whatever was planned: in order, each message
            # sent once its last position's time had come, and the user's stall at the switch
            # at most one TPOT
            sent = relayed[rid]
            lead = [sent[p][0] for p in range(finals[rid] - 1, record.handoff_switch)]
            assert np.all(np.diff(lead) >= 0), rid
            assert all(at <= sent_at for at, sent_at in sent.values())
            times = record.token_times_s
            tpot = (times[-1] - times[0]) / (len(times) - 1)
            stall = record.handoff_gap_s - tpot
            assert stall <= tpot, (rid, stall, tpot)
    assert switches == set(range(G)), f"switch offsets never reached: {set(range(G)) - switches}"


def test_md_extends_inside_its_batched_step_at_forward_step_cost() -> None:
    async def scenario() -> tuple[list, list]:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        steps: list = []
        step = md._step

        async def recorded(started: float, batch: list, extends: list) -> None:
            expected = [(1, int(r.meta["input_tokens"]) + r.position) for r in batch]
            expected += [(e.tokens, e.context) for e in extends]
            durations: list = []
            finish = md.finish_step

            async def finish_step(started: float, duration: float, *rids: Any) -> float:
                durations.append(duration)
                return await finish(started, duration, *rids)

            md.finish_step = finish_step
            await step(started, batch, extends)
            md.finish_step = finish
            steps.append((expected, durations[0], len(batch), len(extends)))

        md._step = recorded
        await md.start()
        meta = {
            "input_tokens": 24 * G,
            "output_tokens": OUTPUT,
            "genuine_output_tokens": genuine_output_length(OUTPUT, G),
            "frontend": "FE0",
            "rld": "RLD0",
            "md": "MD0",
        }
        for i in range(3):  # three requests decoding
            ids = prompt(f"d{i}")
            kv, logits = md.model.prefill(ids, None, 64)
            request = DecodeRequest(f"d{i}", {**meta, "pipeline": "P-MD"}, kv, len(ids))
            await md.start_stream(request, greedy(logits))
        ids = prompt("handed")
        kv, logits = md.model.prefill(ids, None, 64)
        handed = DecodeRequest("handed", {**meta, "pipeline": "P-RLD-MD"}, kv, len(ids))
        md.requests["handed"] = handed
        md.known["handed"] = []
        await asyncio.sleep(0.05)
        relay = instance(RelayInstance, "RLD", CONFIG, md.spec.epoch)
        eager = reference(["handed"])["handed"][:5]
        from pddemu.runtime.channel import Envelope
        from pddemu.wire import TokenIds

        part = {
            "rid": "handed",
            "start": 0,
            "end": 4,
            "final": False,
            "payload": "extend",
            "ids": None,
            "sent_at": relay.clock.now(),
        }
        await md.on_handoff(
            Envelope("handoff", part, [TokenIds.from_ints("handed", 0, eager[:4])], None)
        )
        await asyncio.sleep(0.1)
        return steps, md.errors

    steps, errors = asyncio.run(scenario())
    assert errors == []
    fused = [s for s in steps if s[3] == 1]
    assert len(fused) == 1
    expected, duration, batch, _ = fused[0]
    assert batch == 3 and expected[-1] == (1 + 3 * G, 24 * G)
    cost = instance(MainDecodeInstance, "MD", CONFIG).cost
    assert duration == cost.forward_step(expected)
    assert all(d == cost.forward_step(e) for e, d, _, _ in steps)


def test_a_lead_group_that_starts_before_the_lead_is_paced_evenly_from_its_last_position() -> None:
    """A held group holding positions produced before the final part (7, 8, 9 here) delivers
    them as they are; the lead's positions (10..19, the switch at 20) are spread evenly from the
    last delivered one to one MD step before MD's first: the first step is no shorter."""
    handoff = Handoff(mode="catch_up", md_batch=[], switch=20, pace_s=0.01, paced_from=10)
    handoff.delivered_at, handoff.md_first_at, handoff.md_step_s = 1.0, 1.6, 0.1
    body = {"first": 7, "times": [0.90, 0.95, 1.0] + [1.0] * 10}
    times = RelayInstance.lead_times(None, handoff, body)  # type: ignore[arg-type]
    assert times[:3] == [0.90, 0.95, 1.0]
    steps = np.diff([1.0, *times[3:]])
    assert np.allclose(steps, 0.05) and times[-1] == pytest.approx(1.5)


def test_a_stream_is_resumed_only_where_the_users_last_output_stands() -> None:
    """The user's genuine outputs `ids` cover modelled positions up to the end of the last
    one's group: a stream resumed before that group begins, or after it ends (a position no
    output the user holds stands for, which the next step would misplace), is refused."""
    ids = [5, 6, 7]  # the last one's group: positions 1 + G .. 1 + 2G

    async def resumed(position: int) -> bool:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        meta = {"input_tokens": 30 * G, "output_tokens": 10 * G, "pipeline": "P-MD"}
        request = DecodeRequest("r", meta, md.model.prefill(list(range(30)), None, 64)[0], 30)
        try:
            await md.resume_stream(request, ids, position, have=len(ids) - 1)
        except ValueError as error:
            assert "cannot resume" in str(error)
            return False
        return request.stream_from == position

    async def scenario() -> list[bool]:
        return [await resumed(p) for p in (G, 1 + G, 1 + 2 * G, 2 + 2 * G, 1 + 5 * G)]

    assert asyncio.run(scenario()) == [False, True, True, False, False]
