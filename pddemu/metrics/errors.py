"""The one exception of the metrics package, so a caller can tell bad run data from a bug."""

from __future__ import annotations


class MetricsError(ValueError):
    """Records, instance reports or parameters that cannot be summarised as they are.

    The message names the request (or instance, or parameter) and the problem: a summary built
    from inconsistent records would be a wrong number in a report, which is worse than no number.
    """
