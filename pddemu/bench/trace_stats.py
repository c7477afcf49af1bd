"""`pddemu trace stats` on the full WEKA agentic trace: wall time, peak memory, cache share.

Two measurements:
- the command itself, `pddemu trace stats WEKA --json` (the CLI's `main`) in a child process,
  with an infinite cache and with `--cache-tokens 10000000`: wall time (interpreter start
  included) and the child's own peak RSS (VmHWM); targets: under 60 s and under 4 GiB each;
- in this process, one pass of the reader feeding both prefix-hit counters, timing the radix
  cache's part (`match` + `insert`) apart from reading and parsing, to show where time goes.

`quick` runs the same on the Mooncake synthetic trace (4K requests) instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pddemu.workload import read_trace
from pddemu.workload.public_traces import MOONCAKE_FILE, WEKA_FILE, public_traces_dir
from pddemu.workload.stats import PrefixHitCounter

TRACES = public_traces_dir()
WEKA = TRACES / WEKA_FILE
MOONCAKE = TRACES / MOONCAKE_FILE
CACHE_TOKENS = 10_000_000
TARGET_SECONDS = 60.0
TARGET_RSS_BYTES = 4 * 2**30


# The child reads its own high-water mark: wait4's ru_maxrss would also count the pages it
# shared with this (large) process between fork and exec.
_CLI_WITH_PEAK = """
import sys
from pddemu.cli import main
status = main(sys.argv[2:])
with open("/proc/self/status") as proc_status:
    peak_kib = next(line.split()[1] for line in proc_status if line.startswith("VmHWM:"))
with open(sys.argv[1], "w") as report:
    report.write(peak_kib)
sys.exit(status)
"""


def _run_cli(path: Path, cache_tokens: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wall time, the child's own peak RSS (VmHWM) and its output."""
    arguments = ["trace", "stats", str(path), "--json"]
    if cache_tokens is not None:
        arguments += ["--cache-tokens", str(cache_tokens)]
    with tempfile.TemporaryDirectory() as scratch:
        peak_file = Path(scratch) / "peak_kib"
        command = [sys.executable, "-c", _CLI_WITH_PEAK, str(peak_file), *arguments]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, check=False)
        wall_s = time.perf_counter() - started
        if done.returncode != 0:
            message = done.stderr.decode(errors="replace")
            raise RuntimeError(f"pddemu {' '.join(arguments)} failed: {message}")
        peak_kib = int(peak_file.read_text())
    measured = {"wall_s": round(wall_s, 2), "peak_rss_mib": round(peak_kib / 1024, 1)}
    return measured, json.loads(done.stdout)


def _cache_share(path: Path) -> dict[str, Any]:
    capacities = {"infinite": None, "cache_10M": CACHE_TOKENS}
    counters: dict[str, PrefixHitCounter] = {}
    cache_s = dict.fromkeys(capacities, 0.0)
    block_ids = 0
    requests = 0
    started = time.perf_counter()
    for request in read_trace(path):
        if request.block_ids is None or request.block_tokens is None:
            raise ValueError(f"{path}: the benchmark needs a trace with block ids")
        if not counters:
            counters = {
                name: PrefixHitCounter(request.block_tokens, capacity)
                for name, capacity in capacities.items()
            }
        requests += 1
        block_ids += request.block_ids.shape[0]
        for name, counter in counters.items():
            t0 = time.perf_counter()
            counter.observe(request.block_ids, request.input_tokens)
            cache_s[name] += time.perf_counter() - t0
    total_s = time.perf_counter() - started
    return {
        "requests": requests,
        "block_ids": block_ids,
        "total_s": round(total_s, 2),
        "read_and_parse_s": round(total_s - sum(cache_s.values()), 2),
        "radix_cache_s": {name: round(s, 2) for name, s in cache_s.items()},
        "radix_cache_block_ids_per_s": {name: round(block_ids / s) for name, s in cache_s.items()},
        "radix_nodes_at_end": {name: c.cache.num_nodes for name, c in counters.items()},
    }


def run(quick: bool) -> dict[str, Any]:
    path = MOONCAKE if quick else WEKA
    if not path.exists():
        raise FileNotFoundError(f"{path}: the benchmark needs the public trace there")
    result: dict[str, Any] = {"trace": str(path), "cache_tokens": CACHE_TOKENS, "runs": {}}
    targets: dict[str, bool] = {}
    for name, cache_tokens in (("infinite", None), ("cache_10M", CACHE_TOKENS)):
        run_result, stats = _run_cli(path, cache_tokens)
        hit = stats["hit_rate"]
        run_result["requests"] = stats["requests"]
        run_result["bucket_shares_pct"] = [round(100 * b["share"], 1) for b in hit["buckets"]]
        run_result["mean_token_hit_rate_pct"] = round(100 * hit["mean_token_hit_rate"], 2)
        run_result["token_weighted_hit_rate_pct"] = round(100 * hit["token_weighted_hit_rate"], 2)
        result["runs"][name] = run_result
        targets[f"{name}_under_{TARGET_SECONDS:.0f}s"] = run_result["wall_s"] < TARGET_SECONDS
        targets[f"{name}_under_4GiB"] = run_result["peak_rss_mib"] * 2**20 < TARGET_RSS_BYTES
    result["in_process"] = _cache_share(path)
    result["targets"] = targets
    return result
