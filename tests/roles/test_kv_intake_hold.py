"""The decode side's intake of a KV transfer (the copy into its prompt cache, joining the
batch) is held: modelled time stands still from the transfer's end until the request's first
step holds it, so a slow intake does not make that step late; and the hold never outlives the
intake, whatever becomes of it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from netem.clock import SharedClock
from pddemu.config import Config, load_config
from pddemu.roles.main_decode import MainDecodeInstance, Pinned
from pddemu.roles.spec import Address
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from pddemu.wire.tensors import kv_chunk_from_tensor
from tests.roles.in_process import KvLinkEnd, instance, match_naming_every_page, run_started

SLOW_S = 0.2  # wall seconds the forced-slow intake takes (the cap of an instant hold: 0.25)
NOISE_S = 0.001  # modelled seconds; the first step was 0.19-0.20 s late on the code before
PROMPT = [1 + i % 250 for i in range(256)]  # genuine tokens


def intake_md(tmp_path: Path, config: Config | None = None) -> Any:
    """An MD on a shared clock running at wall speed, nothing else holding it."""
    SharedClock.create(tmp_path / "clock", rate=1.0)
    return instance(MainDecodeInstance, "MD", config, clock=str(tmp_path / "clock"))


def slow_insert(md: Any, seconds: float) -> None:
    """The intake's copy into the prompt cache (DRC) takes `seconds` of wall time (a busy
    host), blocking the event loop as the genuine copy does."""
    insert = md.store.insert

    def slow(*args: Any) -> Any:
        time.sleep(seconds)
        return insert(*args)

    md.store.insert = slow


async def transfer(md: Any, rid: str, output_tokens: int = 64) -> None:
    """A naive request's whole KV (P-MD: MD streams from the first token) reaching MD across
    the WAN, each part dated by the kernel as it reached the host (now)."""
    kv, _ = md.model.prefill(PROMPT, None, len(PROMPT))
    channel = KvLinkEnd()
    meta = {
        "input_tokens": 32 * len(PROMPT),
        "output_tokens": output_tokens,
        "predicted_output_tokens": output_tokens,
        "pipeline": "P-MD",
        "frontend": "FE0",
    }
    md.matches[rid] = Pinned([], 0, None)  # the frontend's match: nothing held yet
    begin = {"rid": rid, "prompt_tokens": len(PROMPT), "offset": 0, "meta": meta, "p": "P0"}
    ids = [TokenIds.from_ints(rid, 0, PROMPT)]
    await md.on_kv_begin(Envelope("kv_begin", begin, ids, channel, md.clock.now()))
    chunk = kv_chunk_from_tensor(rid, 0, 0, kv.tensor)
    await md.on_kv_chunk(chunk, channel, md.clock.now())
    end = Envelope("kv_end", {"rid": rid, "first_token": 7}, [], channel, md.clock.now())
    await md.on_kv_end(end)


class LongSteps:
    """MD's cost model, but each step takes a modelled second."""

    def __init__(self, cost: Any) -> None:
        self.cost = cost

    def forward_step(self, _chunks: Any) -> float:
        return 1.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cost, name)


async def time_goes_on(md: Any) -> float:
    """Modelled seconds that pass in 0.1 s of wall time (a hold left standing: none)."""
    before = md.clock.now()
    await asyncio.sleep(0.1)
    return md.clock.now() - before


def test_a_slow_intake_does_not_make_the_first_step_late(tmp_path: Path) -> None:
    md = intake_md(tmp_path)
    slow_insert(md, SLOW_S)

    async def scenario() -> None:
        await transfer(md, "r1")
        while md.steps < 3:
            await asyncio.sleep(0.01)

    run_started([md], scenario)
    assert md.errors == []
    assert "r1" in md.held  # the intake copied the prompt into the DRC
    # the hold stood while the copy took its 0.2 s: the first step did not end before its
    # work (but for the microseconds between a binding step hold's release and the step's
    # reading the clock); before, it was late by the copy, and each next one a step less.
    # (A later step is late only if the loop wakes more than a step late: a busy host's.)
    assert md.lag_samples_s[0] < NOISE_S, list(md.lag_samples_s)


def test_an_intake_that_fails_lets_time_go_on(tmp_path: Path) -> None:
    md = intake_md(tmp_path)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("the copy failed")

    md.store.insert = broken

    async def scenario() -> float:
        await transfer(md, "r1")
        await asyncio.sleep(0.02)  # the intake runs (and fails) beside
        return await time_goes_on(md)

    passed = run_started([md], scenario)
    assert any("the copy failed" in error for error in md.errors), md.errors
    assert passed > 0.05


def test_a_transfer_refused_at_its_end_lets_time_go_on(tmp_path: Path) -> None:
    md = intake_md(tmp_path)

    async def scenario() -> float:
        kv, _ = md.model.prefill(PROMPT, None, len(PROMPT))
        channel = KvLinkEnd()
        meta = {"input_tokens": 8192, "output_tokens": 64, "pipeline": "P-MD", "frontend": "FE0"}
        begin = {"rid": "r1", "prompt_tokens": len(PROMPT), "offset": 0, "meta": meta}
        ids = [TokenIds.from_ints("r1", 0, PROMPT)]
        await md.on_kv_begin(Envelope("kv_begin", begin, ids, channel, md.clock.now()))
        half = kv.token_slice(0, len(PROMPT) // 2).clone()
        await md.on_kv_chunk(kv_chunk_from_tensor("r1", 0, 0, half.tensor), channel, None)
        end = Envelope("kv_end", {"rid": "r1", "first_token": 7}, [], channel, md.clock.now())
        try:
            await md.on_kv_end(end)  # half the prompt's KV: refused
        except ValueError:
            pass
        else:
            raise AssertionError("a transfer short of its prompt was taken in")
        return await time_goes_on(md)

    assert run_started([md], scenario) > 0.05


def test_an_intake_while_a_step_waits_for_its_end_lets_time_go_on(tmp_path: Path) -> None:
    """The loop, in the middle of a long step (waiting for its modelled end), posts no hold
    until that end: an intake hold handed to it then would stand the clock still."""
    md = intake_md(tmp_path)
    md.cost = LongSteps(md.cost)

    async def scenario() -> float:
        await transfer(md, "r1")
        await asyncio.sleep(0.05)  # r1's first step waits for its end, 1 modelled s away
        await transfer(md, "r2")
        await asyncio.sleep(0.01)
        return await time_goes_on(md)

    assert run_started([md], scenario) > 0.05
    assert md.errors == []


@pytest.mark.parametrize("asked", ["match", "kv_begin"])
def test_md_opens_its_connection_to_the_frontend_when_asked_for_a_match(asked: str) -> None:
    """Not at the request's first token: its handshake, a WAN round trip, would hold that
    token back (and, before the intake was held, the request's first step). With no DRC the
    frontend asks no match: the connection opens at the first KV's beginning (on the code
    before, only a match opened it)."""
    config = load_config()
    if asked == "kv_begin":
        config = config.model_copy(
            update={"policy": config.policy.model_copy(update={"drc": False})}
        )
    md = instance(MainDecodeInstance, "MD", config)
    accepted: list[str] = []

    async def scenario() -> None:
        async def frontend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append("FE0")
            writer.close()

        server = await asyncio.start_server(frontend, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        md.spec.peers["FE0"] = Address("FE0", "FE", "127.0.0.1", port, port + 1)
        if asked == "match":
            channel = SimpleNamespace(peer="FE0", control=lambda *_, **__: asyncio.sleep(0))
            await md.on_match(match_naming_every_page(md, "r1", PROMPT, channel))
        else:
            await transfer(md, "r1")
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.01)
        server.close()
        for channel in md._peers.values():
            channel.close()

    run_started([md], scenario)
    assert accepted == ["FE0"]


def test_an_intake_during_a_steps_work_does_not_stop_modelled_time(tmp_path: Path) -> None:
    """A transfer taken in while the loop is inside a step's genuine work joins the next step,
    which starts at this one's end whatever: its hold must not stand the clock still for the
    rest of that work (it did: 0 modelled s passed in 0.15 wall s of a 0.3 s computation)."""
    # every step computes a genuine token (at the default token scale, one step in 32 does:
    # the step with the slow work would come 32 modelled s after r1's first)
    config = load_config()
    config = config.model_copy(update={"scale": config.scale.model_copy(update={"token_scale": 1})})
    md = intake_md(tmp_path, config)
    md.cost = LongSteps(md.cost)  # 1 modelled s a step: the step's hold at its end is far off
    compute = md.compute
    slow = {"on": False}

    async def slow_compute(work: Any, *args: Any) -> Any:
        if slow["on"]:
            await asyncio.sleep(0.3)  # wall seconds of the step's genuine work
        return await compute(work, *args)

    md.compute = slow_compute

    async def scenario() -> tuple[float, str]:
        await transfer(md, "r1")
        while md.loop_state != "waiting":  # r1's first step's work is done
            await asyncio.sleep(0.005)
        slow["on"] = True
        while md.loop_state not in ("stepping", "computing"):  # the next step has begun
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        state = md.loop_state
        await transfer(md, "r2")
        await asyncio.sleep(0.02)  # r2's intake runs and finishes
        before = md.clock.now()
        await asyncio.sleep(0.15)  # still inside the step's 0.3 s of work
        return md.clock.now() - before, state

    passed, state = run_started([md], scenario)
    assert state == "computing"
    assert passed > 0.1, passed
