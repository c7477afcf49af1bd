"""`make bench`'s read-path benchmark: a message's path into the frontend against a bare hop."""

from __future__ import annotations

from pddemu.bench import read_path


def test_every_message_reaches_the_frontends_handler_dated_and_is_measured_against_a_bare_hop() -> (
    None
):
    result = read_path.run(quick=True)
    assert result["targets"] == {"every_message_dated": True, "every_message_handled": True}
    assert result["dates_past_history"] == 0 and result["handler_errors"] == []
    bare = result["bare_hop"]["p50_us"]
    for kind in ("tokens", "heartbeat"):
        figures = result[kind]
        assert 0 < figures["p50_us"] <= figures["p90_us"]
        assert figures["bare_hops"] == round(figures["p50_us"] / bare, 2)
        assert figures["cpu_mean_us"] > 0
