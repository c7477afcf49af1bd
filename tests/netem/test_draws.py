"""The shaper's random draws (loss, jitter) restarted from the run's seed: a replay after others
on the same links meets the weather a fresh link of that seed gives (how `pddemu emulate
--one-at-a-time` matches the systems run at once, each on a network of its own)."""

from __future__ import annotations

import json
import random
import select
from pathlib import Path

import pytest

from netem.direction import SEED_LIMIT, Direction
from netem.shaper import Shaper, direction_seeds
from netem.spec import LinkSpec, LossModel
from tests.netem.test_delivery_record import FakeLink, one_link_config

WEATHER = LinkSpec(
    delay_s=0.010, jitter_s=0.008, reorder=True, loss=LossModel.parse("gemodel:10%,30%,60%")
)
PACKETS = 200


def numbered(index: int) -> bytes:
    return bytes([0x45, 0]) + index.to_bytes(2, "big") + bytes(60)


def weather(shaper: Shaper, link: FakeLink, now: float) -> list[int]:
    """Which of PACKETS numbered packets sent a->b at `now` come out at b, in their order (the
    loss draws choose which, the jitter draws the order)."""
    source = shaper.routes[0].source_fd
    for index in range(PACKETS):
        link.far["a"].send(numbered(index))
    while select.select([source], [], [], 0)[0]:  # a turn reads at most READ_BATCH packets
        shaper.turn([source], now, early=0.0)
    shaper.turn([], now + 1.0, early=0.0)
    out = []
    while True:
        try:
            out.append(int.from_bytes(link.far["b"].recv(65536)[2:4], "big"))
        except BlockingIOError:
            return out


def shaper_of(seed: int, tmp_path: Path, name: str) -> tuple[Shaper, FakeLink]:
    config = one_link_config(WEATHER, tmp_path / name)
    config["links"][0]["seed"] = seed
    (tmp_path / name).mkdir()
    link = FakeLink()
    return Shaper(config, link.open_end, now=lambda: 0.0), link


def test_restarted_draws_meet_a_fresh_links_weather(tmp_path: Path) -> None:
    fresh, fresh_link = shaper_of(3, tmp_path, "fresh")
    used, used_link = shaper_of(3, tmp_path, "used")
    try:
        first = weather(fresh, fresh_link, 10.0)
        assert len(first) < PACKETS and first != sorted(first)  # lossy and jittered
        assert weather(used, used_link, 10.0) == first  # the same seed, the same weather
        carried_on = weather(used, used_link, 20.0)
        assert carried_on != first  # the draws went on from where the first run left them
        answer = used._handle(json.dumps({"op": "restart_draws", "seed": 3}).encode())
        assert answer == {"ok": True}
        assert weather(used, used_link, 30.0) == first
        used._handle(json.dumps({"op": "restart_draws", "seed": 4}).encode())
        assert weather(used, used_link, 40.0) != first  # another seed's weather
    finally:
        for shaper, link in ((fresh, fresh_link), (used, used_link)):
            shaper.control.close()
            link.close()


def test_a_restart_without_a_seed_is_refused(tmp_path: Path) -> None:
    shaper, link = shaper_of(0, tmp_path, "shaper")
    try:
        answer = shaper._handle(b'{"op": "restart_draws"}')
        assert answer["ok"] is False and "seed" in answer["error"]
    finally:
        shaper.control.close()
        link.close()


@pytest.mark.parametrize("loss", ["5%", "gemodel:10%,30%"])
def test_a_direction_restarted_draws_as_one_just_made(loss: str) -> None:
    """Loss, Gilbert-Elliott state and jitter: all as a new direction of that seed."""
    spec = LinkSpec(delay_s=0.01, jitter_s=0.005, reorder=True, loss=LossModel.parse(loss))
    draw = random.Random(1)
    sizes = [draw.choice([64, 1500]) for _ in range(300)]

    def through(direction: Direction, start: float) -> list[tuple[int, float]]:
        for index, size in enumerate(sizes):
            direction.push(index.to_bytes(2, "big") + bytes(size), start + index * 1e-4)
        return [(int.from_bytes(p[:2], "big"), t - start) for p, t in direction.release(start + 1)]

    fresh, used = Direction(spec, seed=9), Direction(spec, seed=9)
    first = through(fresh, 0.0)
    assert through(used, 0.0) == first
    assert through(used, 5.0) != first
    used.restart_draws(9)
    again = through(used, 10.0)
    assert [i for i, _ in again] == [i for i, _ in first]
    assert [t for _, t in again] == pytest.approx([t for _, t in first])


def test_no_two_links_of_any_runs_draw_alike() -> None:
    """Every (seed, link, direction) has a seed of its own: seed 500's WAN once drew as seed 0's
    intra-DC path did (`seed * 2 + index * 1000`)."""
    seeds = [0, 1, 499, 500, 501, 1000, SEED_LIMIT - 1]
    drawn = [
        value
        for seed in seeds
        for index in (0, 1)
        for value in direction_seeds(seed, index).values()
    ]
    assert len(drawn) == len(set(drawn))
    assert direction_seeds(7, 0) == {"a2b": 14, "b2a": 15}  # the WAN's draws as before


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT])
def test_a_seed_out_of_range_is_refused(seed: int) -> None:
    with pytest.raises(ValueError, match="seed must be in"):
        direction_seeds(seed, 0)
