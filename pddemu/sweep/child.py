"""`python -m pddemu.sweep.child emulate ...`: a point's `pddemu emulate`, bound to the process
that started it.

It gets SIGTERM (which `pddemu emulate` turns into its orderly cleanup) when the sweep or the
Ray worker that started it dies, even by SIGKILL, so no emulation outlives its sweep.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    parent = os.getppid()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 130
    from pddemu.cli import main as pddemu_main

    return pddemu_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
