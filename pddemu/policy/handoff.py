"""How the relay hands a request over to MD: the switch position and the mode (PDD leaves the
switching rule open; this is ours).

The relay streams every output position before the switch position S, MD every one from S: the
two agree on S (the relay names it in its final handoff part), so no position is delivered twice
or not at all. What the user sees at S is a gap: MD's first token needs the final part to cross
the WAN to MD, MD's next step boundary (at most one MD step m), MD to absorb the part (a(k):
the fused step that recomputes its k tokens, or the copy of their KV), one MD step per position
from the relay's position p to S, and the way back to the frontend: together the WAN's round
trip D. The relay makes one position per relay step r. With L = S - p:

    gap(L)   = D + m + a(k) + (L + 1) m - L r
    stall(L) = gap(L) - m = D + m + a(k) + L (m - r)         (the TPOT is about m after S)

- If the relay is slower than MD (r > m), a lead of L = (D + m + a(k)) / (r - m) positions
  hides the whole gap: the relay keeps streaming while MD catches up on its own.
- If not (r <= m), no lead helps: the earliest switch is the best one, and the gap is at least
  one WAN round trip plus an MD step.

Modes:
- one-shot: the relay stops at once (L = 0) and sends everything MD lacks (k = all eager tokens);
- catch-up: the relay keeps decoding and sends what MD lacks in parts, each after MD has absorbed
  the previous one, until at most `catch_up_threshold_tokens` are pending; the final part then
  carries few tokens (small a(k)) and, when the relay is the slower one, a lead L (at most
  `catch_up_threshold_tokens`);
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


@dataclass(frozen=True)
class HandoffOutlook:
    """The relay's estimates when it decides (modelled seconds and modelled tokens)."""

    pending_tokens: int  # output positions MD lacks now
    relay_step_s: float  # the relay's decode step now (r)
    md_step_s: float  # MD's decode step once the request is in its batch (m)
    round_trip_s: float  # the WAN to MD and back, with a margin for its jitter (D)
    absorb_s: Callable[[int], float]  # MD's time to absorb a part of k tokens, a(k)
    relay_load: float  # share of the relay's batch in use


def stall_s(outlook: HandoffOutlook, part_tokens: int, lead: int) -> float:
    """Predicted user-visible stall (gap minus TPOT) at the switch, `lead` positions after the
    final part of `part_tokens` tokens is sent."""
    o = outlook
    behind = o.round_trip_s + o.md_step_s + o.absorb_s(part_tokens)
    return max(0.0, behind + lead * (o.md_step_s - o.relay_step_s))


def lead_tokens(outlook: HandoffOutlook, part_tokens: int, most: int) -> int:
    """Positions the relay keeps streaming after its final part so that MD's first token is due
    when the relay's next one would have been: 0 unless the relay is the slower decoder, at most
    `most`."""
    o = outlook
    if o.relay_step_s <= o.md_step_s:
        return 0
    behind = o.round_trip_s + o.md_step_s + o.absorb_s(part_tokens)
    return min(most, math.ceil(behind / (o.relay_step_s - o.md_step_s)))


def round_tokens(outlook: HandoffOutlook, part_tokens: int) -> int:
    """Positions the relay makes while one part of `part_tokens` goes to MD and MD's answer
    comes back: what the next part will carry."""
    o = outlook
    trip = o.round_trip_s + o.md_step_s + o.absorb_s(part_tokens)
    return math.ceil(trip / o.relay_step_s)


def predicted_stalls(outlook: HandoffOutlook, threshold: int) -> dict[str, float]:
    """The stall each mode is predicted to give, from the current estimates."""
    pending = max(1, outlook.pending_tokens)
    final = pending
    while final > threshold:  # catch-up rounds until at most `threshold` are pending
        following = round_tokens(outlook, final)
        if following >= final:  # MD cannot gain on the relay: the rounds would never end
            break
        final = following
    lead = lead_tokens(outlook, final, threshold)
    return {ONE_SHOT: stall_s(outlook, pending, 0), CATCH_UP: stall_s(outlook, final, lead)}


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
