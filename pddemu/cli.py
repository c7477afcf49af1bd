"""`pddemu` command line: one sub-command group per area, each registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

# (sub-command, module providing `add_parser(subparsers)`); imported lazily so that
# `pddemu trace stats` does not pay for torch.
_COMMANDS: list[tuple[str, str]] = [
    ("trace", "pddemu.workload.cli"),
    ("emulate", "pddemu.emulate"),
    ("serve", "pddemu.serve"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pddemu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for _name, module in _COMMANDS:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
