"""Tiny transformer: throughput of each operation, and its exactness measured on every path.

Figures (all measured in one run, on this machine, one torch intra-op thread as the roles run):
- tokens/s for prefill (4096 tokens in 512-token chunks), decode at batch 1 and 32 (pasts of
  ~1K and ~4K tokens) and extend (100 tokens on a 4K past), beside the same figures of the
  previous design (row-invariant float32, before the model became exact) measured in the same
  run by the same code;
- max |logits| and max |KV| difference between extend of 100 tokens and 100 decode steps;
- greedy streams of many prompts computed along the emulator's paths (batched decode with
  random companions, prefill -> wire copy -> relay decode -> extend handoff -> main decode),
  compared token by token and logit by logit with the one-process reference;
- float32 against float64 models on the same streams;
- the digest of the reference streams of the fixed set, against the committed one;
- context dependence: greedy streams of random word prompts that end in a short token cycle;
- the library kernels' behaviour on float data (results change with the call's shape and the
  thread count) and on the model's integer-valued data (they cannot).
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pddemu.bench import _model_speed
from pddemu.bench._model_speed import random_ids
from pddemu.model import KV, ByteTokenizer, ModelConfig, TinyTransformer, greedy
from pddemu.model.exact import ACT_BOUND, WEIGHT_BOUND
from pddemu.reference import REFERENCE_DIGEST, digest_requests, reference_digest


def run(quick: bool) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> dict:
    model = TinyTransformer(ModelConfig())
    sizes = _Sizes.quick() if quick else _Sizes.full()
    speed = speed_against_previous_design(quick)
    throughput = speed["exact"]
    exactness = _extend_vs_decode(model, sizes.extend_past, sizes.extend_tokens)
    streams = _stream_agreement(model, sizes.prompts, sizes.new_tokens, seed=1)
    dtypes = _float32_vs_float64(sizes.dtype_prompts, sizes.new_tokens)
    requests = digest_requests()[: sizes.digest_requests]
    digest = reference_digest(requests, model.config, 256)
    cycles = context_dependence(model, sizes.cycle_prompts, sizes.cycle_tokens, seed=0)
    kernels = _kernel_variance()
    previous = speed.get("ratio_exact_to_previous", {})
    return {
        "config": {**vars(model.config), "parameters": model.weights.n_parameters},
        "kv_bytes_per_token": model.config.kv_bytes_per_token,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "throughput_tokens_per_s": throughput,
        "against_previous_design": speed,
        "extend_vs_decode": exactness,
        "streams": streams,
        "float32_vs_float64": dtypes,
        "reference_digest": {"requests": len(requests), **digest},
        "context_dependence": cycles,
        "kernel_variance": kernels,
        "targets": {
            "extend_vs_decode_bit_identical": exactness["max_abs_diff_logits"] == 0.0
            and exactness["max_abs_diff_kv"] == 0.0,
            "streams_identical_across_paths": streams["token_mismatches"] == 0,
            "logits_bit_identical_across_paths": streams["max_abs_logit_diff"] == 0.0,
            "float32_and_float64_identical": dtypes["token_mismatches"] == 0
            and dtypes["max_abs_logit_diff"] == 0.0,
            "reference_digest_is_committed": quick or digest == REFERENCE_DIGEST,
            "no_stream_falls_into_a_short_cycle": cycles["cycling"] == 0,
            "integer_valued_products_exact_in_every_kernel": kernels["integer_valued_max"] == 0.0,
            "extend_faster_than_decode_steps": throughput["extend"] > throughput["decode_batch1"],
            "decode_batch32_faster_than_batch1": (
                throughput["decode_batch32"] > throughput["decode_batch1"]
            ),
            "at_least_half_the_previous_design_speed": bool(previous)
            and all(previous[name] >= 0.5 for name in KEPT_SPEED),
        },
    }


# The model before it became exact by construction (row-invariant float32 kernels); the issue
# that made it exact asked for at least half its speed in prefill, decode and extend.
PREVIOUS_DESIGN = "8d01f6b000942d79008abd672b3ff0d79e5da21c"
KEPT_SPEED = ("prefill", "decode_batch1", "decode_batch32", "extend")
ROUNDS = 2


def speed_against_previous_design(quick: bool) -> dict:
    """Throughput of this model and of the previous design's, measured in one run by the same
    code (`_model_speed.py`), in alternating subprocesses (previous, exact, previous, exact):
    each figure is the best of its rounds, so a burst of other load on the machine hurts both
    alike. The previous design's `pddemu` package comes from git (`git archive`); without the
    repository's history only this model is measured, and the section says why."""
    script = Path(_model_speed.__file__)
    root = script.parents[2]
    args = [sys.executable, str(script), *(["--quick"] if quick else [])]
    result: dict = {"previous_design": PREVIOUS_DESIGN, "rounds": ROUNDS}
    with tempfile.TemporaryDirectory(prefix="pddemu-previous-model-") as tree:
        trees = {"exact": root}
        try:
            archive = subprocess.run(
                ["git", "-C", str(root), "archive", PREVIOUS_DESIGN, "pddemu"],
                capture_output=True,
                check=True,
            )
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tree, filter="data")
            trees = {"previous": Path(tree), **trees}
        except (OSError, subprocess.CalledProcessError) as error:
            result["previous_not_measured"] = f"git archive {PREVIOUS_DESIGN} failed: {error}"
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(ROUNDS):
            for name, path in trees.items():
                env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
                out = subprocess.run(args, env=env, capture_output=True, text=True, check=True)
                figures = json.loads(out.stdout)
                if not figures.pop("model").startswith(str(path)):
                    raise RuntimeError(f"the {name} model was not imported from {path}")
                runs[name].append(figures)
    for name, figures in runs.items():
        best = {k: max(f[k] for f in figures) for k in _model_speed.FIGURES}
        result[name] = {**figures[0], **best}
    if "previous" in runs:
        result["ratio_exact_to_previous"] = {
            k: round(result["exact"][k] / result["previous"][k], 3) for k in _model_speed.FIGURES
        }
    return result


@dataclass(frozen=True)
class _Sizes:
    extend_past: int
    extend_tokens: int
    prompts: int
    new_tokens: int
    dtype_prompts: int
    digest_requests: int
    cycle_prompts: int
    cycle_tokens: int

    @classmethod
    def full(cls) -> _Sizes:
        return cls(4096, 100, 200, 64, 40, 50, 30, 128)

    @classmethod
    def quick(cls) -> _Sizes:
        return cls(1024, 32, 24, 16, 8, 4, 8, 64)


def _extend_vs_decode(model: TinyTransformer, past_tokens: int, k: int) -> dict:
    rng = random.Random(2)
    past, _ = model.prefill(random_ids(rng, past_tokens), None, 512)
    eager = random_ids(rng, k)
    ext_kv, ext_logits = model.extend(eager, past)
    context = KV.empty(model.config, capacity=past_tokens + k)
    context.append(past)
    step_logits = []
    for token in eager:
        (kv,), logits = model.decode_batch([token], [context])
        context.append(kv)
        step_logits.append(logits[0])
    decoded_kv = context.token_slice(past_tokens, past_tokens + k).tensor
    return {
        "past_tokens": past_tokens,
        "k": k,
        "max_abs_diff_logits": float((ext_logits - torch.stack(step_logits)).abs().max()),
        "max_abs_diff_kv": float((ext_kv.tensor - decoded_kv).abs().max()),
    }


@dataclass
class _Stream:
    """One request's state on one instance: its KV so far and what it generated."""

    context: KV
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)

    def add(self, kv: KV | None, logits: torch.Tensor) -> None:
        if kv is not None:
            self.context.append(kv)
        self.tokens.append(greedy(logits))
        self.logits.append(logits)


def _wire_copy(kv: KV) -> KV:
    """What the receiving side of a transfer holds: the bytes, reinterpreted."""
    data = kv.numpy().tobytes()
    array = np.frombuffer(data, dtype=kv.numpy().dtype).reshape(kv.tensor.shape)
    return KV.from_numpy(array)


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    tokenizer = ByteTokenizer()
    words = "the of and to in is was for on that with as by at from it this be are or an".split()
    prompts = []
    for i in range(n):
        length = rng.randint(8, 700)
        if i % 2:
            prompts.append([tokenizer.bos_id, *random_ids(rng, length)])
        else:
            text = " ".join(rng.choice(words) for _ in range(length // 3))
            prompts.append(tokenizer.encode(text))
    return prompts


def _decode_in_random_batches(
    model: TinyTransformer, streams: list[_Stream], until: list[int], rng: random.Random
) -> None:
    """Decode each stream to `until` tokens, regrouping requests into random batches each step."""
    while True:
        active = [s for s, n in zip(streams, until, strict=True) if len(s.tokens) < n]
        if not active:
            return
        rng.shuffle(active)
        while active:
            size = rng.randint(1, 32)
            group, active = active[:size], active[size:]
            kvs, logits = model.decode_batch(
                [s.tokens[-1] for s in group], [s.context for s in group]
            )
            for stream, kv, row in zip(group, kvs, logits, strict=True):
                stream.add(kv, row)


def _prefill_stream(model: TinyTransformer, prompt: list[int], chunk: int) -> tuple[KV, _Stream]:
    prompt_kv, logits = model.prefill(prompt, None, chunk)
    stream = _Stream(KV.empty(model.config, capacity=len(prompt) + 64))
    stream.context.append(prompt_kv)
    stream.add(None, logits)
    return prompt_kv, stream


def _stream_agreement(model: TinyTransformer, n_prompts: int, new_tokens: int, seed: int) -> dict:
    """Greedy streams along the emulator's paths versus the one-process reference.

    reference: prefill (one chunk) then decode one request at a time.
    batched:   prefill in random chunk sizes, decode in random batches of 1..32 requests.
    relay:     prefill (chunk 64) -> KV copied through bytes to the relay, which decodes h
               eager tokens (random h, batched): compared up to h.
    handoff:   the main decode takes P's KV (copied through bytes) and the relay's h tokens,
               recomputes their KV with one extend, then decodes the rest in random batches.
    """
    rng = random.Random(seed)
    prompts = _prompts(n_prompts, seed)
    reference = []
    for prompt in prompts:
        _, stream = _prefill_stream(model, prompt, 4096)
        _decode_in_random_batches(model, [stream], [new_tokens], random.Random(0))
        reference.append(stream)
    started = time.perf_counter()

    batched = [_prefill_stream(model, p, rng.choice([1, 7, 64, 128, 333]))[1] for p in prompts]
    _decode_in_random_batches(model, batched, [new_tokens] * n_prompts, rng)

    handoff_points = [rng.randint(1, new_tokens - 1) for _ in prompts]
    relay, main_kvs = [], []
    for prompt in prompts:
        prompt_kv, stream = _prefill_stream(model, prompt, 64)
        relay_stream = _Stream(KV.empty(model.config, capacity=len(prompt) + new_tokens))
        relay_stream.context.append(_wire_copy(prompt_kv))
        relay_stream.tokens, relay_stream.logits = stream.tokens, stream.logits
        relay.append(relay_stream)
        main_kvs.append(_wire_copy(prompt_kv))
    _decode_in_random_batches(model, relay, handoff_points, rng)
    handoff = []
    for relay_stream, main_kv, h in zip(relay, main_kvs, handoff_points, strict=True):
        eager = relay_stream.tokens[:h]
        ext_kv, ext_logits = model.extend(eager, main_kv)
        stream = _Stream(KV.empty(model.config, capacity=len(main_kv) + new_tokens))
        stream.context.append(main_kv)
        stream.context.append(ext_kv)
        stream.tokens, stream.logits = list(eager), relay_stream.logits[:1]
        stream.logits += list(ext_logits[:-1])
        stream.add(None, ext_logits[-1])
        handoff.append(stream)
    _decode_in_random_batches(model, handoff, [new_tokens] * n_prompts, rng)
    paths_s = time.perf_counter() - started

    result: dict = {
        "prompts": n_prompts,
        "new_tokens": new_tokens,
        "prompt_tokens_mean": round(statistics.mean(len(p) for p in prompts), 1),
        "token_mismatches": 0,
        "max_abs_logit_diff": 0.0,
        "paths_seconds": round(paths_s, 2),
    }
    # The relay's streams stop at their handoff point: each is compared as a prefix.
    for name, streams in (("batched", batched), ("relay", relay), ("handoff", handoff)):
        mismatches = sum(
            a != b
            for ref, s in zip(reference, streams, strict=True)
            for a, b in zip(ref.tokens[: len(s.tokens)], s.tokens, strict=True)
        )
        diff = max(
            float((torch.stack(ref.logits[: len(s.logits)]) - torch.stack(s.logits)).abs().max())
            for ref, s in zip(reference, streams, strict=True)
        )
        result[name] = {"token_mismatches": mismatches, "max_abs_logit_diff": diff}
        result["token_mismatches"] += mismatches
        result["max_abs_logit_diff"] = max(result["max_abs_logit_diff"], diff)
    # Logits are exact integers: a top-2 "gap" of 0 is a tie, which greedy breaks by lowest id.
    gaps = torch.tensor(
        [
            float(torch.topk(row[list(ByteTokenizer.text_ids)], 2).values.diff().abs())
            for ref in reference
            for row in ref.logits
        ]
    )
    result["reference_tokens"] = len(gaps)
    result["top2_ties"] = int((gaps == 0).sum())
    result["top2_gap_median"] = float(gaps.median())
    return result


def _float32_vs_float64(n_prompts: int, new_tokens: int) -> dict:
    """Greedy streams of the float32 and float64 models: the same integers in both."""
    rows = {}
    for dtype in ("float32", "float64"):
        model = TinyTransformer(ModelConfig(dtype=dtype))
        streams = [_prefill_stream(model, p, 512)[1] for p in _prompts(n_prompts, seed=3)]
        _decode_in_random_batches(model, streams, [new_tokens] * n_prompts, random.Random(4))
        rows[dtype] = streams
    return {
        "prompts": n_prompts,
        "new_tokens": new_tokens,
        "token_mismatches": sum(
            a != b
            for s32, s64 in zip(rows["float32"], rows["float64"], strict=True)
            for a, b in zip(s32.tokens, s64.tokens, strict=True)
        ),
        "max_abs_logit_diff": max(
            float((torch.stack(s32.logits).double() - torch.stack(s64.logits)).abs().max())
            for s32, s64 in zip(rows["float32"], rows["float64"], strict=True)
        ),
    }


def cycle_period(stream: list[int], tail: int = 32, longest: int = 8) -> int | None:
    """The period (<= longest) with which the stream's last `tail` tokens repeat, if any."""
    end = stream[-tail:]
    for period in range(1, longest + 1):
        if all(end[i] == end[i + period] for i in range(len(end) - period)):
            return period
    return None


def context_dependence(model: TinyTransformer, n_prompts: int, new_tokens: int, seed: int) -> dict:
    """Greedy streams of random prompts of 3-200 common English words: how many end in a token
    cycle of period <= 8 (a degenerate model forgets its context and loops), and how many
    distinct streams there are."""
    rng = random.Random(seed)
    words = "the of and to in is was for on that with as by at from it this be are or an".split()
    tokenizer = ByteTokenizer()
    streams = []
    for _ in range(n_prompts):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 200)))
        streams.append(_prefill_stream(model, tokenizer.encode(text), 512)[1])
    _decode_in_random_batches(model, streams, [new_tokens] * n_prompts, rng)
    periods = [cycle_period(s.tokens) for s in streams]
    return {
        "prompts": n_prompts,
        "new_tokens": new_tokens,
        "cycling": sum(p is not None for p in periods),
        "distinct_streams": len({tuple(s.tokens) for s in streams}),
    }


def _kernel_variance() -> dict:
    """Max |difference| between a product computed in two ways the kernels may order
    differently: a row alone versus inside a 4096-row call, with one and two threads, and the
    inner dimension permuted in both operands. On float data of the model's size (standard
    normal) and on integer-valued data within the model's bounds (activations x weights).
    """
    gen = torch.Generator().manual_seed(3)
    threads = torch.get_num_threads()
    out: dict = {}
    try:
        for kind in ("float32", "integer_valued"):
            worst = 0.0
            for fan_in, fan_out in ((128, 384), (1000, 32)):
                if kind == "float32":
                    x = torch.randn(4096, fan_in, generator=gen)
                    w = torch.randn(fan_in, fan_out, generator=gen)
                else:
                    x = torch.randint(-ACT_BOUND, ACT_BOUND + 1, (4096, fan_in), generator=gen)
                    w = torch.randint(
                        -WEIGHT_BOUND, WEIGHT_BOUND + 1, (fan_in, fan_out), generator=gen
                    )
                    x, w = x.float(), w.float()
                order = torch.randperm(fan_in, generator=gen)
                for n_threads in (1, 2):
                    torch.set_num_threads(n_threads)
                    full = torch.matmul(x, w)
                    rows = max(_max_abs(torch.matmul(x[:r], w), full[:r]) for r in range(1, 64))
                    permuted = _max_abs(torch.matmul(x[:, order], w[order]), full)
                    key = f"{kind}_{fan_in}x{fan_out}_{n_threads}_thread"
                    out[f"{key}_rows_alone"] = rows
                    out[f"{key}_inner_permuted"] = permuted
                    worst = max(worst, rows, permuted)
            out[f"{kind}_max"] = worst
    finally:
        torch.set_num_threads(threads)
    return out


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())
