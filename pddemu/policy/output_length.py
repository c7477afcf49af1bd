"""The router's prediction of a request's output length, from what a real router knows.

A router does not know how many tokens a request will produce; it knows the request's session
(the conversation, or the client, that sent it), the prompt's length, how much of the prompt
the prefix cache already holds, and what earlier requests produced once they ended. This
predictor uses exactly that (`PromptFeatures` has no output length; `observe` is called with
the length the router saw delivered, after the request ended):

- population: the median log output of recent requests whose new tokens (prompt beyond the
  cache's hit) fall in the same power-of-two bucket; fewer than `MIN_BUCKET` such requests:
  of all recent requests; none yet: `prior_tokens`;
- session: the median log output of the session's earlier requests, blended with the
  population's by their precisions (inverse mean squared errors of each, measured on recent
  requests that had a session history): a workload whose sessions say nothing of their next
  output (independent draws) learns to ignore them, one whose sessions repeat leans on them;
- spread: the standard deviation of recent log errors, so a prediction is a log-normal
  distribution, median `tokens` and `P(output < x)` for any x.

The anomaly filter routes a long-input request relay-only when the predictor is confident its
output is short (`pddemu/policy/routing.py`). `python -m pddemu.bench --only output_length`
measures the error on pdd-janfeb and on the WEKA agentic trace (docs/validation.md, "The
router's output length prediction").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass

HISTORY = 512  # recent outputs kept per population bucket, and recent errors
SESSION_HISTORY = 16  # recent outputs kept per session
MIN_BUCKET = 20  # outputs a bucket needs (and errors the spread and weights need) before use
DEFAULT_SPREAD = 1.0  # log-space deviation before any error has been seen


@dataclass(frozen=True)
class PromptFeatures:
    """What the router knows of a request when it routes it (no output length)."""

    session: str | None
    input_tokens: int  # modelled
    new_tokens: int  # modelled prompt tokens beyond the prefix cache's hit


@dataclass(frozen=True)
class OutputPrediction:
    log_median: float
    log_spread: float

    @property
    def tokens(self) -> float:
        """The predicted median output length (modelled tokens)."""
        return math.exp(self.log_median)

    def quantile(self, q: float) -> float:
        """The output length the request stays under with probability q."""
        return math.exp(self.log_median + self.log_spread * statistics.NormalDist().inv_cdf(q))

    def probability_below(self, tokens: float) -> float:
        """P(output < tokens) under the predicted log-normal distribution."""
        if tokens <= 0:
            return 0.0
        z = (math.log(tokens) - self.log_median) / self.log_spread
        return statistics.NormalDist().cdf(z)


class OutputLengthPredictor:
    def __init__(self, prior_tokens: float = 1024.0) -> None:
        self.prior = math.log(prior_tokens)
        self.sessions: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=SESSION_HISTORY))
        self.buckets: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=HISTORY))
        self.recent: deque[float] = deque(maxlen=HISTORY)
        self.errors: deque[float] = deque(maxlen=HISTORY)
        # squared errors of the session's and the population's medians alone, when both exist
        self.session_errors: deque[float] = deque(maxlen=HISTORY)
        self.population_errors: deque[float] = deque(maxlen=HISTORY)

    @staticmethod
    def bucket(features: PromptFeatures) -> int:
        return max(0, int(features.new_tokens)).bit_length()

    def predict(self, features: PromptFeatures) -> OutputPrediction:
        population = self._population(features)
        median = population
        session = self._session(features)
        if session is not None:
            weight = self.session_weight()
            median = weight * session + (1 - weight) * population
        spread = statistics.pstdev(self.errors) if len(self.errors) >= MIN_BUCKET else 0.0
        return OutputPrediction(median, spread if spread > 0 else DEFAULT_SPREAD)

    def session_weight(self) -> float:
        """The session median's share: its precision over the sum of both precisions (a half
        until enough requests with a session history have been seen)."""
        if len(self.session_errors) < MIN_BUCKET:
            return 0.5
        session = statistics.fmean(self.session_errors)
        population = statistics.fmean(self.population_errors)
        if session + population == 0:
            return 0.5
        return population / (session + population)

    def observe(
        self, features: PromptFeatures, output_tokens: int, predicted: OutputPrediction
    ) -> None:
        """The request ended having produced `output_tokens`; `predicted` is what `predict`
        said when it was routed."""
        value = math.log(max(1, output_tokens))
        self.errors.append(value - predicted.log_median)
        session = self._session(features)
        if session is not None:
            self.session_errors.append((value - session) ** 2)
            self.population_errors.append((value - self._population(features)) ** 2)
        if features.session is not None:
            self.sessions[features.session].append(value)
        self.buckets[self.bucket(features)].append(value)
        self.recent.append(value)

    def _population(self, features: PromptFeatures) -> float:
        bucket = self.buckets.get(self.bucket(features), ())
        if len(bucket) >= MIN_BUCKET:
            return statistics.median(bucket)
        if self.recent:
            return statistics.median(self.recent)
        return self.prior

    def _session(self, features: PromptFeatures) -> float | None:
        history = self.sessions.get(features.session) if features.session is not None else None
        return statistics.median(history) if history else None
