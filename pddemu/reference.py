"""The single-process greedy reference every delivered token stream is checked against.

One model in one process: each request's prompt prefilled (reusing the KV of the longest
prefix already computed, which changes nothing: prefill on a cached prefix equals prefill from
scratch bit for bit, see docs/model.md), then decoded greedily one token at a time.

The model is exact on every CPU, so the reference streams are the same on every machine;
`reference_digest` condenses them (and their logits) into two hashes that a test compares with
committed values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from pddemu.model import KV, ModelConfig, TinyTransformer, greedy
from pddemu.roles.prefix_store import PrefixKVStore
from pddemu.workload.replay_source import load_workload

PAGE_TOKENS = 4

# The fixed set whose reference streams are committed as digests: the first 50 requests of the
# committed pdd-janfeb sample at `make emulate`'s token scale (1/32), 64 tokens each.
DIGEST_TRACE = Path(__file__).resolve().parents[1] / "traces" / "pdd-janfeb-2000.jsonl.gz"
DIGEST_REQUESTS = 50
DIGEST_TOKENS = 64
DIGEST_TOKEN_SCALE = 32
REFERENCE_DIGEST = {
    "tokens": "421cc6c786d9f13eb25a1e1438843cd67375e433ff17a5111c2c47e984ec734b",
    "logits": "6c4f26abc2d15e3840817f3098c959acdf1b5d3b540efc9493afe7242973fe15",
}


def reference_streams(
    requests: Sequence[Any], model_config: ModelConfig, chunk_tokens: int = 512
) -> Iterator[tuple[str, list[int], torch.Tensor]]:
    """Per request (`prompt_ids`, `genuine_output_tokens`): its id, its genuine output tokens
    and the logits [tokens, vocab] each token was chosen from.

    Runs with one torch intra-op thread, like the instances (other emulations may share the
    cores); the streams do not depend on it.
    """
    model = TinyTransformer(model_config)
    store = PrefixKVStore(PAGE_TOKENS, capacity_tokens=1 << 22)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for request in requests:
            prompt = [int(x) for x in request.prompt_ids]
            hit, node, handles = store.match(prompt)
            length = len(prompt) + int(request.genuine_output_tokens)
            kv = KV.empty(model_config, capacity=length)
            prefix = store.assemble(handles, hit)
            if prefix is not None:
                kv.append(prefix)
            store.release(node)
            new, logits = model.prefill(prompt[hit:], kv if hit else None, chunk_tokens)
            kv.append(new)
            store.release(store.insert(prompt, kv.token_slice(0, len(prompt)).clone()))
            rows = [logits]
            out = [greedy(logits)]
            while len(out) < int(request.genuine_output_tokens):
                (step,), step_logits = model.decode_batch([out[-1]], [kv])
                kv.append(step)
                rows.append(step_logits[0])
                out.append(greedy(step_logits[0]))
            yield request.request_id, out, torch.stack(rows)
    finally:
        torch.set_num_threads(threads)


def reference_outputs(
    requests: Sequence[Any], model_config: ModelConfig, chunk_tokens: int = 512
) -> dict[str, list[int]]:
    """Genuine output tokens of every request (`prompt_ids`, `genuine_output_tokens`)."""
    return {rid: out for rid, out, _ in reference_streams(requests, model_config, chunk_tokens)}


def digest_requests() -> list[Any]:
    """The fixed set of the committed digest (needs the project's checkout for the trace)."""
    requests = load_workload(
        DIGEST_TRACE, requests=DIGEST_REQUESTS, seed=0, token_scale=DIGEST_TOKEN_SCALE
    )
    return [dataclasses.replace(r, genuine_output_tokens=DIGEST_TOKENS) for r in requests]


def reference_digest(
    requests: Sequence[Any], model_config: ModelConfig, chunk_tokens: int = 512
) -> dict[str, str]:
    """sha256 of the reference token streams (JSON of the id lists, in request order) and of
    their logits (little-endian float32 bytes, row after row; the logits are exact integers,
    so a float64 model hashes the same)."""
    tokens, logits = [], hashlib.sha256()
    for _, out, rows in reference_streams(requests, model_config, chunk_tokens):
        tokens.append(out)
        logits.update(rows.to(torch.float32).numpy().astype("<f4").tobytes())
    return {
        "tokens": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
        "logits": logits.hexdigest(),
    }
