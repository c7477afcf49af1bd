"""The shaper holds modelled time at a routing message's release (the TCP segment that ends a
write marked with `netem.clock.ROUTING_DSCP`: data, PSH) until its reader lets go, or the cap
passes; a bare ACK so marked, a marked write's earlier segment (no PSH), or data of another
class leaves without a hold. Messages released together each keep the clock still until their
own reader lets go (or their own cap passes), and a reader whose message came before the hold
lets none go. On a clock page at rate 1, through datagram sockets standing for the TUN ends."""

from __future__ import annotations

import math
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from netem import shaper as shaper_module
from netem.clock import MAX_SLOTS, ROUTING_DSCP, ROUTING_SLOTS_KEPT, SharedClock, routing_slot
from netem.packet import ends_a_tcp_write
from netem.shaper import Shaper
from netem.spec import LinkSpec
from pddemu.runtime.clock import ModelledClock
from pddemu.runtime.timekeeping import routing_holds
from tests.netem.test_delivery_record import FakeLink, drain, one_link_config

DELAY_S = 0.005


PSH_ACK, ACK, FIN_ACK, RST = 0x18, 0x10, 0x11, 0x04


SOURCE, DESTINATION = bytes([10, 0, 1, 1]), bytes([10, 0, 2, 1])
# the slot of the shaper's holds at routing messages from port 1234 to port 80 (`segment`'s)
SLOT = routing_slot(SOURCE, 1234, DESTINATION, 80)


def segment(dscp: int, data: bytes, flags: int = PSH_ACK, source_port: int = 1234) -> bytes:
    """An IPv4 TCP segment (no options) with `data`, marked `dscp`."""
    total = 40 + len(data)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, dscp << 2, total, 1, 0, 64, 6, 0, SOURCE, DESTINATION)
    tcp = struct.pack("!HHIIBBHHH", source_port, 80, 1, 1, 5 << 4, flags, 65535, 0, 0)
    return ip + tcp + data


def shaper_on(page: Path, tmp_path: Path) -> tuple[Shaper, FakeLink]:
    config = one_link_config(LinkSpec(delay_s=DELAY_S), tmp_path, clock=str(page))
    link = FakeLink()
    return Shaper(config, link.open_end), link


def released_hold(shaper: Shaper, link: FakeLink, packet: bytes) -> tuple[float, float, bytes]:
    """Send `packet` a to b and run the shaper until it leaves: the clock's earliest hold just
    after, the time of the turn that released it, and what b received."""
    hold, released, (received,) = released_together(shaper, link, [packet])
    return hold, released, received


def released_together(
    shaper: Shaper, link: FakeLink, packets: list[bytes]
) -> tuple[float, float, list[bytes]]:
    """Send `packets` a to b at once and run the shaper until they have left (in one turn:
    they are due together): as `released_hold`, with what b received of each."""
    assert shaper.clock is not None
    for packet in packets:
        link.far["a"].send(packet)
    source = shaper.routes[0].source_fd
    arrived = shaper.now()  # the turn dates what it reads by its own time
    shaper.turn([source], arrived, early=0.0)
    # delayed from that time (not from a time read after the turn, later by however long
    # the host took to run it)
    assert shaper.routes[0].direction.next_exit() == pytest.approx(arrived + DELAY_S, abs=1e-9)
    deadline = time.monotonic() + 5.0
    while True:
        assert time.monotonic() < deadline, "the packets never left"
        time.sleep(0.001)
        now = shaper.now()
        shaper.turn([], now, early=0.0)
        if shaper.routes[0].direction.next_exit() == math.inf:
            received = [link.far["b"].recv(65536) for _ in packets]
            return shaper.clock.anchor().hold, now, received


@dataclass
class Rig:
    """A shaper on a clock page at rate 1, its link's ends datagram sockets."""

    page: Path
    shaper: Shaper
    link: FakeLink


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    page = tmp_path / "clock"
    SharedClock.create(page, rate=1.0)
    shaper, link = shaper_on(page, tmp_path)
    yield Rig(page, shaper, link)
    shaper.control.close()
    link.close()


@pytest.fixture
def reader(rig: Rig) -> Iterator[ModelledClock]:
    """A participant's clock on the rig's page: the reader of the routing messages."""
    clock = ModelledClock(SharedClock(rig.page), None)
    yield clock
    clock.close()


def held_until_its_own_reader_lets_go(reader: ModelledClock, hold: float) -> None:
    """The hold still stands the clock still for the marked message's reader, and ends when
    that reader lets go in the message's slot."""
    time.sleep(0.01)
    assert reader.now() == hold
    assert reader.let_routing_go(hold, SLOT)
    time.sleep(0.01)
    assert reader.now() > hold


def test_a_routing_message_stands_the_clock_still_from_its_release_until_let_go(
    rig: Rig,
) -> None:
    reader = SharedClock(rig.page)
    try:
        answer = segment(ROUTING_DSCP, b'{"kind": "matched"}')
        hold, released, received = released_hold(rig.shaper, rig.link, answer)
        assert received == answer
        assert released <= hold < released + 0.002  # at its release (the turn's time)
        time.sleep(0.05)  # the reader is late
        assert reader.now() == hold  # time stood still meanwhile
        slot = reader.slot_named(SLOT)
        assert slot is not None
        assert reader.let_go_one(slot, hold)  # the reader has it (ModelledClock.let_routing_go)
        time.sleep(0.01)
        assert reader.now() > hold
        assert rig.shaper.routing_holds == 1
    finally:
        reader.close()


@pytest.mark.parametrize(
    "packet",
    [
        segment(ROUTING_DSCP, b""),
        segment(ROUTING_DSCP, b"ids", flags=ACK),
        segment(18, b'{"kind": "tokens"}'),
    ],
    ids=["a bare ACK so marked", "a marked write's earlier segment", "control data (AF21)"],
)
def test_no_hold_for_other_packets(rig: Rig, packet: bytes) -> None:
    hold, _, received = released_hold(rig.shaper, rig.link, packet)
    assert received == packet
    assert hold == math.inf
    assert rig.shaper.routing_holds == 0


def test_a_routing_message_nobody_lets_go_stands_the_clock_still_no_longer_than_the_cap(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shaper_module, "ROUTING_HOLD_CAP_S", 0.02)
    shaper = rig.shaper
    hold, _, _ = released_hold(shaper, rig.link, segment(ROUTING_DSCP, b"x"))
    assert hold < math.inf
    shaper._cap_routing_holds(time.monotonic())  # within the cap: still held
    assert shaper.clock is not None and shaper.clock.anchor().hold == hold
    time.sleep(0.03)
    shaper._cap_routing_holds(time.monotonic())
    assert shaper.clock.anchor().hold == math.inf
    drain(rig.link.far["b"])


def test_each_of_two_routing_messages_in_flight_stands_the_clock_still_until_its_reader_lets_go(
    rig: Rig, reader: ModelledClock
) -> None:
    """Two routing messages released together (due in one turn of the shaper: MD's answers to
    two requests, say): the first reader to let go ends its own message's hold, not the
    other's, which stands until its reader lets go too (before: one hold for both, ended by
    either)."""
    first_reader = reader
    second_reader = ModelledClock(SharedClock(rig.page), None)
    try:
        answers = [segment(ROUTING_DSCP, b'{"rid": "a"}'), segment(ROUTING_DSCP, b'{"rid": "b"}')]
        hold, _, received = released_together(rig.shaper, rig.link, answers)
        assert received == answers and rig.shaper.routing_holds == 2
        assert first_reader.let_routing_go(hold, SLOT)
        time.sleep(0.02)
        assert first_reader.now() == hold  # still held: the second message is not read yet
        assert second_reader.let_routing_go(hold, SLOT)
        time.sleep(0.01)
        assert second_reader.now() > hold
        assert not first_reader.let_routing_go(hold, SLOT)  # no hold is left to let go
    finally:
        second_reader.close()


def test_a_message_that_came_before_the_hold_lets_none_go(rig: Rig, reader: ModelledClock) -> None:
    """A routing message whose last byte left unmarked (its send buffer full, a
    retransmission) posted no hold: read while another's stands, it came before that hold's
    instant, and its reader's let-go leaves the hold standing for the message it is for."""
    unmarked_arrival = reader.now()
    time.sleep(0.01)
    hold, _, _ = released_hold(rig.shaper, rig.link, segment(ROUTING_DSCP, b'{"rid": "b"}'))
    assert hold > unmarked_arrival
    assert not reader.let_routing_go(unmarked_arrival, SLOT)
    held_until_its_own_reader_lets_go(reader, hold)


def test_each_routing_hold_ends_at_its_own_cap(
    rig: Rig, reader: ModelledClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A let-go and the cap do not both count against one message: of two holds posted
    0.03 s apart, the first let go by its reader, the second outlasts the first's cap and
    ends at its own."""
    monkeypatch.setattr(shaper_module, "ROUTING_HOLD_CAP_S", 0.05)
    shaper = rig.shaper
    shaper._hold_for_routing(segment(ROUTING_DSCP, b"a"), shaper.now())
    assert shaper.clock is not None
    hold = shaper.clock.anchor().hold
    time.sleep(0.03)
    shaper._hold_for_routing(segment(ROUTING_DSCP, b"b"), shaper.now())
    assert reader.let_routing_go(hold, SLOT)  # the first message's reader
    time.sleep(0.03)  # past the first hold's cap, within the second's
    shaper._cap_routing_holds(time.monotonic())
    assert reader.now() == hold
    time.sleep(0.03)
    shaper._cap_routing_holds(time.monotonic())
    time.sleep(0.005)
    assert reader.now() > hold
    assert shaper.clock is not None and shaper.clock.anchor().hold == math.inf


def test_a_write_ends_with_data_beyond_the_headers_and_psh() -> None:
    assert ends_a_tcp_write(segment(ROUTING_DSCP, b"x"))
    assert not ends_a_tcp_write(segment(ROUTING_DSCP, b""))
    assert not ends_a_tcp_write(segment(ROUTING_DSCP, b"x", flags=ACK))
    udp = bytearray(segment(ROUTING_DSCP, b"xyz"))
    udp[9] = socket.IPPROTO_UDP
    assert not ends_a_tcp_write(bytes(udp))


def test_a_routing_message_the_shaper_reads_late_enters_the_wan_as_of_its_sending(
    rig: Rig, reader: ModelledClock
) -> None:
    """Its sender holds the present from just before its marked write until the shaper has
    read it (`ModelledClock.hold_until_shaped`): the shaper, reading it 50 ms of wall time
    late, dates it at its sending, and lets the clock go on. On the code before, nothing held
    the clock meanwhile: it entered the WAN 50 ms late, and the route with it."""
    shaper, sender = rig.shaper, reader
    sender.hold_until_shaped()
    sent = sender.now()
    rig.link.far["a"].send(segment(ROUTING_DSCP, b'{"kind": "match"}'))
    time.sleep(0.05)  # the shaper is late
    assert sender.now() == sent  # time stood still meanwhile
    shaper.turn([shaper.routes[0].source_fd], shaper.now(), early=0.0)
    assert shaper.routes[0].direction.next_exit() == pytest.approx(sent + DELAY_S, abs=1e-9)
    time.sleep(0.01)
    assert sender.now() > sent  # read: time goes on
    assert shaper.clock is not None and shaper.ingress_slot is not None
    assert shaper.clock.readers_held_for(shaper.ingress_slot) == 0


def test_a_senders_hold_whose_message_never_reaches_the_shaper_ends_at_the_cap(
    rig: Rig, reader: ModelledClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that left unmarked without its sender knowing (or never left) is never let
    go of by the shaper: its hold stands the clock still no longer than ROUTING_HOLD_CAP_S, as
    the shaper's loop sees it; another message's segment (not marked) lets none go."""
    monkeypatch.setattr(shaper_module, "ROUTING_HOLD_CAP_S", 0.02)
    shaper, sender = rig.shaper, reader
    sender.hold_until_shaped()
    held = sender.now()
    rig.link.far["a"].send(segment(18, b'{"kind": "tokens"}'))
    shaper.turn([shaper.routes[0].source_fd], shaper.now(), early=0.0)
    assert shaper._cap_ingress_hold(time.monotonic()) == pytest.approx(0.02, abs=0.005)
    time.sleep(0.01)
    assert sender.now() == held
    time.sleep(0.015)
    assert shaper._cap_ingress_hold(time.monotonic()) is None  # past the cap: ended
    time.sleep(0.005)
    assert sender.now() > held
    drain(rig.link.far["b"])


def test_a_senders_hold_is_capped_from_before_its_posting_not_from_when_the_loop_saw_it(
    rig: Rig, reader: ModelledClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shaper's loop looks at the senders' hold every INGRESS_LOOK_S when idle: a hold
    posted just after a look is first seen up to that long after. Its cap counts from the
    last look that found none (it was posted after), so it stands at most ROUTING_HOLD_CAP_S.
    Before, it counted from the look that first saw it: up to INGRESS_LOOK_S longer."""
    monkeypatch.setattr(shaper_module, "ROUTING_HOLD_CAP_S", 0.05)
    shaper, sender = rig.shaper, reader
    looked = time.monotonic()
    assert shaper._cap_ingress_hold(looked) is None  # a look: nothing stands
    sender.hold_until_shaped()
    time.sleep(0.03)  # the loop's next look comes later
    left = shaper._cap_ingress_hold(time.monotonic())
    assert left is not None and left <= looked + 0.05 - time.monotonic() + 1e-3
    time.sleep(left + 0.002)
    assert shaper._cap_ingress_hold(time.monotonic()) is None  # past the cap: ended
    assert shaper.clock is not None and shaper.ingress_slot is not None
    assert shaper.clock.readers_held_for(shaper.ingress_slot) == 0


def test_a_message_on_another_connection_lets_none_go(rig: Rig, reader: ModelledClock) -> None:
    """Two routing messages released in one turn on two connections, the first unmarked (its
    send buffer was full: no hold) and so dated at the instant the second's hold stands at:
    its reader lets go only in its own connection's slot, where nothing is held, and the
    second's hold stands until its own reader lets go. Before, both connections' holds were
    one slot's, and the unmarked message's reader let the other's go."""
    unmarked = segment(18, b'{"kind": "matched"}', source_port=4321)
    marked = segment(ROUTING_DSCP, b'{"kind": "matched"}')
    hold, _, _ = released_together(rig.shaper, rig.link, [unmarked, marked])
    assert rig.shaper.routing_holds == 1
    other = routing_slot(SOURCE, 4321, DESTINATION, 80)
    assert not reader.let_routing_go(hold, other)  # dated at the hold, but not its own
    held_until_its_own_reader_lets_go(reader, hold)


def test_more_connections_than_the_page_has_slots_each_held_and_counted(
    rig: Rig, reader: ModelledClock
) -> None:
    """Connections come and go (a restart reconnects), each with a routing message let go by
    its reader and none ended by a FIN the shaper saw: it keeps at most ROUTING_SLOTS_KEPT
    slots, giving back those holding for no reader, so every message is held and the page
    keeps room for participants; the holds given back still count. Before, each connection
    kept its slot for good, and the claim past the page's last slot raised ClockError out of
    the shaper's turn (the shaper died, the WAN with it)."""
    shaper = rig.shaper
    connections = MAX_SLOTS + 10
    for port in range(2000, 2000 + connections):
        hold, _, _ = released_hold(
            shaper, rig.link, segment(ROUTING_DSCP, b'{"kind": "matched"}', source_port=port)
        )
        name = routing_slot(SOURCE, port, DESTINATION, 80)
        assert reader.let_routing_go(hold, name)
    assert shaper.routing_holds == connections and shaper.routing_unheld == 0
    assert len(shaper.routing_slots) <= ROUTING_SLOTS_KEPT
    assert routing_holds(reader.source)["posted"] == connections  # none lost
    assert len(reader.source.slots()) < MAX_SLOTS - ROUTING_SLOTS_KEPT


@pytest.mark.parametrize("flags", [FIN_ACK, RST])
def test_a_connections_slot_is_given_back_when_it_ends_and_holds_for_no_reader(
    rig: Rig, reader: ModelledClock, flags: int
) -> None:
    """A FIN or RST on a connection with a routing slot: the slot is given back once its
    reader has let go (not before: the hold stands for it), its counts kept."""
    shaper = rig.shaper
    hold, _, _ = released_hold(shaper, rig.link, segment(ROUTING_DSCP, b'{"kind": "match"}'))
    before = routing_holds(reader.source)
    rig.link.far["a"].send(segment(18, b"", flags=flags))  # the connection ends
    shaper.turn([shaper.routes[0].source_fd], shaper.now(), early=0.0)  # read, held
    shaper._cap_routing_holds(time.monotonic())
    assert reader.source.slot_named(SLOT) is not None  # its reader has not let go yet
    assert reader.now() == hold
    assert reader.let_routing_go(hold, SLOT)
    shaper._cap_routing_holds(time.monotonic())
    assert reader.source.slot_named(SLOT) is None and not shaper.routing_slots
    after = routing_holds(reader.source)
    assert after["posted"] == before["posted"] == 1
    assert after["binding"] == 1 and after["frozen_wall_s"] > 0  # counted at its release
