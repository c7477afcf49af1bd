"""Experiment files: every committed one loads, in both variants, into points whose configs
check; a file and the command line never both give an argument."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pddemu.cli import build_parser
from pddemu.config import ConfigError, load_config
from pddemu.roles.sizing import cost_model
from pddemu.sweep.cli import base_overrides, systems_of
from pddemu.sweep.experiment import apply_experiment, experiment_parts, value_text
from pddemu.sweep.grid import expand, parse_grid
from pddemu.sweep.report import check_claims

EXPERIMENTS = sorted((Path(__file__).resolve().parents[2] / "experiments").glob("*.toml"))
DOCS = Path(__file__).resolve().parents[2] / "docs"


def sweep_args(*argv: str, part: str | None = None):
    args = build_parser().parse_args(["sweep", "--out", "unused", *argv])
    if args.experiment is not None:
        apply_experiment(args, args.sweep_parser.get_default, args.experiment, part)
    return args


def test_there_are_experiments() -> None:
    assert EXPERIMENTS


# Every experiment the issue names, by that name.
PAPER_EXPERIMENTS = {
    "rld-share",
    "regime",
    "ttft-reduction",
    "bcr",
    "bathtub",
    "handoff",
    "wan-whatif",
    "kv-transfer",
}


def test_every_paper_experiment_has_a_file() -> None:
    assert PAPER_EXPERIMENTS <= {path.stem for path in EXPERIMENTS}


ROLES = {"pdd": ("P", "RLD", "MD"), "naive": ("P", "MD"), "indc": ("P", "D")}


def part_points(path: Path, quick: bool, part: str | None) -> tuple[list, argparse.Namespace]:
    """One part's points, and its sweep's arguments."""
    args = sweep_args("--experiment", str(path), *(["--quick"] if quick else []), part=part)
    points = expand(
        args.config, base_overrides(args), parse_grid(args.grid), args.seeds,
        systems_of(args.system),
    )  # fmt: skip
    return points, args


def quick_points(path: Path) -> int:
    """The points an experiment's quick variant runs: a search's at most `max_probes` rates
    for each system and seed."""
    total = 0
    for part in experiment_parts(path):
        points, args = part_points(path, True, part)
        total += len(points) * (args.max_probes if args.search else 1)
    return total


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
@pytest.mark.parametrize("quick", [False, True])
def test_each_experiment_loads_and_expands(path: Path, quick: bool) -> None:
    """Every part's points check against the config (an unknown key or bad value is refused)
    and their instances can start (a cost model refuses chips too few for the weights); both
    variants keep the three seeds the report's spread needs (the issue's minimum)."""
    for part in experiment_parts(path):
        points, args = part_points(path, quick, part)
        assert points and all(p.source.startswith("configs/") for p in points)
        for point in points:  # every instance's chips hold the target's weights and some KV
            config = load_config(point.config_path, list(point.overrides))
            for role in ROLES[point.system]:
                assert cost_model(config, point.system, role).kv_capacity_tokens() > 0
        assert args.seeds >= 3, "the report gives the spread over at least 3 seeds"


QUICK_TABLE_ROW = re.compile(r"^\| ([a-z-]+) \| (\d+) \(", re.MULTILINE)


def test_the_quick_variants_are_the_ones_docs_sweep_costs() -> None:
    """docs/sweep.md's "Quick variants" estimates the quick set's wall time from each
    experiment's points: a quick variant made larger or smaller must be costed there again."""
    section = (DOCS / "sweep.md").read_text().split("### Quick variants", 1)[1].split("\n#", 1)[0]
    costed = {name: int(points) for name, points in QUICK_TABLE_ROW.findall(section)}
    assert costed == {path.stem: quick_points(path) for path in EXPERIMENTS}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.stem)
def test_each_experiments_claims_check(path: Path) -> None:
    claims = check_claims(path)
    parts = experiment_parts(path)
    for claim in claims:
        assert claim.get("part") in parts
        assert claim.get("versus_part", claim.get("part")) in parts


def test_parts_add_to_the_experiment_and_have_quick_variants(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(
        '[experiment]\nsystems = ["pdd"]\nseeds = 3\nrequests = 50\n'
        '[part.rate]\ngrid = { "wan.rate" = ["1gbit", "10gbit"] }\n'
        'quick = { grid = { "wan.rate" = ["1gbit"] } }\n'
        '[part.delay]\ngrid = { "wan.delay" = ["5ms"] }\n'
        "[quick]\nrequests = 4\n"
    )
    assert experiment_parts(path) == ["rate", "delay"]
    rate = sweep_args("--experiment", str(path), part="rate")
    assert (rate.seeds, rate.requests, rate.grid) == (3, 50, ["wan.rate=1gbit,10gbit"])
    quick = sweep_args("--experiment", str(path), "--quick", part="rate")
    assert (quick.requests, quick.grid) == (4, ["wan.rate=1gbit"])
    delay = sweep_args("--experiment", str(path), "--quick", part="delay")
    assert (delay.requests, delay.grid) == (4, ["wan.delay=5ms"])
    with pytest.raises(ConfigError, match="no part"):
        sweep_args("--experiment", str(path))


def test_the_quick_table_overrides_the_full_one(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text(
        '[experiment]\nsystems = "all"\nseeds = 3\nrequests = 50\n'
        'grid = { "wan.delay" = ["5ms", "50ms"], "policy.drc" = [true, false] }\n'
        '[quick]\nseeds = 1\ngrid = { "wan.delay" = ["5ms"] }\n'
    )
    full = sweep_args("--experiment", str(path))
    assert (full.seeds, full.requests, full.system) == (3, 50, "all")
    assert full.grid == ["wan.delay=5ms,50ms", "policy.drc=true,false"]
    quick = sweep_args("--experiment", str(path), "--quick")
    assert (quick.seeds, quick.requests, quick.grid) == (1, 50, ["wan.delay=5ms"])


def test_grid_values_become_toml_text() -> None:
    assert [value_text(v) for v in ["10gbit", "a b", 0.5, 3, True]] == [
        "10gbit",
        '"a b"',
        "0.5",
        "3",
        "true",
    ]


@pytest.mark.parametrize(
    ("text", "argv", "message"),
    [
        ("[experiment]\nseeds = 2\n", ["--seeds", "3"], "--seeds is given by"),
        ("[experiment]\nbogus = 1\n", [], "unknown key"),
        ("[experiment]\nseeds = '2'\n", [], "must be an integer"),
        ("[other]\n", [], r"needs an \[experiment\] table"),
        ("[experiment]\n[part.a]\nbogus = 1\n", [], r"\[part.a\] bogus: unknown key"),
        ("[experiment]\ngrid = { 'wan.rate' = [] }\n", [], "non-empty list"),
    ],
)
def test_bad_experiments_are_refused(
    tmp_path: Path, text: str, argv: list[str], message: str
) -> None:
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        sweep_args("--experiment", str(path), *argv)
