"""Model tests run with one torch thread: the machine's cores are shared with other work, and
two spinning OpenMP threads on a busy machine make every small product wait. Exactness does
not depend on it: test_model_exact.py and the kernel matrix compute with two threads too."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
