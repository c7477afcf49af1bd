"""Where the public traces live (they are read in place, never copied into the project).

`PDDEMU_PUBLIC_TRACES` names the folder; otherwise `shared/traces` beside the checkout, or the
development workspace's `/work/shared/traces` (for a checkout made elsewhere). Callers that need
a file skip or explain when it is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


_WORKSPACE = Path("/work/shared/traces")


def public_traces_dir() -> Path:
    configured = os.environ.get("PDDEMU_PUBLIC_TRACES")
    if configured:
        return Path(configured)
    beside = _REPO.parent / "shared" / "traces"
    return beside if beside.is_dir() or not _WORKSPACE.is_dir() else _WORKSPACE


WEKA_FILE = "weka_agentic_conversations.jsonl.gz"
MOONCAKE_FILE = "mooncake_synthetic_trace.jsonl"
