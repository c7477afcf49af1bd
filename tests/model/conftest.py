"""Model tests run with one torch thread: the machine's cores are shared with other work, and
two spinning OpenMP threads on a busy machine make every small product wait. Exactness does
not depend on it: test_model_exact.py and the kernel matrix compute with two threads too.

The tests that do use two threads let an idle OpenMP thread sleep instead of spinning
(`OMP_WAIT_POLICY=PASSIVE`, read when torch loads its OpenMP runtime, so only if nothing
imported torch before): a spinning thread on a busy two-core machine makes every product of
the other thread wait for a time slice (measured: 2.2 s instead of 0.06 s for the two-thread
test at load 8). The policy changes when a thread sleeps, never what it computes."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

torch.set_num_threads(1)
