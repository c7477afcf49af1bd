"""How the relay hands a request over to MD: the switch position, the pace of the relay's last
tokens, and the mode (PDD leaves the switching rule open; this is ours).

The relay streams every output position before the switch position S, MD every one from S: the
two agree on S (the relay names it in its final handoff part), so no position is delivered twice
or not at all. What the user would see at S is a gap: MD's first token needs the final part to
cross the WAN to MD, MD's next step boundary (at most one MD step m), MD to absorb the part
(a(k): the fused step that recomputes its k tokens, or the copy of their KV), one MD step per
position from the relay's position p to S, and the way back to the frontend: together with the
WAN's round trip D, MD is `behind = D + m + a(k)` behind a relay that stops at p. If the relay
instead delivers the L = S - p positions of a lead one every `pace` seconds:

    gap at S  = behind + (L + 1) m - L pace
    stall(S)  = gap - m = behind - L (pace - m)              (the TPOT is about m after S)

and every gap of the lead is `pace`, a stall of pace - m. So:
- a relay slower than MD (its step r > m) streams at its own pace r, and a lead of
  L = behind / (r - m) hides the gap;
- a relay as fast or faster (r <= m, the common case: its small batch against MD's large one)
  delivers its lead at pace = m + behind / L, never faster than it decodes: the round trip the
  user would have waited for at once is spread over L tokens, each late by behind / L. The
  relay decodes the lead at its own speed and holds each token until its time (an output
  buffer), so it is freed as soon as it reaches S; MD's side, and so the request's end, is the
  same as with no lead at all.
L is chosen so that behind / L is at most `PACE_SLACK` of m, within `catch_up_threshold_tokens`.
This is the plan; once MD has absorbed the final part it says when it will produce S (`md_eta`,
from its own steps as they happen) and the relay re-paces what it still holds (`paced_step`), so
the gap at S does not rest on predicting MD's steps over the whole lead.

Modes:
- one-shot: the relay stops at once (L = 0) and sends everything MD lacks (k = all eager tokens):
  the user sees one gap of `behind + m`, and the relay is freed soonest;
- catch-up: the relay keeps decoding and sends what MD lacks in parts, each after MD has absorbed
  the previous one, until at most `catch_up_threshold_tokens` are pending; the final part then
  carries few tokens (small a(k)) and a lead, delivered at the pace above;
- adaptive: one-shot when the relay's batch is at least `adaptive_load_threshold` full (PDD:
  free the relay soonest), else whichever predicts the smaller stall, catch-up only when it saves
  more than one relay step (it holds the relay at least one round trip longer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from pddemu.config import PolicyConfig

ONE_SHOT = "one_shot"
CATCH_UP = "catch_up"
PACE_SLACK = 0.25  # the lead's tokens may each come this share of MD's step late


@dataclass(frozen=True)
class HandoffOutlook:
    """The relay's estimates when it decides (modelled seconds and modelled tokens)."""

    pending_tokens: int  # output positions MD lacks now
    relay_step_s: float  # the relay's decode step now (r)
    md_step_s: float  # MD's decode step once the request is in its batch (m)
    round_trip_s: float  # the WAN to MD and back, with a margin for its jitter (D)
    absorb_s: Callable[[int], float]  # MD's time to absorb a part of k tokens, a(k)
    relay_load: float  # share of the relay's batch in use


def behind_s(outlook: HandoffOutlook, part_tokens: int) -> float:
    """How far behind a relay that stops now MD's first token reaches the user, beyond one MD
    step: the round trip, MD's step boundary and absorbing a final part of `part_tokens`."""
    o = outlook
    return o.round_trip_s + o.md_step_s + o.absorb_s(part_tokens)


@dataclass(frozen=True)
class Lead:
    """Positions the relay streams after its final part, and the pace it delivers them at."""

    tokens: int
    pace_s: float


def lead(outlook: HandoffOutlook, part_tokens: int, most: int) -> Lead:
    """The lead that hides MD's delay: at the relay's own pace when it is the slower decoder,
    else at MD's pace plus a slack (see the module's notes); at most `most` positions."""
    o = outlook
    behind = behind_s(o, part_tokens)
    if most < 1:
        return Lead(0, 0.0)
    if o.relay_step_s > o.md_step_s:
        return Lead(min(most, math.ceil(behind / (o.relay_step_s - o.md_step_s))), o.relay_step_s)
    tokens = min(most, max(1, math.ceil(behind / (PACE_SLACK * o.md_step_s))))
    return Lead(tokens, max(o.relay_step_s, o.md_step_s + behind / tokens))


def paced_step(delivered_at: float, last_due: float, positions: int) -> float:
    """The pace that spreads `positions` still to deliver evenly from `delivered_at` to
    `last_due` (none if the last is due already): the lead re-planned on MD's word."""
    if positions < 1:
        return 0.0
    return max(0.0, (last_due - delivered_at) / positions)


def stall_s(outlook: HandoffOutlook, part_tokens: int, planned: Lead) -> float:
    """Predicted user-visible stall (a gap minus the TPOT, about MD's step): the largest of the
    gap at the switch and the lead's own gaps, after a final part of `part_tokens`."""
    o = outlook
    at_switch = behind_s(o, part_tokens) - planned.tokens * (planned.pace_s - o.md_step_s)
    in_lead = planned.pace_s - o.md_step_s if planned.tokens else 0.0
    return max(0.0, at_switch, in_lead)


def round_tokens(outlook: HandoffOutlook, part_tokens: int) -> int:
    """Positions the relay makes while one part of `part_tokens` goes to MD and MD's answer
    comes back: what the next part will carry."""
    return math.ceil(behind_s(outlook, part_tokens) / outlook.relay_step_s)


def predicted_stalls(outlook: HandoffOutlook, threshold: int) -> dict[str, float]:
    """The stall each mode is predicted to give, from the current estimates."""
    pending = max(1, outlook.pending_tokens)
    final = pending
    while final > threshold:  # catch-up rounds until at most `threshold` are pending
        following = round_tokens(outlook, final)
        if following >= final:  # MD cannot gain on the relay: the rounds would never end
            break
        final = following
    return {
        ONE_SHOT: stall_s(outlook, pending, Lead(0, 0.0)),
        CATCH_UP: stall_s(outlook, final, lead(outlook, final, threshold)),
    }


def choose_mode(policy: PolicyConfig, outlook: HandoffOutlook) -> str:
    if policy.handoff_mode == "one-shot":
        return ONE_SHOT
    if policy.handoff_mode == "catch-up":
        return CATCH_UP
    if outlook.relay_load >= policy.adaptive_load_threshold:
        return ONE_SHOT
    stalls = predicted_stalls(outlook, policy.catch_up_threshold_tokens)
    saves = stalls[ONE_SHOT] - stalls[CATCH_UP]
    return CATCH_UP if saves > outlook.relay_step_s else ONE_SHOT


@dataclass
class DelayEstimate:
    """One direction's one-way delay on the WAN, from timestamped messages (the deployment's
    clock is shared): a smoothed mean and mean deviation, as TCP estimates its round trip
    (RFC 6298), and `margin()` = mean + 2 deviations, a delay few messages exceed. The two
    directions are kept apart: bulk KV queues on the way to MD, not on the way back."""

    mean_s: float
    deviation_s: float

    def observe(self, sample_s: float) -> None:
        error = sample_s - self.mean_s
        self.mean_s += error / 8
        self.deviation_s += (abs(error) - self.deviation_s) / 4

    def margin(self) -> float:
        return self.mean_s + 2 * self.deviation_s
