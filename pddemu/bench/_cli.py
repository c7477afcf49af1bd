"""`pddemu bench`: the benchmarks that reproduce a published experiment, one sub-command each
(`make bench` runs every benchmark module with its defaults)."""

from __future__ import annotations

import argparse

from pddemu.bench import handoff


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="benchmarks that reproduce PDD's experiments")
    benchmarks = parser.add_subparsers(dest="benchmark", required=True)
    handoff.add_parser(benchmarks)
