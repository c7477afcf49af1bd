"""Tiny transformer: throughput of each operation, and whether token streams agree across paths.

Figures (all measured in one run, on this machine, one torch thread):
- tokens/s for prefill (4096 tokens in 512-token chunks), decode at batch 1 and 32 (pasts of
  ~1K tokens) and extend (100 tokens on a 4K past);
- max |logits| and max |KV| difference between extend of 100 tokens and 100 decode steps;
- greedy streams of many prompts computed along the emulator's paths (batched decode with
  random companions, prefill -> wire copy -> relay decode -> extend handoff -> main decode),
  compared token by token and logit by logit with the one-process reference;
- the same two measurements for a standard implementation of the same model (same weights,
  plain torch kernels), in float32 and float64: what the row-invariant design buys;
- the library kernel behaviours that forced the row-invariant design (`model/invariant.py`).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from pddemu.model import KV, ByteTokenizer, ModelConfig, TinyTransformer, greedy


def run(quick: bool) -> dict:
    model = TinyTransformer(ModelConfig())
    sizes = _Sizes.quick() if quick else _Sizes.full()
    throughput = _throughput(model, sizes)
    exactness = _extend_vs_decode(model, sizes.extend_past, sizes.extend_tokens)
    streams = _stream_agreement(model, sizes.prompts, sizes.new_tokens, seed=1)
    standard = {}
    for dtype in ("float32", "float64"):
        baseline = _StandardTransformer(ModelConfig(dtype=dtype))
        standard[dtype] = {
            "extend_vs_decode": _extend_vs_decode(baseline, sizes.extend_past, sizes.extend_tokens),
            "streams": _stream_agreement(baseline, sizes.prompts, sizes.new_tokens, seed=1),
        }
    kernels = _kernel_variance()
    return {
        "config": {**vars(model.config), "parameters": model.weights.n_parameters},
        "kv_bytes_per_token": model.config.kv_bytes_per_token,
        "threads": torch.get_num_threads(),
        "throughput_tokens_per_s": throughput,
        "extend_vs_decode": exactness,
        "streams": streams,
        "standard_implementation": standard,
        "kernel_variance": kernels,
        "targets": {
            "extend_vs_decode_max_abs_diff_below_1e-4": exactness["max_abs_diff_logits"] < 1e-4,
            "streams_identical_across_paths": streams["token_mismatches"] == 0,
            "logits_bit_identical_across_paths": streams["max_abs_logit_diff"] == 0.0,
            "extend_faster_than_decode_steps": throughput["extend"] > throughput["decode_batch1"],
            "decode_batch32_faster_than_batch1": (
                throughput["decode_batch32"] > throughput["decode_batch1"]
            ),
        },
    }


@dataclass(frozen=True)
class _Sizes:
    prefill_tokens: int
    chunk: int
    decode_past: int
    decode_long_past: int
    decode_steps: int
    extend_past: int
    extend_tokens: int
    prompts: int
    new_tokens: int

    @classmethod
    def full(cls) -> _Sizes:
        return cls(4096, 512, 1024, 4096, 32, 4096, 100, 200, 64)

    @classmethod
    def quick(cls) -> _Sizes:
        return cls(1024, 256, 256, 1024, 8, 1024, 32, 24, 16)


def _best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` timings: the least disturbed by other processes on the machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def _throughput(model: TinyTransformer, sizes: _Sizes) -> dict:
    rng = random.Random(0)
    prompt = _random_ids(rng, sizes.prefill_tokens)
    prefill_s = _best_seconds(lambda: model.prefill(prompt, None, sizes.chunk), 3)

    # Decode cost does not depend on what the past holds: every request's past is a prefix
    # (own buffer, own length) of one prefilled context.
    context, _ = model.prefill(_random_ids(rng, sizes.decode_long_past + 64), None, sizes.chunk)

    def decode_rate(batch: int, past_tokens: int) -> float:
        pasts = []
        for _ in range(batch):
            past_len = past_tokens + rng.randrange(-64, 65)
            buffer = KV.empty(model.config, capacity=past_len + sizes.decode_steps)
            buffer.append(context.token_slice(0, past_len))
            pasts.append(buffer)
        tokens = _random_ids(rng, batch)

        def steps() -> None:
            for _ in range(sizes.decode_steps):
                new_kvs, _ = model.decode_batch(tokens, pasts)
                for past, kv in zip(pasts, new_kvs, strict=True):
                    past.append(kv)

        return batch * sizes.decode_steps / _best_seconds(steps, 1)

    past, _ = model.prefill(_random_ids(rng, sizes.extend_past), None, sizes.chunk)
    eager = _random_ids(rng, sizes.extend_tokens)
    extend_s = _best_seconds(lambda: model.extend(eager, past), 3)
    return {
        "prefill": round(sizes.prefill_tokens / prefill_s, 1),
        "prefill_setup": f"{sizes.prefill_tokens} tokens from scratch, chunk {sizes.chunk}",
        "decode_batch1": round(decode_rate(1, sizes.decode_past), 1),
        "decode_batch32": round(decode_rate(32, sizes.decode_past), 1),
        "decode_setup": f"{sizes.decode_steps} steps, pasts of {sizes.decode_past}+-64 tokens",
        "decode_batch32_long_past": round(decode_rate(32, sizes.decode_long_past), 1),
        "decode_long_past_setup": f"pasts of {sizes.decode_long_past}+-64 tokens",
        "extend": round(sizes.extend_tokens / extend_s, 1),
        "extend_setup": f"{sizes.extend_tokens} tokens on a {sizes.extend_past}-token past",
    }


def _extend_vs_decode(model: TinyTransformer, past_tokens: int, k: int) -> dict:
    rng = random.Random(2)
    past, _ = model.prefill(_random_ids(rng, past_tokens), None, 512)
    eager = _random_ids(rng, k)
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
            prompts.append([tokenizer.bos_id, *_random_ids(rng, length)])
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
    gaps = torch.tensor(
        [float(torch.topk(row, 2).values.diff().abs()) for ref in reference for row in ref.logits]
    )
    result["min_top2_logit_gap"] = float(gaps.min())
    result["tokens_with_top2_gap_below"] = {
        f"{threshold:g}": int((gaps < threshold).sum()) for threshold in (1e-6, 1e-5, 1e-4, 1e-3)
    }
    return result


class _StandardTransformer(TinyTransformer):
    """The tiny transformer's weights computed the usual way: products with however many rows
    the call has, attention by `scaled_dot_product_attention` over pasts copied into a padded
    batch, torch's RMSNorm and SiLU. A measuring instrument for this benchmark only."""

    def _forward(
        self, ids: torch.Tensor, pasts: Sequence[KV | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, w = self.config, self.weights
        n_heads, kv_heads, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        batch, n_new = ids.shape
        rows = batch * n_new
        past_lens = torch.tensor([0 if p is None else len(p) for p in pasts])
        query_pos = past_lens[:, None] + torch.arange(n_new)
        total = int(past_lens.max()) + n_new
        visible = (torch.arange(total) <= query_pos[:, :, None]).unsqueeze(1)
        pos = query_pos.reshape(rows)
        kv = torch.empty((cfg.n_layers, 2, kv_heads, rows, hd), dtype=cfg.torch_dtype)
        x = w.embedding[ids.reshape(rows)]
        for index, layer in enumerate(w.layers):
            h = F.rms_norm(x, (cfg.d_model,), layer.attn_norm, cfg.norm_eps)
            q, k, v = F.linear(h, layer.qkv).split([n_heads * hd, kv_heads * hd, kv_heads * hd], 1)
            q = self._rope.rotate(q.reshape(rows, n_heads, hd), pos) * self._q_scale
            kv[index, 0] = self._rope.rotate(k.reshape(rows, kv_heads, hd), pos).transpose(0, 1)
            kv[index, 1] = v.reshape(rows, kv_heads, hd).transpose(0, 1)
            padded = q.new_zeros((2, batch, kv_heads, total, hd))
            for i, past in enumerate(pasts):
                start = int(past_lens[i])
                if past is not None:
                    padded[:, i, :, :start] = past.tensor[index]
                padded[:, i, :, start : start + n_new] = kv[
                    index, :, :, i * n_new : (i + 1) * n_new
                ]
            group = n_heads // kv_heads
            attn = F.scaled_dot_product_attention(
                q.reshape(batch, n_new, n_heads, hd).transpose(1, 2),
                padded[0].repeat_interleave(group, dim=1),
                padded[1].repeat_interleave(group, dim=1),
                attn_mask=visible,
                scale=1.0,
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(rows, n_heads * hd), layer.out)
            h = F.rms_norm(x, (cfg.d_model,), layer.mlp_norm, cfg.norm_eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, 1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return kv, x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(
            hidden, (self.config.d_model,), self.weights.final_norm, self.config.norm_eps
        )
        return F.linear(normed, self.weights.lm_head)


def _kernel_variance() -> dict:
    """Max |difference| of a row's result computed alone versus inside a larger call.

    Raw torch kernels, no model code: the facts `model/invariant.py` is built on. The first
    rows of [rows, in] x [in, out] products against the same rows of a 4096-row product, with
    one and two threads; weights x values over t keys against the same product zero-padded to
    4096 keys; elementwise ops on one element against the same element inside a 100-element
    tensor.
    """
    gen = torch.Generator().manual_seed(3)
    threads = torch.get_num_threads()
    out: dict = {}
    row_sets = {
        "1_to_3_rows": range(1, 4),
        "multiple_of_4_rows": range(4, 64, 4),
        "other_rows": [r for r in range(5, 64) if r % 4],
    }
    try:
        for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            for fan_in, fan_out in ((128, 384), (1000, 32)):
                x = torch.randn(4096, fan_in, generator=gen).to(dtype)
                w = torch.randn(fan_out, fan_in, generator=gen).to(dtype)
                for n_threads in (1, 2):
                    torch.set_num_threads(n_threads)
                    full = torch.nn.functional.linear(x, w)
                    for label, rows in row_sets.items():
                        key = f"{name}_linear_{fan_in}x{fan_out}_{label}_{n_threads}_thread"
                        out[key] = max(
                            _max_abs(torch.nn.functional.linear(x[:r], w), full[:r]) for r in rows
                        )
            torch.set_num_threads(threads)
            values = torch.randn(4096, 32, generator=gen).to(dtype)
            worst = 0.0
            for keys in (100, 193, 300, 1000):
                probs = torch.rand(4, keys, generator=gen).to(dtype)
                padded = torch.zeros(4, 4096, dtype=dtype)
                padded[:, :keys] = probs
                worst = max(worst, _max_abs(probs @ values[:keys], padded @ values))
            out[f"{name}_weights_x_values_zero_padded_keys"] = worst
            v = torch.randn(100, generator=gen).to(dtype) * 5
            for op_name, op in (("silu", torch.nn.functional.silu), ("exp", torch.exp)):
                whole = op(v)
                out[f"{name}_{op_name}_element_alone_vs_in_tensor"] = max(
                    _max_abs(op(v[i : i + 1]), whole[i : i + 1]) for i in range(100)
                )
    finally:
        torch.set_num_threads(threads)
    return out


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())
