"""Instances driven in-process (no network: what they `tell` is recorded), and the token
messages RLD and MD would send a frontend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from pddemu.cache.page_hashes import chained_page_hashes, hash_text
from pddemu.config import Config, config_to_json, load_config
from pddemu.roles.frontend import Flight, Frontend
from pddemu.roles.spec import Address, InstanceSpec
from pddemu.runtime.channel import Envelope
from pddemu.workload.expansion import output_group_start

T = TypeVar("T")
SCALE = load_config().scale.token_scale
OUTPUT = 1 + 2 * SCALE  # genuine outputs 0 (position 0), 1 and 2 (SCALE positions each)


def instance(
    cls: type,
    role: str,
    config: Config | None = None,
    epoch: float | None = None,
    clock: str = "",
) -> Any:
    """An instance of `cls` whose `tell` records what it says (`made.told`); instances meant
    to talk (see `wire`) share one `epoch`, as a deployment's do. `clock`: a shared clock's
    page to read (its slot is the caller's to give back: `made.clock.close()`)."""
    me = Address(f"{role}0", role, "127.0.0.1", 1, 2)
    config = config or load_config()
    epoch = time.monotonic() if epoch is None else epoch
    spec = InstanceSpec(me, "pdd", "", {me.name: me}, config_to_json(config), epoch, clock)
    made = cls(spec)
    made.told = []

    async def tell(name: str, kind: str, body: dict, *attachments: Any) -> int:
        made.told.append((name, kind, body))
        return 0

    made.tell = tell
    return made


def run_started(instances: Sequence[Any], scenario: Callable[[], Awaitable[T]]) -> T:
    """`scenario()`'s result, run on a new event loop once `instances` have started. Whatever
    it does, their background tasks are ended (`end_tasks`) before their shared clocks' slots
    are given back, so that no task wakes and reads a closed page."""

    async def main() -> T:
        for made in instances:
            await made.start()
        try:
            return await scenario()
        finally:
            for made in instances:
                await made.end_tasks()

    try:
        return asyncio.run(main())
    finally:
        for made in instances:
            made.clock.close()


class QuietFrontend:
    """A frontend's end of a connection that takes what it is told and says nothing back."""

    peer = "FE0"
    closed = False

    async def control(self, kind: str, body: dict) -> None:
        pass


class KvLinkEnd:
    """P's KV link as its receiver sees it: its identity, the peer a message's date is read
    for, and what the receiver says back on it (`kv_admitted`), recorded."""

    received = None
    closed = False

    def __init__(self, peer: str = "P0") -> None:
        self.peer = peer
        self.said: list[tuple[str, dict]] = []

    async def control(self, kind: str, body: dict, handed: Any = None) -> None:
        self.said.append((kind, body))

    async def admitted(self, rid: str) -> None:
        """Until the receiver has admitted `rid`'s transfer (its sender may send its KV)."""
        deadline = time.monotonic() + 10
        while not any(kind == "kv_admitted" and body["rid"] == rid for kind, body in self.said):
            assert time.monotonic() < deadline, f"{rid} never admitted"
            await asyncio.sleep(0.001)


def keep_in_drc(md: Any, prompt: Sequence[int], kv: Any) -> None:
    """Put `prompt`'s KV in `md`'s DRC, its pages indexed by hash, as a transfer that came
    would have (its kv_begin held the prompt, its arrival kept it)."""
    hashes = md.prefixes.hold(prompt)
    md.store.release(md.store.insert(prompt, kv, hashes))
    md.prefixes.let_go(hashes)  # its pages in the DRC hold them


def match_naming_every_page(
    made: Any, rid: str, prompt: Sequence[int], channel: Any, **envelope: Any
) -> Envelope:
    """The frontend's `match` for `prompt` as a router would send it that had routed every
    prefix of it to `made`: naming each whole page's prefix, deepest first (the longest the
    decode side knows is then the longest it can hold)."""
    page = made.page_tokens
    hashes = chained_page_hashes(prompt, page)
    named = [[(k + 1) * page, hash_text(h)] for k, h in reversed(list(enumerate(hashes)))]
    body = {"rid": rid, "prompt_tokens": len(prompt), "prefixes": named}
    return Envelope("match", body, [], channel, **envelope)


def frontend() -> Frontend:
    return instance(Frontend, "FE")


def tokens(rid: str, index: int, role: str, source: str = "") -> Envelope:
    """Genuine output `index` and the modelled positions it stands for, as RLD or MD send it
    (instance `source`, by default the role's first)."""
    first = output_group_start(index, SCALE)
    count = output_group_start(index + 1, SCALE) - first
    body = {
        "rid": rid,
        "index": index,
        "id": 5 + index,
        "first": first,
        "times": [0.1 * (first + i) for i in range(count)],
        "sent": 0.0,
        "role": role,
        "source": source or f"{role}0",
    }
    return Envelope("tokens", body, [], None)


def admit(fe: Frontend, rid: str) -> Flight:
    return fe.admit(
        {"rid": rid, "prompt_ids": [1, 2, 3], "input_tokens": 96, "output_tokens": OUTPUT}
    )


class WireEnd:
    """The receiving end of a wired pair as its handlers see it (`Envelope.channel`): named
    for the sender, and a reply on it (`control`) goes back to the sender by the wire."""

    def __init__(self, peer: str, reply: Any) -> None:
        self.peer = peer
        self.closed = False
        self._reply = reply

    async def control(self, kind: str, body: dict, handed: Any = None) -> None:
        await self._reply(self.peer, kind, body)
        if handed is not None:
            handed()


def wire(instances: dict[str, Any], one_way_s: dict[tuple[str, str], float]) -> None:
    """Connect in-process instances by name: what one tells another reaches its handler after
    the given wall-clock delay (per (from, to) pair; none: at once), in order per pair, sent
    at the sender's modelled time (`t`, as a channel stamps it) on a `WireEnd` of the pair."""
    import asyncio

    from pddemu.runtime.channel import Envelope

    queues: dict[tuple[str, str], asyncio.Queue] = {}

    async def carry(pair: tuple[str, str], queue: asyncio.Queue) -> None:
        target = instances[pair[1]]
        end = WireEnd(pair[0], instances[pair[1]].tell)
        while True:
            due, kind, body, attachments = await queue.get()
            delay = due - asyncio.get_running_loop().time()
            if delay > 0:
                await asyncio.sleep(delay)
            await getattr(target, f"on_{kind}")(Envelope(kind, body, list(attachments), end))

    for sender_name, sender in instances.items():

        async def tell(
            name: str, kind: str, body: dict, *attachments: Any, _me: str = sender_name
        ) -> int:
            pair = (_me, name)
            if pair not in queues:
                queues[pair] = asyncio.Queue()
                instances[_me].spawn(carry(pair, queues[pair]), f"wire {pair}")
            due = asyncio.get_running_loop().time() + one_way_s.get(pair, 0.0)
            clock = getattr(instances[_me], "clock", None)
            stamped = {**body, "t": clock.now()} if clock is not None else body
            queues[pair].put_nowait((due, kind, stamped, attachments))
            return 100 + sum(getattr(a, "nbytes", 0) for a in attachments)

        sender.tell = tell
