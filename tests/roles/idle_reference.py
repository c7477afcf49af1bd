"""The single-process greedy reference (`pddemu.reference.reference_outputs`) computed beside an
emulation, in a process of its own at the idle CPU priority (SCHED_IDLE): it runs on CPU time
the emulation leaves unused and takes little from it (the scheduler weighs it 3 against a
normal process's 1,024; the emulation's clock dilates for what it takes), so the wait for a
run also pays for most of its reference (the end-to-end test's 36 requests: 34 s alone,
unlocked at load 3.4). Once
the run is over it goes on at the normal priority; the streams are the same whichever process
computes them (the model is exact, docs/model.md).

Run as `python -m tests.roles.idle_reference <job.json> <outputs.json>`: the job is the model's
config, the chunk size and each request's id, prompt and genuine output length."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_WAIT_S = 600.0  # wall seconds, at the normal priority, for a reference of a test's size


class IdleReference:
    """`with IdleReference(requests, model, workdir) as reference:` starts the reference at
    the idle priority; `reference.outputs()` (inside the block, after the run) raises it to the
    normal priority and returns what `reference_outputs` would. Leaving the block ends it."""

    def __init__(
        self, requests: Sequence[Any], model: dict[str, Any], workdir: Path, chunk_tokens: int = 512
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.job = workdir / "reference-job.json"
        self.result = workdir / "reference-outputs.json"
        job = {
            "model": model,
            "chunk_tokens": chunk_tokens,
            "requests": [
                {
                    "request_id": r.request_id,
                    "prompt_ids": [int(x) for x in r.prompt_ids],
                    "genuine_output_tokens": int(r.genuine_output_tokens),
                }
                for r in requests
            ],
        }
        self.job.write_text(json.dumps(job))
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> IdleReference:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.roles.idle_reference", str(self.job), str(self.result)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            # set in the child before it runs: it never computes at the normal priority, and a
            # refusal fails the start instead of leaving a child nobody ends
            preexec_fn=lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)),
        )
        return self

    def outputs(self) -> dict[str, list[int]]:
        assert self.process is not None, "outputs() is read inside the with block"
        try:
            os.sched_setscheduler(self.process.pid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:
            pass  # already done
        except PermissionError:
            pass  # a user without root may not raise it: it goes on at the idle priority
        _, errors = self.process.communicate(timeout=REFERENCE_WAIT_S)
        assert self.process.returncode == 0, f"the reference process failed: {errors[-3000:]}"
        return json.loads(self.result.read_text())

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


def main(job_path: str, result_path: str) -> None:
    from pddemu.model import ModelConfig
    from pddemu.reference import reference_outputs

    job = json.loads(Path(job_path).read_text())
    requests = [SimpleNamespace(**r) for r in job["requests"]]
    outputs = reference_outputs(requests, ModelConfig(**job["model"]), job["chunk_tokens"])
    Path(result_path).write_text(json.dumps(outputs))


if __name__ == "__main__":
    main(*sys.argv[1:])
