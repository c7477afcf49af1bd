"""How well the router predicts output lengths without knowing them (pddemu.policy.output_length),
on pdd-janfeb (its generator's 2,000 requests, seed 0) and on the WEKA agentic trace
(`pddemu.workload.public_traces`: 49,334 requests of 710 Claude Code conversations, in file
order).

Each request is predicted from its features alone (session, input tokens, new tokens beyond the
prefix hit under an infinite cache in the trace's order), then its true output is observed, as
the router observes a request's delivered length when it ends: an agentic session's next turn
comes after the previous one ended, so its history is complete when it is routed. Reported:
the median absolute error of the log output (0.69 = a factor of 2), the share predicted within a
factor of 2, the mean absolute error in tokens, the same for two baselines (the running median
of all outputs; the population alone, without session history), and the early routing of the
anomaly filter: among long-input requests, how many it would send relay-only (predicted
P(output < 500) at least `anomaly_confidence`) and how many of those are short (precision) out
of all short ones (recall).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import closing
from typing import Any

from pddemu.config import load_config
from pddemu.policy.output_length import OutputLengthPredictor, PromptFeatures
from pddemu.workload.formats import read_trace
from pddemu.workload.janfeb import generate_pdd_janfeb
from pddemu.workload.janfeb_config import PddJanFebConfig
from pddemu.workload.public_traces import WEKA_FILE, public_traces_dir
from pddemu.workload.stats import PrefixHitCounter

QUICK_REQUESTS = 3000


def janfeb(quick: bool) -> Iterator[tuple[PromptFeatures, int]]:
    trace = generate_pdd_janfeb(PddJanFebConfig(requests=500 if quick else 2000), 0)
    for record, hit in zip(trace.records, trace.intended_hit_tokens, strict=True):
        features = PromptFeatures(record.session, record.input_tokens, record.input_tokens - hit)
        yield features, record.output_tokens


def weka(quick: bool) -> Iterator[tuple[PromptFeatures, int]]:
    counter: PrefixHitCounter | None = None
    with closing(read_trace(public_traces_dir() / WEKA_FILE, "weka")) as records:
        for count, record in enumerate(records):
            if quick and count >= QUICK_REQUESTS:
                return
            if counter is None:
                counter = PrefixHitCounter(record.block_tokens or 64, None)
            hit = 0
            if record.block_ids is not None:
                hit = counter.observe(record.block_ids, record.input_tokens)
            features = PromptFeatures(
                record.session, record.input_tokens, record.input_tokens - hit
            )
            yield features, record.output_tokens


def evaluate(stream: Iterable[tuple[PromptFeatures, int]]) -> dict[str, Any]:
    policy = load_config().policy
    predictor = OutputLengthPredictor()
    population = OutputLengthPredictor()  # the same, blind to sessions
    running: deque[float] = deque(maxlen=512)
    errors: dict[str, list[float]] = {"predictor": [], "population": [], "running_median": []}
    absolute: dict[str, list[float]] = {name: [] for name in errors}
    flagged = short = both = long_inputs = 0
    for features, output in stream:
        truth = math.log(max(1, output))
        prediction = predictor.predict(features)
        blind = PromptFeatures(None, features.input_tokens, features.new_tokens)
        alone = population.predict(blind)
        guesses = {
            "predictor": prediction.log_median,
            "population": alone.log_median,
            "running_median": statistics.median(running) if running else predictor.prior,
        }
        for name, guess in guesses.items():
            errors[name].append(abs(guess - truth))
            absolute[name].append(abs(math.exp(guess) - output))
        if features.input_tokens >= policy.anomaly_min_input_tokens:
            long_inputs += 1
            is_short = output < policy.anomaly_output_threshold
            says_short = (
                prediction.probability_below(policy.anomaly_output_threshold)
                >= policy.anomaly_confidence
            )
            short += is_short
            flagged += says_short
            both += is_short and says_short
        predictor.observe(features, output, prediction)
        population.observe(blind, output, alone)
        running.append(truth)
    return {
        "requests": len(errors["predictor"]),
        **{
            name: {
                "median_abs_log_error": statistics.median(values),
                "within_2x": sum(v < math.log(2) for v in values) / len(values),
                "mean_abs_error_tokens": statistics.fmean(absolute[name]),
            }
            for name, values in errors.items()
        },
        "early_routing": {
            "long_input_requests": long_inputs,
            "short_output_among_them": short,
            "routed_relay_only": flagged,
            "precision": both / flagged if flagged else None,
            "recall": both / short if short else None,
        },
    }


def run(quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {"pdd-janfeb": evaluate(janfeb(quick))}
    path = public_traces_dir() / WEKA_FILE
    results["weka"] = evaluate(weka(quick)) if path.exists() else {"error": f"{path} not found"}
    return results
