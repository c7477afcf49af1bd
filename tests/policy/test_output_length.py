"""The router's output length predictor: it is fed what a router knows (a trace with its
output lengths removed), learns from lengths it observes after requests end, and the frontend's
routing never reads a request's true output length."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from pddemu.policy.output_length import OutputLengthPredictor, PromptFeatures
from pddemu.roles.sizing import cost_model
from pddemu.workload.stats import PrefixHitCounter
from tests.roles.in_process import admit, frontend

EXCERPT = Path(__file__).parents[1] / "workload" / "data" / "mooncake_excerpt.jsonl"


def test_prompt_features_carry_no_output_length() -> None:
    assert [f.name for f in fields(PromptFeatures)] == ["session", "input_tokens", "new_tokens"]


def test_a_trace_without_output_lengths_is_predicted_online() -> None:
    lines = [json.loads(line) for line in EXCERPT.read_text().splitlines()]
    outputs = [line.pop("output_length") for line in lines]  # held back: the router's view
    assert all("output_length" not in line for line in lines)
    hits = PrefixHitCounter(512, None)
    predictor = OutputLengthPredictor()
    predicted = []
    for line, output in zip(lines, outputs, strict=True):
        ids = np.asarray(line["hash_ids"], dtype=np.int64)
        hit = hits.observe(ids, line["input_length"])
        features = PromptFeatures(None, line["input_length"], line["input_length"] - hit)
        prediction = predictor.predict(features)
        assert math.isfinite(prediction.tokens) and prediction.tokens > 0
        predicted.append(prediction.tokens)
        predictor.observe(features, output, prediction)  # the length seen once it ended
    assert predicted[0] == pytest.approx(1024)  # nothing seen yet: the prior
    assert predicted[-1] == pytest.approx(math.exp(np.median(np.log(outputs[:-1]))))


def test_a_session_that_repeats_itself_is_learnt() -> None:
    predictor = OutputLengthPredictor()
    for _ in range(60):  # sessions each with one habitual length: the session median wins
        for session, habit in (("short", 60), ("long", 3000)):
            features = PromptFeatures(session, 50_000, 500)
            predictor.observe(features, habit, predictor.predict(features))
    short = predictor.predict(PromptFeatures("short", 50_000, 500))
    long = predictor.predict(PromptFeatures("long", 50_000, 500))
    assert predictor.session_weight() > 0.9
    assert short.tokens < 100 < 2000 < long.tokens
    assert short.probability_below(500) > 0.9 > long.probability_below(500)
    assert short.quantile(0.5) == pytest.approx(short.tokens)


def test_sessions_that_say_nothing_are_weighed_down() -> None:
    rng = np.random.default_rng(0)
    predictor = OutputLengthPredictor()
    for turn in range(400):
        features = PromptFeatures(f"s{turn % 20}", 50_000, 500)
        output = int(rng.lognormal(math.log(1000), 0.8))  # independent of the session
        predictor.observe(features, output, predictor.predict(features))
    assert predictor.session_weight() < 0.5


def test_the_frontend_routes_without_reading_the_true_output_length() -> None:
    def unreadable(*_: object) -> object:
        raise AssertionError("the router read the true output length")

    # An output length whose every use (arithmetic, comparison, conversion) fails the test.
    operations = "int float index bool add radd sub rsub mul rmul floordiv truediv lt le gt ge"
    Unreadable = type("Unreadable", (), {f"__{name}__": unreadable for name in operations.split()})

    async def scenario() -> tuple[str, str]:
        fe = frontend()
        fe.system, fe.rld_names, fe.load["RLD0"] = "pdd", ["RLD0"], 0
        fe.relay_cost = cost_model(fe.config, "pdd", "RLD")
        decisions = []
        for rid in ("a", "b"):
            flight = admit(fe, rid)
            flight.record.expected_output_tokens = Unreadable()
            flight.record.p_hit_tokens = 32
            features = fe.routing_features(flight)
            decisions.append((features, fe.decide(features, fe.predictor.predict(features), 3)))
        return decisions[0], decisions[1]

    first, second = asyncio.run(scenario())
    assert first == second
