"""No oracle at the instances, driven in-process: the relay's choice to keep a request rather
than hand it over, and the KV memory a decode instance reserves, follow the router's
prediction of the output length whatever the true length (which the leg's meta may even lack);
the true end is learnt only when it comes (the stream ends there, a request that outlives its
prediction grows its reservation token by token, and is handed over after all)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from pddemu.config import load_config
from pddemu.model import greedy
from pddemu.model.kv import KV
from pddemu.policy.handoff import ONE_SHOT
from pddemu.policy.output_length import OutputPrediction
from pddemu.roles.decode import DecodeRequest
from pddemu.roles.main_decode import MainDecodeInstance
from pddemu.roles.relay import Handoff, RelayInstance
from pddemu.runtime.channel import Envelope
from pddemu.wire import TokenIds
from tests.roles.in_process import KvLinkEnd, admit, frontend, instance

CONFIG = load_config(None, ["scale.time_scale=20"])
G = CONFIG.scale.token_scale
INPUT = 30 * G  # modelled prompt tokens
PROMPT_IDS = [TokenIds.from_ints("r", 0, range(1, 31))]  # its genuine ids, with its kv_begin
SWITCH = 45  # where the relay's (steered) final part would name MD's switch


class SteeredRelay(RelayInstance):
    """A relay whose final part would name SWITCH; the parts it would send are recorded."""

    parts: list[int | None]

    def switch_position(self, request: DecodeRequest, handoff: Any) -> tuple[int, float]:
        return SWITCH, 0.0

    async def send_part(self, request: DecodeRequest, handoff: Handoff, switch: int | None) -> None:
        self.parts.append(switch)
        handoff.switch = switch


def leg_meta(predicted: int, truth: int | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"input_tokens": INPUT, "frontend": "FE0", "md": "MD0"}
    meta["predicted_output_tokens"] = predicted
    if truth is not None:
        meta["output_tokens"] = truth
    return meta


def relay_decisions(predicted: int, truth: int | None) -> list[tuple[bool, list[int | None]]]:
    """(keeps the request, parts sent) after the relay's step at position 30, then at 41."""

    async def scenario() -> list[tuple[bool, list[int | None]]]:
        relay = instance(SteeredRelay, "RLD", CONFIG)
        relay.parts = []
        request = DecodeRequest("r", leg_meta(predicted, truth), KV.empty(relay.model_config), 30)
        request.outputs, request.decoding = [1, 2], True
        handoff = relay.handoffs["r"] = Handoff(ONE_SHOT, [])
        seen = []
        for position in (30, 41):
            request.emitted = position
            await relay.after_step(request)
            seen.append((handoff.finishing, list(relay.parts)))
        return seen

    return asyncio.run(scenario())


@pytest.mark.parametrize("truth", [None, 35, 400, 10_000])
def test_the_relay_keeps_a_request_by_its_prediction_and_hands_it_over_once_it_outlives_it(
    truth: int | None,
) -> None:
    # predicted to end (at 40) before the switch (45): kept, whatever the truth; once it has
    # outlived the prediction (at 41, no EOS came), handed over as any other
    assert relay_decisions(40, truth) == [(True, []), (False, [SWITCH])]
    # predicted to outlive the switch: handed over at once, whatever the truth (a truth of
    # 35 ends the stream before the switch: the relay learns it only when it comes)
    assert relay_decisions(400, truth) == [(False, [SWITCH]), (False, [SWITCH])]


@pytest.mark.parametrize("truth", [1, 400, 10_000])
def test_memory_admitted_for_a_transfer_is_the_prompt_and_the_predicted_output(truth: int) -> None:
    async def scenario() -> int:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        body = {"rid": "r", "prompt_tokens": 30, "offset": 0, "meta": leg_meta(40, truth)}
        body["meta"]["pipeline"] = "P-MD"
        await md.on_kv_begin(Envelope("kv_begin", body, PROMPT_IDS, KvLinkEnd()))
        return md.kv_reserved

    assert asyncio.run(scenario()) == INPUT + 40


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("output_tokens", None),
        ("output_tokens", "40"),
        ("output_tokens", 0),
        ("predicted_output_tokens", math.nan),
        ("predicted_output_tokens", math.inf),
    ],
)
def test_a_transfer_with_a_bad_output_length_is_refused_at_its_begin(key: str, value: Any) -> None:
    """Refused when it begins, naming the key, with no memory held: not inside a decode step
    (which would drop the whole batch) nor at rounding a prediction."""

    async def scenario() -> int:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        body = {"rid": "r", "prompt_tokens": 30, "offset": 0, "meta": leg_meta(40, 400)}
        body["meta"]["pipeline"] = "P-MD"
        if value is None:
            del body["meta"][key]
        else:
            body["meta"][key] = value
        with pytest.raises(ValueError, match=key):
            await md.on_kv_begin(Envelope("kv_begin", body, PROMPT_IDS, KvLinkEnd()))
        return md.kv_reserved

    assert asyncio.run(scenario()) == 0


@pytest.mark.parametrize("predicted", [1, 4 * (1 + 2 * G)])
def test_a_stream_ends_at_its_eos_and_outliving_the_prediction_grows_the_reservation(
    predicted: int,
) -> None:
    truth = 1 + 2 * G  # P's token, then two genuine outputs of G modelled tokens

    async def scenario() -> tuple[list[int], int, int, list[str]]:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        await md.start()
        prompt = list(range(30))
        kv, logits = md.model.prefill(prompt, None, 64)
        meta = {**leg_meta(predicted, truth), "pipeline": "P-MD"}
        request = DecodeRequest("r", meta, kv, len(prompt))
        await md.reserve_memory(request)
        held = [md.kv_reserved]
        assert held == [INPUT + predicted]
        cover = md.cover

        def covered(request: DecodeRequest) -> None:  # the reservation after every step
            cover(request)
            held.append(md.kv_reserved)

        md.cover = covered
        await md.start_stream(request, greedy(logits))
        for _ in range(2000):
            if "r" not in md.requests:
                break
            await asyncio.sleep(0.005)
        positions = [
            first
            for _, kind, body in md.told
            if kind == "tokens"
            for first in range(body["first"], body["first"] + len(body["times"]))
        ]
        return positions, max(held), md.kv_grown_tokens, md.errors + [f"left {md.kv_reserved}"]

    positions, most, grown, errors = asyncio.run(scenario())
    assert errors == ["left 0"]
    assert positions == list(range(truth))  # every position once, nothing past the EOS
    assert grown == max(0, truth - predicted)
    assert most == INPUT + max(truth, predicted)


def test_a_leg_tells_its_instances_the_prediction_and_no_length_to_plan_with() -> None:
    fe = frontend()
    flight = admit(fe, "r")
    assert "predicted_output_tokens" not in fe.leg_meta(flight)  # none made yet
    flight.prediction = OutputPrediction(math.log(40.4), 0.5)
    meta = fe.leg_meta(flight)
    assert meta["predicted_output_tokens"] == 40
    # the EOS position (the workload's) is all of the true length an instance is told
    assert meta["output_tokens"] == flight.record.expected_output_tokens
    assert "genuine_output_tokens" not in meta


@pytest.mark.parametrize("ended", ["finished", "dropped"])
def test_a_release_after_md_ended_the_request_leaves_nothing_behind(ended: str) -> None:
    """The true EOS may come before the relay's switch: MD finishes the request, and the
    frontend's release (KV expected) comes after. Nothing of it is still on its way, so nothing
    of it is kept; a release for a request whose KV has not come yet is still remembered."""

    async def scenario() -> tuple[set[str], set[str]]:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        meta = {**leg_meta(40, 400), "pipeline": "P-RLD-MD"}
        request = DecodeRequest("r", meta, KV.empty(md.model_config), 30)
        md.requests["r"] = request
        await md.reserve_memory(request)
        await (md.finished(request) if ended == "finished" else md.drop(request))
        for rid in ("r", "coming"):
            body = {"rid": rid, "kv_expected": True}
            await md.on_release(Envelope("release", body, [], object()))
        return set(md.released), set(md.ended)

    assert asyncio.run(scenario()) == ({"coming"}, set())


def test_the_most_kv_held_beyond_capacity_is_kept_in_the_stats() -> None:
    """A request admitted just below capacity outlives its reservation by 20 tokens: 15 beyond
    capacity; once it is gone, one longer than the capacity is admitted alone: 100 beyond. The
    stats keep the peak, 100, after both have left."""

    async def scenario() -> tuple[list[int], dict[str, Any]]:
        md = instance(MainDecodeInstance, "MD", CONFIG)
        capacity = md.cost.kv_capacity_tokens()
        prompt = list(range(30))
        kv, _ = md.model.prefill(prompt, None, 64)
        growing = DecodeRequest("a", {"input_tokens": capacity - 5}, kv, len(prompt))
        await md.reserve_memory(growing)
        growing.emitted = 20  # it outlived its (absent) prediction by 20 tokens
        md.cover(growing)
        peaks = [md.kv_peak_over_capacity_tokens]
        await md.release_memory(growing)
        alone = await md.reserve_tokens(capacity + 100)
        peaks.append(md.kv_peak_over_capacity_tokens)
        await md.release_tokens(alone)
        return peaks, md.stats()

    peaks, stats = asyncio.run(scenario())
    assert peaks == [15, 100]
    assert stats["kv_peak_over_capacity_tokens"] == 100 and stats["kv_reserved_tokens"] == 0
