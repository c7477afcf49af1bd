"""Import mahimahi delivery traces as a netem schedule.

A mahimahi trace lists, one per line, the millisecond at which the link may deliver one
packet of up to 1504 bytes (an MTU-sized IP packet plus the 4 bytes TUN puts in front); a
millisecond may repeat, and the trace loops with the last timestamp as its period. Here each
opportunity is one 1500-byte IP packet, and the opportunities are counted in bins (10 ms by
default): a bin with n opportunities becomes a rate of n x 1500 x 8 bits per bin, a bin with
none a stalled link (rate 0: packets wait, as in mahimahi). The shaper integrates rate steps
exactly, so the bytes a saturated link delivers per bin are the trace's. Consecutive bins of
equal rate are one step.

UPLINK (mahimahi's traffic from the emulated host outwards) becomes `a2b`, DOWNLINK `b2a`.
When both traces have the same period the schedule repeats with it; otherwise it covers
`duration_s` (default: the longer trace), each trace looping within it, and its last step
holds afterwards.
"""

from __future__ import annotations

import math
from pathlib import Path

from netem.spec import SpecError

OPPORTUNITY_BYTES = 1500
DEFAULT_BIN_MS = 10


def read_trace(path: str | Path) -> list[int]:
    """The opportunities of a mahimahi trace file, in milliseconds (non-decreasing)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SpecError(f"cannot read mahimahi trace {path}: {exc.strerror}") from None
    times: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        if not text.isdigit():
            raise SpecError(
                f"{path}:{number}: expected a whole number of milliseconds, got {text!r}"
            )
        value = int(text)
        if times and value < times[-1]:
            raise SpecError(
                f"{path}:{number}: timestamps must not decrease ({value} after {times[-1]})"
            )
        times.append(value)
    if not times or times[-1] == 0:
        raise SpecError(
            f"{path}: a mahimahi trace needs opportunities and a last timestamp above 0"
        )
    return times


def binned_rates(times: list[int], bin_ms: int, duration_ms: int) -> list[int]:
    """Bit/s of each bin over `duration_ms`, the trace looping with its last timestamp."""
    period = times[-1]
    counts = [0] * math.ceil(duration_ms / bin_ms)
    for start in range(0, duration_ms, period):
        for t in times:
            # an opportunity at ms t is the capacity of the millisecond ending at t (one at 0
            # ends the previous pass)
            if start + t - 1 >= duration_ms:
                break
            counts[((start + t - 1) % duration_ms) // bin_ms] += 1
    return [round(n * OPPORTUNITY_BYTES * 8 * 1000 / bin_ms) for n in counts]


def capacity_bytes(rates_bps: list[int], bin_ms: int, start_s: float, end_s: float) -> float:
    """Bytes a saturated link following `rates_bps` (one rate a bin, looping) delivers between
    `start_s` and `end_s` of the schedule's time: the trace's own count to compare with."""
    bin_s = bin_ms / 1000
    cumulative = [0.0]
    for rate in rates_bps:
        cumulative.append(cumulative[-1] + rate * bin_s / 8)
    period_s = bin_s * len(rates_bps)

    def until(t: float) -> float:
        passes, rest = divmod(t, period_s)
        index = min(int(rest / bin_s), len(rates_bps) - 1)
        partial = (rest - index * bin_s) / bin_s * (cumulative[index + 1] - cumulative[index])
        return passes * cumulative[-1] + cumulative[index] + partial

    return until(end_s) - until(start_s)


def schedule_text(
    uplink: list[int],
    downlink: list[int],
    bin_ms: int = DEFAULT_BIN_MS,
    duration_s: float | None = None,
    header: str = "",
) -> str:
    """The netem schedule replaying the two traces (see the module's docstring)."""
    if bin_ms < 1:
        raise SpecError(f"the bin must be at least 1 ms, got {bin_ms}")
    same_period = uplink[-1] == downlink[-1]
    if duration_s is not None:
        duration_ms = round(duration_s * 1000)
        if duration_ms < bin_ms:
            raise SpecError(f"the duration must cover at least one bin ({bin_ms} ms)")
    else:
        duration_ms = max(uplink[-1], downlink[-1])
    repeat = same_period and duration_s is None
    if repeat and duration_ms % bin_ms:
        raise SpecError(
            f"the traces' period ({duration_ms} ms) is not a whole number of {bin_ms} ms bins: "
            "choose a bin that divides it"
        )
    rates = {
        "a2b": binned_rates(uplink, bin_ms, duration_ms),
        "b2a": binned_rates(downlink, bin_ms, duration_ms),
    }
    lines = [f"# {line}" for line in header.splitlines()]
    current: dict[str, int | None] = {"a2b": None, "b2a": None}
    for index in range(len(rates["a2b"])):
        words = []
        for direction in ("a2b", "b2a"):
            rate = rates[direction][index]
            if rate != current[direction]:
                words.append(f"{direction}.rate={rate}bit" if rate else f"{direction}.rate=0")
                current[direction] = rate
        if words:
            lines.append(f"{index * bin_ms / 1000:.3f} {' '.join(words)}")
    if repeat:
        lines.append(f"{duration_ms / 1000:.3f} repeat")
    return "\n".join(lines) + "\n"


def import_traces(
    uplink: str | Path,
    downlink: str | Path,
    out: str | Path,
    bin_ms: int = DEFAULT_BIN_MS,
    duration_s: float | None = None,
) -> str:
    """Write the schedule for two mahimahi trace files to `out`; returns a one-line summary."""
    up, down = read_trace(uplink), read_trace(downlink)
    header = (
        f"netem schedule imported from mahimahi traces: uplink (a2b) {Path(uplink).name}, "
        f"downlink (b2a) {Path(downlink).name}; {bin_ms} ms bins of 1500-byte opportunities"
    )
    text = schedule_text(up, down, bin_ms, duration_s, header)
    try:
        Path(out).write_text(text)
    except OSError as exc:
        raise SpecError(f"cannot write {out}: {exc.strerror}") from None
    steps = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    period = "repeating" if up[-1] == down[-1] and duration_s is None else "not repeating"
    return f"wrote {out}: {steps} lines, {period}"
