"""Throughput of the tiny transformer's operations, written against nothing but the model's
public API that every design of it has had (`KV`, `ModelConfig`, `TinyTransformer`'s
prefill / decode_batch / extend): so the same code measures the model of another revision.

`python pddemu/bench/_model_speed.py [--quick]` prints the figures as JSON, with the path of
the `pddemu.model` it measured; with another revision's tree first on PYTHONPATH it measures
that revision's model (`pddemu/bench/model.py` compares the previous design this way). One
torch intra-op thread, as the roles run.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import pddemu.model
from pddemu.model import KV, ModelConfig, TinyTransformer

FIGURES = ("prefill", "decode_batch1", "decode_batch32", "decode_batch32_long_past", "extend")


@dataclass(frozen=True)
class Sizes:
    prefill_tokens: int
    chunk: int
    decode_past: int
    decode_long_past: int
    decode_steps: int
    extend_past: int
    extend_tokens: int

    @classmethod
    def full(cls) -> Sizes:
        return cls(4096, 512, 1024, 4096, 32, 4096, 100)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(1024, 256, 256, 1024, 8, 1024, 32)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` timings: the least disturbed by other processes on the machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def throughput(model: TinyTransformer, sizes: Sizes) -> dict:
    """Tokens/s of prefill, decode at batch 1 and 32 and extend, each the best of 3 timings."""
    rng = random.Random(0)
    prompt = random_ids(rng, sizes.prefill_tokens)
    prefill_s = best_seconds(lambda: model.prefill(prompt, None, sizes.chunk), 3)

    # Decode cost does not depend on what the past holds: every request's past is a prefix
    # (own buffer, own length) of one prefilled context.
    context, _ = model.prefill(random_ids(rng, sizes.decode_long_past + 64), None, sizes.chunk)

    def decode_rate(batch: int, past_tokens: int) -> float:
        pasts = []
        for _ in range(batch):
            past_len = past_tokens + rng.randrange(-64, 65)
            buffer = KV.empty(model.config, capacity=past_len + 3 * sizes.decode_steps)
            buffer.append(context.token_slice(0, past_len))
            pasts.append(buffer)
        tokens = random_ids(rng, batch)

        def steps() -> None:
            for _ in range(sizes.decode_steps):
                new_kvs, _ = model.decode_batch(tokens, pasts)
                for past, kv in zip(pasts, new_kvs, strict=True):
                    past.append(kv)

        return batch * sizes.decode_steps / best_seconds(steps, 3)

    past, _ = model.prefill(random_ids(rng, sizes.extend_past), None, sizes.chunk)
    eager = random_ids(rng, sizes.extend_tokens)
    extend_s = best_seconds(lambda: model.extend(eager, past), 3)
    return {
        "prefill": round(sizes.prefill_tokens / prefill_s, 1),
        "prefill_setup": (
            f"{sizes.prefill_tokens} tokens from scratch, chunk {sizes.chunk}, best of 3"
        ),
        "decode_batch1": round(decode_rate(1, sizes.decode_past), 1),
        "decode_batch32": round(decode_rate(32, sizes.decode_past), 1),
        "decode_setup": (
            f"{sizes.decode_steps} steps, best of 3, pasts of {sizes.decode_past}+-64 tokens"
        ),
        "decode_batch32_long_past": round(decode_rate(32, sizes.decode_long_past), 1),
        "decode_long_past_setup": f"pasts of {sizes.decode_long_past}+-64 tokens",
        "extend": round(sizes.extend_tokens / extend_s, 1),
        "extend_setup": (
            f"{sizes.extend_tokens} tokens on a {sizes.extend_past}-token past, best of 3"
        ),
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    sizes = Sizes.quick() if "--quick" in sys.argv[1:] else Sizes.full()
    figures = throughput(TinyTransformer(ModelConfig()), sizes)
    print(json.dumps({"model": pddemu.model.__file__, **figures}))
