"""`python -m netem.nsexec NETNS -- COMMAND...`: exec a command inside a network namespace.

Used to run external measuring tools (ping, iperf3) in a run's namespaces without shelling
out to `ip netns exec`.
"""

from __future__ import annotations

import os
import sys

from netem import nsutil


def command_in(netns: str, argv: list[str]) -> list[str]:
    """The argv that runs `argv` inside `netns`."""
    return [sys.executable, "-m", "netem.nsexec", netns, "--", *argv]


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m netem.nsexec NETNS -- COMMAND...", file=sys.stderr)
        return 2
    nsutil.enter(argv[0])
    os.execvp(argv[2], argv[2:])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
