"""The invariance comparison: differences seed by seed, their mean against the bound, and the
seed-to-seed spread of the reference beside them."""

from __future__ import annotations

import pytest

from pddemu.validate.analytic import Outcome, Probe, summarise
from pddemu.validate.cli import markdown
from pddemu.validate.closed_form import Request
from pddemu.validate.invariance import METRICS, compare


def metrics(scale: float) -> dict[str, float]:
    return {name: scale * (i + 1) for i, name in enumerate(METRICS)}


def test_a_variant_within_the_bound_on_average_passes() -> None:
    measured = {
        "time_scale 1": {0: metrics(1.0), 1: metrics(2.0), 2: metrics(1.5)},
        "auto": {0: metrics(1.02), 1: metrics(2.0 * 0.98), 2: metrics(1.5 * 1.04)},
    }
    result = compare(measured, "time_scale 1", 0.03)
    row = result["variants"]["auto"]["ttft_p50_s"]
    assert row["by_seed"] == pytest.approx([0.02, -0.02, 0.04])
    assert row["mean"] == pytest.approx(0.04 / 3) and row["max_abs"] == pytest.approx(0.04)
    assert row["largest"] == pytest.approx(0.04)
    assert row["within"] and result["passed"]
    assert result["seed_spread"]["ttft_p50_s"] == pytest.approx((2.0 - 1.0) / 1.5)


def test_a_variant_off_by_more_fails_and_a_missing_metric_is_not_within() -> None:
    measured = {
        "token_scale 32": {0: metrics(1.0), 1: metrics(1.0)},
        "token_scale 64": {0: metrics(1.05), 1: {**metrics(1.05), "tpot_p50_s": None}},
    }
    result = compare(measured, "token_scale 32", 0.03)
    assert not result["passed"]
    assert not result["variants"]["token_scale 64"]["ttft_p99_s"]["within"]
    assert result["variants"]["token_scale 64"]["tpot_p50_s"]["by_seed"] == [pytest.approx(0.05)]


def test_the_report_has_a_line_per_check() -> None:
    measured = {"time_scale 1": {0: metrics(1.0)}, "auto": {0: metrics(1.01)}}
    block = {**compare(measured, "time_scale 1", 0.03), "measured": measured}
    result = {
        "analytic": {
            "tolerance": 0.02,
            "pipelines": {
                "naive P-MD": {
                    "ttft_s": {"max_abs_error": 0.01, "largest_error": 0.01, "within": True},
                    "tpot_s": {"max_abs_error": 0.03, "largest_error": 0.03, "within": False},
                }
            },
        },
        "invariance": {"time": block, "tokens": block},
    }
    text = markdown(result)
    assert "| naive P-MD | +1.0% ok | - | +3.0% OVER |" in text
    assert "| auto | +1.0% (max +1.0%)" in text
    assert text.count("seed-to-seed spread") == 2


def _outcome(pipeline: str, **errors: float) -> Outcome:
    request = Request("naive", pipeline, 8192, 7373, 65)
    return Outcome(Probe("r0", 0.0, 8192, 65, None, [1], request), {}, errors, 0.001, 1.0)


def test_the_report_gives_each_largest_error_with_its_sign() -> None:
    """A KV transfer 0.6 % under the closed form reads -0.6 %, not +0.6 %; so does a variant
    whose largest difference over the seeds is below its reference."""
    outcomes = [
        _outcome("P-MD", kv_transfer_s=-0.006, ttft_s=0.001),
        _outcome("P-MD", kv_transfer_s=0.002, ttft_s=0.0019),
    ]
    analytic = summarise(outcomes, 0.02)
    cells = analytic["pipelines"]["naive P-MD"]
    assert cells["kv_transfer_s"]["max_abs_error"] == pytest.approx(0.006)
    assert cells["kv_transfer_s"]["largest_error"] == pytest.approx(-0.006)
    measured = {"time_scale 1": {0: metrics(1.0), 1: metrics(1.0)},
                "auto": {0: metrics(0.98), 1: metrics(1.01)}}  # fmt: skip
    block = {**compare(measured, "time_scale 1", 0.03), "measured": measured}
    text = markdown({"analytic": analytic, "invariance": {"time": block, "tokens": block}})
    assert "| naive P-MD | +0.2% ok | -0.6% ok | - | +1.0 / +1.0 ms |" in text
    assert "| auto | -0.5% (max -2.0%)" in text
