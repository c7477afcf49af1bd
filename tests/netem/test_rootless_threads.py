"""A user namespace needs a single-threaded process: entering one later is refused by name."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import threading
from netem import rootless
ready = threading.Event()
threading.Thread(target=lambda: (ready.set(), threading.Event().wait()), daemon=True).start()
ready.wait()
try:
    rootless.ensure_network_privileges(force=True)
except rootless.RootlessError as error:
    print(error)
"""


def test_entering_with_a_second_thread_is_refused_with_the_count() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "before any thread starts (2 are running)" in done.stdout
