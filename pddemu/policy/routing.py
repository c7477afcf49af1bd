"""Which pipeline a request takes (PDD's routing rule is not public; this is ours).

Default `wan-time`: a request whose predicted WAN transfer time (its increment beyond what MD
already holds, see `WanEstimator`) is at most `wan_time_threshold_s` goes P->MD; any other goes
P->RLD->MD. Before that, the anomalous-traffic filter's early routing: a request with long input
(>= `anomaly_min_input_tokens`) that the output-length predictor (`output_length.py`; the router
never knows the true length) gives at least `anomaly_confidence` of producing fewer than
`anomaly_output_threshold` tokens, and that the relay is predicted to finish before its KV would
reach MD even at that confidence's output length, completes on the relay alone (RLD-only), and
its WAN transfer is not made. (The filter's other half, cutting off the transfer of a relayed
request the relay finished first, is the frontend's: `pddemu/roles/frontend.py`.) A general
P->RLD pipeline is not offered.

`always-relay` and `never-relay` are there to show how results move with the rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pddemu.config import PolicyConfig


@dataclass(frozen=True)
class RouteInputs:
    """What the router knows when it routes (no output length: only its prediction)."""

    input_tokens: int  # modelled
    short_output_probability: float  # predicted P(output < anomaly_output_threshold)
    predicted_wan_s: float  # for this request's increment
    predicted_relay_finish_s: float  # at the confidence's output length; prefill excluded


def anomalous(policy: PolicyConfig, inputs: RouteInputs) -> bool:
    return (
        policy.anomaly_filter
        and inputs.input_tokens >= policy.anomaly_min_input_tokens
        and inputs.short_output_probability >= policy.anomaly_confidence
        and inputs.predicted_relay_finish_s < inputs.predicted_wan_s
    )


def wan_time(policy: PolicyConfig, inputs: RouteInputs) -> str:
    if anomalous(policy, inputs):
        return "RLD-only"
    return "P-MD" if inputs.predicted_wan_s <= policy.wan_time_threshold_s else "P-RLD-MD"


def always_relay(policy: PolicyConfig, inputs: RouteInputs) -> str:
    return "RLD-only" if anomalous(policy, inputs) else "P-RLD-MD"


def never_relay(policy: PolicyConfig, inputs: RouteInputs) -> str:
    return "P-MD"


POLICIES: dict[str, Callable[[PolicyConfig, RouteInputs], str]] = {
    "wan-time": wan_time,
    "always-relay": always_relay,
    "never-relay": never_relay,
}


def choose_pipeline(policy: PolicyConfig, inputs: RouteInputs) -> str:
    try:
        rule = POLICIES[policy.routing]
    except KeyError:
        raise ValueError(
            f"unknown routing policy {policy.routing!r}: use one of {', '.join(POLICIES)}"
        ) from None
    return rule(policy, inputs)
