"""The single-process greedy reference every delivered token stream is checked against.

One model in one process: each request's prompt prefilled (reusing the KV of the longest
prefix already computed, which changes nothing: prefill on a cached prefix equals prefill from
scratch bit for bit, see docs/model.md), then decoded greedily one token at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pddemu.model import KV, ModelConfig, TinyTransformer, greedy
from pddemu.roles.prefix_store import PrefixKVStore

PAGE_TOKENS = 4


def reference_outputs(
    requests: Sequence[Any], model_config: ModelConfig, chunk_tokens: int = 512
) -> dict[str, list[int]]:
    """Genuine output tokens of every request (`prompt_ids`, `genuine_output_tokens`)."""
    model = TinyTransformer(model_config)
    store = PrefixKVStore(PAGE_TOKENS, capacity_tokens=1 << 22)
    outputs: dict[str, list[int]] = {}
    for request in requests:
        prompt = [int(x) for x in request.prompt_ids]
        hit, node, handles = store.match(prompt)
        kv = KV.empty(model_config, capacity=len(prompt) + int(request.genuine_output_tokens))
        prefix = store.assemble(handles, hit)
        if prefix is not None:
            kv.append(prefix)
        store.release(node)
        new, logits = model.prefill(prompt[hit:], kv if hit else None, chunk_tokens)
        kv.append(new)
        store.release(store.insert(prompt, kv.token_slice(0, len(prompt)).clone()))
        out = [greedy(logits)]
        while len(out) < int(request.genuine_output_tokens):
            (step,), step_logits = model.decode_batch([out[-1]], [kv])
            kv.append(step)
            out.append(greedy(step_logits[0]))
        outputs[request.request_id] = out
    return outputs
