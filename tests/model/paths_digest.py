"""A small workload through every path of the model, checked for agreement and condensed into
digests that must equal the committed ones on any CPU, kernel choice and thread count.

`python -m tests.model.paths_digest` prints the digests of the float32 and float64 models as
JSON (the kernel matrix runs it in subprocesses, tests/exactness/test_kernel_matrix.py); it
fails (exit 1, naming the path) if any path disagrees with the reference.

Prompts: the first PROMPTS requests of the committed pdd-janfeb sample at token scale
TOKEN_SCALE (364 to 673 tokens, so pasts beyond one exact float32 chunk of 512 keys occur).
Paths, each compared bit for bit (tokens, logits, KV) with the reference:
- reference: prefill in one chunk, then NEW_TOKENS decode steps, one request alone;
- cached:    a third of the prompt prefilled, its KV copied through bytes, the rest prefilled on
             it in chunks of 97, then all requests decoded together in one batch;
- handoff:   prefill in chunks of 64, KV copied through bytes, the first h tokens decoded in a
             batch (the relay), recomputed with one extend (the main decode), the rest decoded
             in a batch with the other requests.
Digests: sha256 of the reference tokens (JSON), of their logits and of their final KV (both as
little-endian float32 bytes: they are exact integers, so float32 and float64 hash alike).
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pddemu.model import KV, ModelConfig, TinyTransformer, greedy
from pddemu.workload.replay_source import load_workload

TRACE = Path(__file__).resolve().parents[2] / "traces" / "pdd-janfeb-2000.jsonl.gz"
PROMPTS = 4
TOKEN_SCALE = 128
NEW_TOKENS = 16

EXPECTED = {
    "tokens": "ba04c60e3fb2c08b2d90c9385e631478fddb85b8f29a9f457770f7a29c607bae",
    "logits": "3dff1d6dbc7c9eff78ea14fb3f34df56e5b4b84bce2b64ef6408b720c4ff0be3",
    "kv": "e7194dfd27602c15a2a2cee475742c53f447a9e2ec7da68af0be329093fceaa0",
}


@dataclass
class Stream:
    """One request on one path: its KV so far, its tokens and the logits they came from."""

    kv: KV
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)

    def add(self, logits: torch.Tensor) -> None:
        self.tokens.append(greedy(logits))
        self.logits.append(logits)


def prompts() -> list[list[int]]:
    requests = load_workload(TRACE, requests=PROMPTS, seed=0, token_scale=TOKEN_SCALE)
    return [[int(t) for t in r.prompt_ids] for r in requests]


def wire_copy(kv: KV) -> KV:
    """The KV as the receiving instance holds it: its bytes, reinterpreted."""
    array = kv.numpy()
    return KV.from_numpy(np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape))


def started(model: TinyTransformer, prompt_kv: KV, logits: torch.Tensor) -> Stream:
    stream = Stream(KV.empty(model.config, capacity=len(prompt_kv) + NEW_TOKENS))
    stream.kv.append(prompt_kv)
    stream.add(logits)
    return stream


def decode_together(model: TinyTransformer, streams: list[Stream], until: list[int]) -> None:
    while active := [s for s, n in zip(streams, until, strict=True) if len(s.tokens) < n]:
        kvs, logits = model.decode_batch([s.tokens[-1] for s in active], [s.kv for s in active])
        for stream, kv, row in zip(active, kvs, logits, strict=True):
            stream.kv.append(kv)
            stream.add(row)


def reference(model: TinyTransformer, prompt: list[int]) -> Stream:
    stream = started(model, *model.prefill(prompt, chunk_size=len(prompt)))
    decode_together(model, [stream], [NEW_TOKENS])
    return stream


def cached(model: TinyTransformer, all_prompts: list[list[int]]) -> list[Stream]:
    streams = []
    for prompt in all_prompts:
        split = len(prompt) // 3
        prefix_kv, _ = model.prefill(prompt[:split])
        rest_kv, logits = model.prefill(prompt[split:], wire_copy(prefix_kv), chunk_size=97)
        streams.append(started(model, KV.concat([prefix_kv, rest_kv]), logits))
    decode_together(model, streams, [NEW_TOKENS] * len(streams))
    return streams


def handoff(model: TinyTransformer, all_prompts: list[list[int]]) -> list[Stream]:
    relays, mains = [], []
    for prompt in all_prompts:
        prompt_kv, logits = model.prefill(prompt, chunk_size=64)
        relays.append(started(model, wire_copy(prompt_kv), logits))
        mains.append(wire_copy(prompt_kv))
    eager = [3 + 4 * i for i in range(len(all_prompts))]
    decode_together(model, relays, eager)
    streams = []
    for relay, main_kv, h in zip(relays, mains, eager, strict=True):
        ext_kv, ext_logits = model.extend(relay.tokens, main_kv)
        stream = Stream(KV.empty(model.config, capacity=len(main_kv) + NEW_TOKENS))
        stream.kv.append(main_kv)
        stream.kv.append(ext_kv)
        stream.tokens = list(relay.tokens)
        stream.logits = [relay.logits[0], *ext_logits[: h - 1]]
        stream.add(ext_logits[h - 1])
        streams.append(stream)
    decode_together(model, streams, [NEW_TOKENS] * len(streams))
    return streams


def check_agree(path: str, got: list[Stream], want: list[Stream]) -> None:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        same = (
            a.tokens == b.tokens
            and torch.equal(torch.stack(a.logits), torch.stack(b.logits))
            and torch.equal(a.kv.tensor, b.kv.tensor)
        )
        if not same:
            raise AssertionError(f"path {path!r}, prompt {i}: differs from the reference")


def paths_digest(config: ModelConfig) -> dict[str, str]:
    """Run every path, check they agree bit for bit, return the reference's digests."""
    model = TinyTransformer(config)
    all_prompts = prompts()
    want = [reference(model, p) for p in all_prompts]
    check_agree("cached", cached(model, all_prompts), want)
    check_agree("handoff", handoff(model, all_prompts), want)
    logits, kv = hashlib.sha256(), hashlib.sha256()
    for stream in want:
        logits.update(_float32_bytes(torch.stack(stream.logits)))
        kv.update(_float32_bytes(stream.kv.tensor))
    return {
        "tokens": hashlib.sha256(json.dumps([s.tokens for s in want]).encode()).hexdigest(),
        "logits": logits.hexdigest(),
        "kv": kv.hexdigest(),
    }


def _float32_bytes(x: torch.Tensor) -> bytes:
    return x.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()


if __name__ == "__main__":
    try:
        result = {dtype: paths_digest(ModelConfig(dtype=dtype)) for dtype in ("float32", "float64")}
    except AssertionError as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    capability = torch.backends.cpu.get_cpu_capability()
    print(json.dumps({"capability": capability, "threads": torch.get_num_threads(), **result}))
