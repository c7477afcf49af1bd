"""Where the public traces live (they are read in place, never copied into the project).

`PDDEMU_PUBLIC_TRACES` names the folder; otherwise `shared/traces` beside the checkout, as in
the workspace this project is developed in. Callers that need a file skip or explain when it
is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[2]


def public_traces_dir() -> Path:
    configured = os.environ.get("PDDEMU_PUBLIC_TRACES")
    return Path(configured) if configured else _REPO.parent / "shared" / "traces"


WEKA_FILE = "weka_agentic_conversations.jsonl.gz"
MOONCAKE_FILE = "mooncake_synthetic_trace.jsonl"
