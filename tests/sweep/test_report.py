"""`pddemu sweep report` on sweep outputs written here (no emulation): every kind of claim gives
the figure and the seeds' spread it should, a missing run says so, and only the section
between the markers of the page is replaced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pddemu.config import ConfigError
from pddemu.sweep.report import BEGIN, END, check_claims, local_minima, render, write_report

EXPERIMENT = """
[experiment]
description = "a test experiment"
systems = ["pdd", "naive"]
seeds = 3
[part.load]
grid = { "workload.arrival_rate" = [1.0, 2.0] }
[part.base]
systems = ["naive"]

[[claim]]
claim = "share"
paper = "6.2 %"
kind = "value"
part = "load"
system = "pdd"
metric = "rld_token_share"
where = { "workload.arrival_rate" = 1.0 }
format = "percent"
explain = "why share"

[[claim]]
claim = "reduction"
paper = "-51.5 %"
kind = "change"
part = "load"
versus_part = "base"
system = "pdd"
versus = "naive"
metric = ["ttft_s.mean", "ttft_s.p99"]
where = { "workload.arrival_rate" = 1.0 }
versus_where = {}
explain = "why reduction"

[[claim]]
claim = "regime"
paper = "4.2 s"
kind = "at-nearest"
part = "load"
system = "pdd"
metric = "ttft_s.p99"
key = "workload.arrival_rate"
find_system = "naive"
find_metric = "ttft_s.mean"
target = 4.2
format = "seconds"
explain = "why regime"

[[claim]]
claim = "curve"
paper = "dips"
kind = "curve"
part = "load"
system = "pdd"
metric = "ttft_s.mean"
key = "workload.arrival_rate"
dips = "high"
format = "seconds"
explain = "why curve"
"""


def entry(system: str, seed: int, settings: dict[str, str], **summary: Any) -> dict[str, Any]:
    return {
        "settings": settings,
        "values": {k: float(v) for k, v in settings.items()},
        "seed": seed,
        "system": system,
        "point": {"id": f"{system}-{seed}", "status": "done", "wall_s": 30.0},
        **summary,
    }


def write_sweep(
    directory: Path, entries: list[dict[str, Any]], quick: bool = True, warmup: int | None = None
) -> None:
    directory.mkdir(parents=True)
    meta = {"quick": quick, "code": {"commit": "0123456789abcdef", "dirty": False}}
    if warmup is not None:  # results from before warm-ups do not say
        meta["warmup_requests"] = warmup
    (directory / "sweep.json").write_text(json.dumps({"sweep": meta, "points": entries}))


@pytest.fixture
def experiment(tmp_path: Path) -> Path:
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "demo.toml").write_text(EXPERIMENT)
    return experiments


def test_every_kind_of_claim_reads_its_figure_and_spread(experiment: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    load = []
    for seed in (0, 1, 2):
        for rate in ("1.0", "2.0"):
            fast = rate == "1.0"
            load.append(
                entry(
                    "pdd",
                    seed,
                    {"workload.arrival_rate": rate},
                    rld_token_share=0.05 + 0.01 * seed,
                    ttft_s={"mean": 1.0 if fast else 3.0, "p99": 2.0 + seed},
                )
            )
            load.append(
                entry(
                    "naive",
                    seed,
                    {"workload.arrival_rate": rate},
                    ttft_s={"mean": 2.0 if fast else 4.0, "p99": 8.0},
                )
            )
    load[1]["point"]["exit_status"] = 4  # one point not valid (the emulator's lag)
    # one not valid whose exit said partial results (5 outranks 4): its summary says not valid
    load[5]["point"]["exit_status"], load[5]["valid"] = 5, False
    load[2]["requests"] = {"total": 10, "failed": 4}  # a point with failed requests
    load[3]["requests"] = {"total": 10, "failed": 0}
    write_sweep(results / "demo" / "load", load)
    base = [entry("naive", s, {}, ttft_s={"mean": 2.0 * (s + 1), "p99": 10.0}) for s in (0, 1, 2)]
    write_sweep(results / "demo" / "base", base, warmup=5)

    text = render(experiment, [results])

    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "|" in line}
    # value: mean of 5, 6, 7 % with the lowest and highest seed
    assert "6.0 % (5.0 % to 7.0 %, 3 seeds)" in rows["share"]
    # change, per seed against the other part: 1/2, 1/4, 1/6 - 1
    mean = ((0.5 - 1) + (0.25 - 1) + (1 / 6 - 1)) / 3
    assert f"{100 * mean:+.1f} % (-83.3 % to -50.0 %, 3 seeds)" in rows["reduction — `ttft_s.mean`"]
    assert "-70.0 % (-80.0 % to -60.0 %, 3 seeds)" in rows["reduction — `ttft_s.p99`"]
    assert "as above" in rows["reduction — `ttft_s.p99`"]
    # at-nearest: naive's mean TTFT is 4.0 at 2 req/s, nearest 4.2; pdd's p99 there is 2, 3, 4
    assert "at workload.arrival_rate=2.0" in rows["regime"]
    assert "3.00 s (2.00 s to 4.00 s, 3 seeds)" in rows["regime"]
    # curve: two rates have no inner point, so no dip or peak is claimed either way (the
    # grid, not the curve, ends there; test_local_minima has inner ones)
    assert "2 value(s) of workload.arrival_rate: too few for a dip" in rows["curve"]
    assert "| 1.0 | 1.00 s (1.00 s to 1.00 s, 3 seeds) |" in text
    assert "code at 0123456789" in text and "quick variant" in text
    assert "6.0 min of emulation" in text  # 12 points of 30 s in part load
    assert "30 s a point); 2 of the points not valid" in text
    assert "; 4 of the points' 20 measured requests failed, in 1 point (" in text
    load_line, base_line = (line for line in text.splitlines() if line.startswith("- part "))
    assert "no warm-up (every point from empty caches)" in load_line
    assert "5 warm-up requests a point first, not counted" in base_line
    assert "requests failed" not in base_line  # no point of it recorded a failure


def test_a_missing_run_is_reported_as_not_run(experiment: Path, tmp_path: Path) -> None:
    text = render(experiment, [tmp_path / "nothing"])
    assert "**Not run**" in text
    claim_rows = [line for line in text.splitlines() if line.startswith("| share")]
    assert claim_rows and "| not run | nothing measured to compare |" in claim_rows[0]


def test_only_the_section_between_the_markers_is_replaced(experiment: Path, tmp_path: Path) -> None:
    page = tmp_path / "validation.md"
    page.write_text("# Validation\n\nhand-written text\n")
    write_report(experiment, [tmp_path / "nothing"], page)
    first = page.read_text()
    assert first.startswith("# Validation\n\nhand-written text\n") and BEGIN in first
    page.write_text(first.replace(END, END + "\n\nmore hand-written text"))
    write_report(experiment, [tmp_path / "nothing"], page)
    second = page.read_text()
    assert second.count(BEGIN) == 1 and second.count(END) == 1
    assert "more hand-written text" in second and "hand-written text\n" in second


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        ('claim = "a"\npaper = "b"\nkind = "value"\nexplain = "c"\n', "needs system, metric"),
        ('claim = "a"\npaper = "b"\nkind = "guess"\nexplain = "c"\n', "kind must be"),
        ('claim = "a"\nkind = "value"\nsystem = "pdd"\nmetric = "x"\n', "needs paper"),
        (
            'claim = "a"\npaper = "b"\nkind = "value"\nsystem = "pdd"\nmetric = "x"\n'
            'explain = "c"\nbogus = 1\n',
            "unknown key bogus",
        ),
    ],
)
def test_bad_claims_are_refused(tmp_path: Path, claim: str, message: str) -> None:
    path = tmp_path / "e.toml"
    path.write_text(f"[experiment]\nseeds = 3\n[[claim]]\n{claim}")
    with pytest.raises(ConfigError, match=message):
        check_claims(path)


def test_local_minima() -> None:
    curve = [("0", 3.0), ("1", 1.0), ("2", 2.0), ("3", 0.5), ("4", 0.7)]
    assert local_minima(curve) == ["1", "3"]
    assert local_minima([("0", 1.0)]) == []
    # the ends of a short grid are not dips, nor is a difference of noise
    assert local_minima([("0.6", 1.0), ("0.65", 2.0), ("0.7", 1.5)]) == []
    assert local_minima([("0", 0.003450), ("1", 0.003447), ("2", 0.003451)]) == []
    assert local_minima([("0", 1.02), ("1", 0.852), ("2", 0.965)]) == ["1"]


def bcr_search_experiment(tmp_path: Path) -> Path:
    """An experiments folder with one goodput search whose claim is pdd's BCR against in-DC's
    (`b.toml`)."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "b.toml").write_text(
        '[experiment]\nsystems = ["pdd", "indc"]\nseeds = 1\nsearch = "goodput"\n'
        '[[claim]]\nclaim = "bcr"\npaper = "+37.5 %"\nkind = "search-change"\n'
        'system = "pdd"\nversus = "indc"\nmetric = "bcr"\nexplain = "why"\n'
    )
    return experiments


def test_a_search_stopped_short_says_whether_it_bracketed_its_maximum(tmp_path: Path) -> None:
    experiments = bcr_search_experiment(tmp_path)
    run = tmp_path / "results" / "b"
    rate = {"workload.arrival_rate": "2"}
    write_sweep(run, [entry("pdd", 0, rate, bcr=3.0), entry("indc", 0, rate, bcr=4.0)])
    results = [
        {"system": "pdd", "arrival_rate": 2.0, "status": "probe-limit"},
        {"system": "indc", "arrival_rate": 2.0, "status": "found"},
    ]
    (run / "search.json").write_text(json.dumps({"results": results}))
    text = render(experiments, [tmp_path / "results"])
    assert "-25.0 %" in text
    assert "(max goodput at 2 vs 2 req/s; pdd: probe-limit, not bracketed)" in text
    results[1] = {"system": "indc", "arrival_rate": 2.0, "status": "probe-limit", "bracket": [2, 6]}
    (run / "search.json").write_text(json.dumps({"results": results}))
    text = render(experiments, [tmp_path / "results"])
    assert "indc: probe-limit, maximum in [2, 6) req/s)" in text


def test_a_bracket_resting_on_points_not_valid_is_said(tmp_path: Path) -> None:
    """A search's answer is only as good as its probes: a bracket end whose points were judged
    not valid is named in the row, read from the points' own summaries."""
    experiments = bcr_search_experiment(tmp_path)
    run = tmp_path / "results" / "b"
    at = {"workload.arrival_rate": "2"}
    above = {"workload.arrival_rate": "3"}
    pdd_at, pdd_above = entry("pdd", 0, at, bcr=3.0), entry("pdd", 0, above, bcr=1.0)
    pdd_above["point"]["id"], pdd_above["valid"] = "pdd-above", False
    write_sweep(run, [pdd_at, pdd_above, entry("indc", 0, at, bcr=4.0, valid=True)])
    probes = [
        {"arrival_rate": 2.0, "points": ["pdd-0"]},
        {"arrival_rate": 3.0, "points": ["pdd-above"]},
    ]
    results = [
        {"system": "pdd", "arrival_rate": 2.0, "status": "found", "bracket": [2, 3],
         "probes": probes},
        {"system": "indc", "arrival_rate": 2.0, "status": "found", "bracket": [2, 3],
         "probes": [{"arrival_rate": 2.0, "points": ["indc-0"]}]},
    ]  # fmt: skip
    (run / "search.json").write_text(json.dumps({"results": results}))
    text = render(experiments, [tmp_path / "results"])
    said = "(max goodput at 2 vs 2 req/s; pdd: bracket 1 of 1 points at its failing 3 not valid)"
    assert said in text
    pdd_at["valid"] = False
    again = tmp_path / "again" / "b"
    write_sweep(again, [pdd_at, pdd_above, entry("indc", 0, at, bcr=4.0)])
    (again / "search.json").write_text(json.dumps({"results": results}))
    text = render(experiments, [tmp_path / "again"])
    assert (
        "pdd: bracket 1 of 1 points at its passing 2 not valid and 1 of 1 points at its "
        "failing 3 not valid)" in text
    )


def test_transfer_rows_set_each_value_beside_its_closed_form(tmp_path: Path) -> None:
    """Against a baseline (the WAN's share of TTFT, round trip) and alone (a transfer time,
    one way or the bytes' serialisation alone), per value of the key, at that value's delay."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    claim = '[[claim]]\nclaim = "{0}"\npaper = "-"\nkind = "transfer"\nsystem = "naive"\n'
    claim += 'key = "wan.delay"\nexplain = "why"\n'
    (experiments / "kv.toml").write_text(
        '[experiment]\nsystems = ["naive", "indc"]\nseeds = 2\n'
        + claim.format("wan share")
        + 'versus = "indc"\nmetric = "ttft_s.mean"\n'
        + claim.format("to ready")
        + 'metric = "kv_transfer_s.to_ready.mean"\nclosed_form = "one-way"\n'
        + claim.format("serialisation")
        + 'metric = "kv_transfer_s.first_to_last_chunk.mean"\nclosed_form = "rate"\n'
    )
    points = []
    for seed in (0, 1):
        for delay in ("0.02", "0.05"):
            # 1000 tokens x 1000 bytes x 8 / 8e6 bit/s = 1 s on the wire
            settings = {"workload.synthetic_input_tokens": "1000", "wan.rate": "8e6"}
            settings["wan.delay"] = delay
            scale = {"target_kv_bytes_per_token": 1000.0}
            kv = {"to_ready": {"mean": 1.5 + seed}, "first_to_last_chunk": {"mean": 0.9}}
            points.append(
                entry("naive", seed, settings, ttft_s={"mean": 2.0}, kv_transfer_s=kv, scale=scale)
            )
            points.append(entry("indc", seed, settings, ttft_s={"mean": 0.5 + seed}, scale=scale))
    write_sweep(tmp_path / "results" / "kv", points)
    text = render(experiments, [tmp_path / "results"])
    assert "| wan.delay | naive − indc ttft_s.mean (mean; range) | closed form |" in text
    assert "| 0.05 | 1.00 s (500 ms to 1.50 s, 2 seeds) | 1.10 s |" in text  # 1 s + 2 x 50 ms
    assert "| 0.02 | 2.00 s (1.50 s to 2.50 s, 2 seeds) | 1.02 s |" in text  # 1 s + 20 ms
    assert "| 0.05 | 900 ms (900 ms to 900 ms, 2 seeds) | 1.00 s |" in text  # no delay
    assert text.count("2 value(s) of wan.delay, below") == 3
    (experiments / "kv.toml").write_text(
        "[experiment]\nseeds = 1\n" + claim.format("x") + 'metric = "m"\nclosed_form = "two"\n'
    )
    with pytest.raises(ConfigError, match="closed_form must be one of"):
        check_claims(experiments / "kv.toml")


def test_a_key_whose_values_are_quoted_reads_each_value(tmp_path: Path) -> None:
    """`--grid wan.loss="0%","0.1%"`: the settings write the values quoted, as the rows do."""
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "loss.toml").write_text(
        '[experiment]\nsystems = ["naive"]\nseeds = 1\n[[claim]]\nclaim = "loss"\npaper = "-"\n'
        'kind = "transfer"\nsystem = "naive"\nkey = "wan.loss"\nexplain = "why"\n'
        'metric = "kv_transfer_s.to_ready.mean"\nclosed_form = "rate"\n'
    )
    points = []
    for loss, seconds in (('"0%"', 1.25), ('"0.1%"', 1.5)):
        point = entry("naive", 0, {"workload.synthetic_input_tokens": "1000", "wan.rate": "8e6"})
        point["settings"]["wan.loss"] = loss
        point["values"].update({"wan.delay": 0.0, "wan.loss": loss.strip('"')})
        point.update(kv_transfer_s={"to_ready": {"mean": seconds}})
        point.update(scale={"target_kv_bytes_per_token": 1000.0})
        points.append(point)
    write_sweep(tmp_path / "results" / "loss", points)
    text = render(experiments, [tmp_path / "results"])
    assert '| "0%" | 1.25 s (1 seed) | 1.00 s |' in text
    assert '| "0.1%" | 1.50 s (1 seed) | 1.00 s |' in text


def test_the_full_variant_stands_beside_the_quick_one(experiment: Path, tmp_path: Path) -> None:
    """Quick results in one directory, full ones in another: each claim's row gives both, the
    full one first; a part run in one variant only reads "not run" in the other's column."""
    quick, full = tmp_path / "quick", tmp_path / "full"
    rate = {"workload.arrival_rate": "1.0"}
    for root, share, is_quick in ((quick, 0.3, True), (full, 0.06, False)):
        load = [entry("pdd", s, rate, rld_token_share=share + 0.01 * s) for s in (0, 1, 2)]
        write_sweep(root / "demo" / "load", load, quick=is_quick, warmup=100)
    base = [entry("naive", s, {}, ttft_s={"mean": 2.0, "p99": 4.0}) for s in (0, 1, 2)]
    write_sweep(quick / "demo" / "base", base)

    text = render(experiment, [quick, full])

    assert (
        "| claim | paper | full (mean; lowest to highest over seeds) | quick (mean; lowest "
        "to highest over seeds) | why they differ |"
    ) in text
    share = next(line for line in text.splitlines() if line.startswith("| share |"))
    assert "| 7.0 % (6.0 % to 8.0 %, 3 seeds) | 31.0 % (30.0 % to 32.0 %, 3 seeds) |" in share
    reduction = next(line for line in text.splitlines() if line.startswith("| reduction"))
    assert reduction.split(" | ")[2] == "not run"  # full: part base not run
    assert "- full variant, parts not run: base" in text
    how = [line for line in text.splitlines() if line.startswith("- part load")]
    assert len(how) == 2 and "(full)" in how[0] and "(quick variant)" in how[1]
    # the same variant of one part in two directories is refused
    write_sweep(tmp_path / "again" / "demo" / "load", [], quick=False)
    with pytest.raises(ConfigError, match="both hold the full variant's results of demo part load"):
        render(experiment, [quick, full, tmp_path / "again"])
