"""The memory of the match by hashes' two records over a long run: the frontend's record of
one MD (`RoutedPrompts`) and MD's index (`PrefixIndex`), in bytes a request and against the
DRC's capacity in pages.

pdd-janfeb's prompts (token scale 32) replayed in-process as `tests/roles/test_named_match.py`
does, every transfer arriving, MD's reports heard `REPORT_LAG` requests late, beside a DRC of
the default MD's capacity (`kv_capacity_genuine`): the records' sizes are their objects' deep
size (`sys.getsizeof`, each object and each array's buffer counted once), after each
`SAMPLE`th request.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from pddemu.cache.page_hashes import PrefixIndex, chained_page_hashes, parse_hash
from pddemu.config import load_config
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.roles.routed_prompts import RoutedPrompts
from pddemu.roles.sizing import cost_model
from pddemu.wire import Control, encode, frame_size
from pddemu.workload.replay_source import load_workload

PAGE = 2  # the default DRC page in genuine tokens
REPORT_LAG = 3
SAMPLE = 250


class _Pages:
    """Stands for a prompt's KV in the DRC."""

    def token_slice(self, _start: int, _end: int) -> _Pages:
        return self

    def clone(self) -> _Pages:
        return self


def deep_size(root: Any, skip: tuple[Any, ...] = ()) -> int:
    """Bytes of `root` and what it reaches (an array's base buffer once), `skip`'s excluded."""
    seen = {id(item) for item in skip}
    total, stack = 0, [root]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, type):
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, np.ndarray):
            if item.base is not None:
                stack.append(item.base)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif hasattr(item, "__dict__"):
            stack.append(vars(item))
        if hasattr(type(item), "__slots__"):
            stack.extend(
                getattr(item, slot) for slot in type(item).__slots__ if hasattr(item, slot)
            )
    return total


def run(quick: bool = False) -> dict[str, Any]:
    requests = 500 if quick else 3000
    config = load_config()
    capacity = cost_model(config, "pdd", "MD").kv_capacity_tokens() // config.scale.token_scale
    workload = load_workload("pdd-janfeb", requests=requests, seed=0, token_scale=32)
    router = RoutedPrompts(PAGE)
    index = PrefixIndex(PAGE)
    store = PrefixKVStore(PAGE, capacity, index)
    by_ids = PrefixKVStore(PAGE, capacity)
    unheard: list[tuple[int, dict]] = []
    samples, differ, named_counts, report_sizes = [], 0, [], []
    for number, request in enumerate(workload, 1):
        while unheard and unheard[0][0] <= number - REPORT_LAG:
            router.reported(unheard.pop(0)[1])
        prompt = [int(x) for x in request.prompt_ids]
        prompt_hashes = chained_page_hashes(prompt, PAGE)
        named = [(int(p), parse_hash(h)) for p, h in router.named(prompt, prompt_hashes)]
        named_counts.append(len(named))
        index.heard(*router.acknowledged())
        hit, node, _ = store.match(index.longest(named), len(prompt))
        hit_by_ids, node_by_ids, _ = by_ids.match(prompt, len(prompt))
        differ += hit != hit_by_ids
        router.routed(str(number), prompt, prompt_hashes)
        hashes = index.hold(prompt)
        index.kept(str(number), len(prompt))
        store.release(store.insert(prompt, _Pages(), hashes))  # type: ignore[arg-type]
        store.release(node)
        index.let_go(hashes)
        by_ids.release(by_ids.insert(prompt, _Pages()))  # type: ignore[arg-type]
        by_ids.release(node_by_ids)
        report = index.report()
        if report is not None:
            unheard.append((number, report))
            report_sizes.append(frame_size(encode(Control("drc_report", report))))
        if number % SAMPLE == 0:
            samples.append(
                {
                    "requests": number,
                    "router_bytes": deep_size(router),
                    "md_index_bytes": deep_size(index),
                    "router_pages_reported": len(router.held),
                    "router_pages_in_flight": router.in_flight.num_pages,
                    "md_index_entries": len(index),
                    "drc_pages": store.cache.num_pages,
                }
            )
    last = samples[-1]
    return {
        "requests": requests,
        "drc_capacity_pages": capacity // PAGE,
        "samples": samples,
        "router_bytes_per_request": round(last["router_bytes"] / requests),
        "md_index_bytes_per_request": round(last["md_index_bytes"] / requests),
        "hits_differing_from_ids": differ,
        "drc_report_bytes": {
            "count": len(report_sizes),
            "mean": round(sum(report_sizes) / len(report_sizes)),
            "max": max(report_sizes),
        },
        "hashes_a_match": {
            "mean": round(sum(named_counts) / requests, 1),
            "median": sorted(named_counts)[requests // 2],
            "max": max(named_counts),
        },
        "targets": {
            "hits_equal_ids": differ == 0,
            "router_within_drc": last["router_pages_reported"] <= capacity // PAGE,
            "md_index_within_drc_and_lag": last["md_index_entries"]
            <= capacity // PAGE + REPORT_LAG * max(len(r.prompt_ids) for r in workload) // PAGE,
        },
    }
