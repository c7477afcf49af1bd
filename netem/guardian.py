"""Cleans a run up when its controller dies without doing so (SIGKILL, crash).

Started detached by the controller with the read end of a pipe as stdin. The controller writes
"done" when it has cleaned up itself; end-of-file without it means the controller is gone, and
the guardian removes the run from its record (namespaces, processes in them, host link, slot),
provided the record is still the dead controller's.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from netem.registry import Registry


def main(argv: list[str]) -> int:
    name, root, pid, start = argv[0], Path(argv[1]), int(argv[2]), int(argv[3])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for the controller is not for us
    said = sys.stdin.buffer.read()
    if b"done" in said:
        return 0
    # Only the run this controller owned: the name may already belong to a new run.
    Registry(root).cleanup(name, owner=(pid, start))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
