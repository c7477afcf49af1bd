"""The model's paths and committed digests under a matrix of CPU kernels and thread counts.

Each cell runs `python -m tests.model.paths_digest` (every path of the model on a small
workload, checked bit for bit, then digested) in its own process, with torch's vectorised
kernels capped by ATEN_CPU_CAPABILITY, oneDNN's by ONEDNN_MAX_CPU_ISA, MKL's by
MKL_ENABLE_INSTRUCTIONS, and 1 or 2 intra-op threads; the AVX-512 cells run only where the
CPU has AVX-512. All cells run at once and must all report the committed digests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.model.paths_digest import EXPECTED

ROOT = Path(__file__).resolve().parents[2]

# (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS, capability torch reports)
ISAS = [
    ("default", "SSE41", "SSE4_2", "DEFAULT"),
    ("avx2", "AVX2", "AVX2", "AVX2"),
    ("avx512", "AVX512_CORE_AMX", "AVX512", "AVX512"),
]
KNOBS = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
)


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def cells() -> list[tuple[tuple[str, str, str, str], int]]:
    flags = cpu_flags()
    isas = [isa for isa in ISAS if isa[0] != "avx512" or "avx512f" in flags]
    if "avx2" not in flags:
        isas = isas[:1]
    return [(isa, threads) for isa in isas for threads in (1, 2)]


def test_every_cell_of_the_kernel_matrix_gives_the_committed_digest() -> None:
    running = []
    for (aten, onednn, mkl, reported), threads in cells():
        env = {k: v for k, v in os.environ.items() if k not in KNOBS}
        env.update(
            ATEN_CPU_CAPABILITY=aten,
            ONEDNN_MAX_CPU_ISA=onednn,
            MKL_ENABLE_INSTRUCTIONS=mkl,
            OMP_NUM_THREADS=str(threads),
            OMP_WAIT_POLICY="PASSIVE",  # cells share the cores: idle threads sleep, not spin
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.model.paths_digest"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running.append((f"{aten}/{threads} threads", reported, threads, process))
    for name, reported, threads, process in running:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, f"{name}: {err.strip()[-2000:]}"
        result = json.loads(out)
        assert (result["capability"], result["threads"]) == (reported, threads), name
        assert result["float32"] == EXPECTED, name
        assert result["float64"] == EXPECTED, name
