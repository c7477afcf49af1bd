"""The invariants the emulator relies on: every path computes the same tokens, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from pddemu.bench.model import context_dependence
from pddemu.model import (
    BOS_ID,
    KV,
    TEXT_IDS,
    VOCAB_SIZE,
    ByteTokenizer,
    KVError,
    ModelConfig,
    ModelError,
    TinyTransformer,
    greedy,
)


@pytest.fixture(scope="module")
def model() -> TinyTransformer:
    return TinyTransformer(ModelConfig())


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def wire_copy(kv: KV) -> KV:
    """The KV as the receiving instance holds it: its bytes, reinterpreted."""
    array = kv.numpy()
    return KV.from_numpy(np.frombuffer(array.tobytes(), dtype=array.dtype).reshape(array.shape))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def decode_steps(
    model: TinyTransformer, context: KV, first: int, steps: int
) -> tuple[list[int], KV, list[torch.Tensor]]:
    """Greedy decode one request alone: `first` is the newest token, not yet in `context`."""
    buffer = KV.empty(model.config)
    buffer.append(context)
    tokens, logits = [first], []
    for _ in range(steps):
        (kv,), step_logits = model.decode_batch([tokens[-1]], [buffer])
        buffer.append(kv)
        logits.append(step_logits[0])
        tokens.append(greedy(step_logits[0]))
    return tokens, buffer, logits


# ---- prefill ---------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [1, 63, 64, 65, 200])
def test_prefill_on_cached_prefix_equals_prefill_from_scratch(
    model: TinyTransformer, split: int
) -> None:
    prompt = ids(300, seed=1)
    scratch_kv, scratch_logits = model.prefill(prompt)
    prefix_kv, _ = model.prefill(prompt[:split])
    rest_kv, rest_logits = model.prefill(prompt[split:], wire_copy(prefix_kv))
    diff = max_diff(rest_logits, scratch_logits)
    print(f"cached prefix of {split}: max |logits diff| = {diff}")
    assert torch.equal(rest_logits, scratch_logits)
    assert torch.equal(KV.concat([prefix_kv, rest_kv]).tensor, scratch_kv.tensor)


@pytest.mark.parametrize("chunk_size", [1, 5, 64, 100, 299, 1000])
def test_chunked_prefill_equals_unchunked(model: TinyTransformer, chunk_size: int) -> None:
    prompt = ids(300, seed=2)
    whole_kv, whole_logits = model.prefill(prompt, chunk_size=len(prompt))
    kv, logits = model.prefill(prompt, chunk_size=chunk_size)
    print(f"chunk {chunk_size}: max |logits diff| = {max_diff(logits, whole_logits)}")
    assert torch.equal(logits, whole_logits)
    assert torch.equal(kv.tensor, whole_kv.tensor)


def test_long_prompts_and_pasts_beyond_one_float32_chunk(model: TinyTransformer) -> None:
    """Past 516 keys, attention's weighted sums are cut into exact float32 chunks added in
    float64: chunking, cached prefixes and extend still agree bit for bit."""
    prompt = ids(1300, seed=14)
    whole_kv, whole_logits = model.prefill(prompt, chunk_size=1300)
    for chunk in (100, 517, 1000):
        kv, logits = model.prefill(prompt, chunk_size=chunk)
        assert torch.equal(logits, whole_logits) and torch.equal(kv.tensor, whole_kv.tensor)
    prefix_kv, _ = model.prefill(prompt[:600])
    rest_kv, logits = model.prefill(prompt[600:], wire_copy(prefix_kv), chunk_size=700)
    assert torch.equal(logits, whole_logits)
    assert torch.equal(rest_kv.tensor, whole_kv.token_slice(600, 1300).tensor)
    eager, buffer, step_logits = decode_steps(model, whole_kv, greedy(whole_logits), 20)
    ext_kv, ext_logits = model.extend(eager[:-1], whole_kv)
    assert torch.equal(ext_logits, torch.stack(step_logits))
    assert torch.equal(ext_kv.tensor, buffer.token_slice(1300, 1320).tensor)


def test_prefill_chunks_yields_each_chunk_with_its_last_logits(model: TinyTransformer) -> None:
    prompt = ids(150, seed=3)
    past, _ = model.prefill(prompt[:20])
    chunks = list(model.prefill_chunks(prompt[20:], past, chunk_size=50))
    assert [len(kv) for kv, _ in chunks] == [50, 50, 30]
    for end, (_, logits) in zip((70, 120, 150), chunks, strict=True):
        assert torch.equal(logits, model.prefill(prompt[:end])[1])
    assert len(past) == 20  # the caller's past is read, never extended


# ---- extend and decode -----------------------------------------------------------------------


def test_extend_of_k_tokens_equals_k_decode_steps(model: TinyTransformer) -> None:
    past, first_logits = model.prefill(ids(200, seed=4))
    eager, buffer, step_logits = decode_steps(model, past, greedy(first_logits), 40)
    ext_kv, ext_logits = model.extend(eager[:-1], wire_copy(past))
    logits_diff = max_diff(ext_logits, torch.stack(step_logits))
    kv_diff = max_diff(ext_kv.tensor, buffer.token_slice(200, 240).tensor)
    print(f"extend of 40 vs 40 decode steps: max |logits diff| = {logits_diff}, KV {kv_diff}")
    assert logits_diff == 0.0 and kv_diff == 0.0  # the bound is 1e-4; it is exact here


def test_extend_is_bit_identical_to_decode_steps(model: TinyTransformer) -> None:
    past, first_logits = model.prefill(ids(130, seed=5))
    eager, buffer, step_logits = decode_steps(model, past, greedy(first_logits), 70)
    ext_kv, ext_logits = model.extend(eager[:-1], past)
    assert torch.equal(ext_logits, torch.stack(step_logits))
    assert torch.equal(ext_kv.tensor, buffer.token_slice(130, 200).tensor)
    assert [greedy(row) for row in ext_logits] == eager[1:]


def test_batched_decode_equals_single_decode(model: TinyTransformer) -> None:
    lengths = [1, 63, 64, 65, 130, 700]
    pasts = [model.prefill(ids(n, seed=10 + n))[0] for n in lengths]
    pasts.append(KV.empty(model.config))  # no past at all
    tokens = ids(len(pasts), seed=6)
    before = [p.tensor.clone() for p in pasts]
    kvs, logits = model.decode_batch(tokens, pasts)
    assert logits.shape == (len(pasts), model.config.vocab_size)
    worst = 0.0
    for i, past in enumerate(pasts):
        (alone_kv,), alone_logits = model.decode_batch([tokens[i]], [past])
        worst = max(worst, max_diff(logits[i], alone_logits[0]))
        assert torch.equal(logits[i], alone_logits[0])
        assert torch.equal(kvs[i].tensor, alone_kv.tensor)
        assert len(kvs[i]) == 1
    print(f"batched vs single decode: max |logits diff| = {worst}")
    reordered_kvs, reordered = model.decode_batch(tokens[::-1], pasts[::-1])
    assert torch.equal(reordered, logits.flip(0))
    assert all(torch.equal(a.tensor, b) for a, b in zip(pasts, before, strict=True))


# ---- greedy token streams across the emulator's paths ----------------------------------------


def test_split_prefill_and_decode_gives_the_one_process_stream(model: TinyTransformer) -> None:
    prompt = ids(180, seed=7)
    reference = model.generate(prompt, 24)
    prompt_kv, logits = model.prefill(prompt, chunk_size=32)  # on the prefill instance
    stream, _, _ = decode_steps(model, wire_copy(prompt_kv), greedy(logits), 23)
    assert stream == reference


@pytest.mark.parametrize("handoff", [1, 2, 5, 17, 23])
def test_handoff_with_extend_recompute_gives_the_one_process_stream(
    model: TinyTransformer, handoff: int
) -> None:
    prompt = ids(150, seed=8)
    reference = model.generate(prompt, 24)
    prompt_kv, logits = model.prefill(prompt, chunk_size=64)
    relay_stream, _, _ = decode_steps(model, wire_copy(prompt_kv), greedy(logits), handoff - 1)
    eager = relay_stream[:handoff]  # token ids are all the relay sends
    main_kv = KV.empty(model.config)
    main_kv.append(wire_copy(prompt_kv))
    ext_kv, ext_logits = model.extend(eager, main_kv)
    main_kv.append(ext_kv)
    rest, _, _ = decode_steps(model, main_kv, greedy(ext_logits[-1]), 24 - handoff - 1)
    assert eager + rest == reference


def test_decode_batched_with_other_requests_gives_each_its_stream(model: TinyTransformer) -> None:
    prompts = [ids(n, seed=20 + n) for n in (3, 64, 97, 250, 41)]
    new_tokens = 20
    references = [model.generate(p, new_tokens) for p in prompts]
    # Requests join two steps apart, so every batch mixes lengths and companions change.
    contexts, streams = [], []
    for step in range(new_tokens + 2 * len(prompts)):
        if step % 2 == 0 and step // 2 < len(prompts):
            kv, logits = model.prefill(prompts[step // 2])
            buffer = KV.empty(model.config)
            buffer.append(kv)
            contexts.append(buffer)
            streams.append([greedy(logits)])
        active = [i for i, s in enumerate(streams) if len(s) < new_tokens]
        if not active:
            continue
        kvs, logits = model.decode_batch(
            [streams[i][-1] for i in active], [contexts[i] for i in active]
        )
        for i, kv, row in zip(active, kvs, logits, strict=True):
            contexts[i].append(kv)
            streams[i].append(greedy(row))
    assert streams == references


# ---- determinism, other shapes ---------------------------------------------------------------


def test_same_seed_gives_identical_weights_and_outputs() -> None:
    a, b = TinyTransformer(ModelConfig()), TinyTransformer(ModelConfig())
    for wa, wb in zip(_tensors(a), _tensors(b), strict=True):
        assert torch.equal(wa, wb)
    prompt = ids(100, seed=9)
    assert torch.equal(a.prefill(prompt)[1], b.prefill(prompt)[1])
    assert a.generate(prompt, 16) == b.generate(prompt, 16)
    other = TinyTransformer(ModelConfig(seed=1))
    assert not torch.equal(_tensors(a)[0], _tensors(other)[0])


def _tensors(model: TinyTransformer) -> list[torch.Tensor]:
    w = model.weights
    out = [w.embedding, w.lm_head]
    for layer in w.layers:
        out += [layer.qkv, layer.out, layer.gate_up, layer.down]
    return out


@pytest.mark.parametrize(
    "config",
    [
        ModelConfig(dtype="float64"),
        ModelConfig(n_kv_heads=4),  # multi-head: one query row per KV head
        ModelConfig(n_kv_heads=1),  # multi-query
        ModelConfig(n_layers=3, d_model=96, n_heads=3, n_kv_heads=1, d_ff=200, seed=5),
    ],
    ids=["float64", "mha", "mqa", "odd-sizes"],
)
def test_paths_agree_for_other_configs(config: ModelConfig) -> None:
    model = TinyTransformer(config)
    prompt = ids(140, seed=11)
    reference = model.generate(prompt, 12)
    past, logits = model.prefill(prompt, chunk_size=50)
    assert logits.dtype == config.torch_dtype
    ext_kv, ext_logits = model.extend(reference[:-1], past)
    assert [greedy(row) for row in ext_logits] == reference[1:]
    companion, _ = model.prefill(ids(70, seed=12))
    _, batched = model.decode_batch([reference[0], 1], [past, companion])
    assert torch.equal(batched[0], ext_logits[0])


def test_float64_has_the_float32_weights() -> None:
    a = TinyTransformer(ModelConfig()).weights.layers[0].qkv
    b = TinyTransformer(ModelConfig(dtype="float64")).weights.layers[0].qkv
    assert b.dtype == torch.float64
    assert torch.equal(a.double(), b)


def test_generate_length_and_zero(model: TinyTransformer) -> None:
    assert model.generate([1, 2, 3], 0) == []
    assert len(model.generate([1, 2, 3], 5)) == 5


# ---- greedy and errors -----------------------------------------------------------------------


def test_greedy_breaks_ties_towards_the_lowest_text_id() -> None:
    logits = torch.zeros(VOCAB_SIZE)
    logits[[ord("c"), ord("a"), ord("b")]] = 5.0
    assert greedy(logits) == ord("a")
    assert greedy(torch.zeros(VOCAB_SIZE)) == TEXT_IDS[0]


def test_greedy_chooses_only_text_ids() -> None:
    logits = torch.arange(VOCAB_SIZE, dtype=torch.float32)  # EOS has the largest logit
    assert greedy(logits) == 0x7E
    logits[[0, 0x0D, 0x7F, 0x80, 0xC3, 0xFF, BOS_ID]] = 1e9
    assert greedy(logits) == 0x7E
    logits[0x0A] = 1e9
    assert greedy(logits) == 0x0A


def test_greedy_rejects_bad_logits() -> None:
    with pytest.raises(ModelError, match="1-D"):
        greedy(torch.zeros(2, 3))
    with pytest.raises(ModelError, match="NaN"):
        greedy(torch.full((VOCAB_SIZE,), float("nan")))
    with pytest.raises(ModelError, match="ids 0..126"):
        greedy(torch.zeros(100))


def test_generated_text_is_valid_utf8_and_re_encodes_to_the_same_ids(
    model: TinyTransformer,
) -> None:
    tokenizer = ByteTokenizer()
    stream = model.generate(tokenizer.encode("Ünïcödé prompt, ".ljust(120, "\u00e9")), 64)
    assert set(stream) <= set(TEXT_IDS)
    text = tokenizer.decode(stream)
    assert tokenizer.encode(text)[1:] == stream


@pytest.mark.parametrize(
    ("tokens", "match"),
    [([], "empty"), ([1, -1], "outside"), ([258], "outside"), ([1.5], "ints"), ("ab", "ints")],
)
def test_bad_tokens_raise(model: TinyTransformer, tokens: object, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        model.prefill(tokens)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match=match):
        model.extend(tokens, None)  # type: ignore[arg-type]


def test_tokens_as_integer_tensor_are_accepted(model: TinyTransformer) -> None:
    prompt = ids(30, seed=13)
    assert torch.equal(model.prefill(torch.tensor(prompt))[1], model.prefill(prompt)[1])
    with pytest.raises(ModelError, match="integer tensor"):
        model.prefill(torch.tensor([1.0, 2.0]))


def test_bad_arguments_raise(model: TinyTransformer) -> None:
    past, _ = model.prefill([1, 2, 3])
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ModelError, match="chunk_size"):
            model.prefill_chunks([1, 2], None, bad)  # type: ignore[arg-type]
    with pytest.raises(ModelError, match="2 tokens but 1 pasts"):
        model.decode_batch([1, 2], [past])
    with pytest.raises(ModelError, match="KV or None"):
        model.extend([1], past.tensor)  # type: ignore[arg-type]
    with pytest.raises(KVError, match="does not fit"):
        model.decode_batch([1], [past.layer_slice(0, 1)])
    with pytest.raises(KVError, match="does not fit"):
        model.extend([1], TinyTransformer(ModelConfig(dtype="float64")).prefill([1])[0])
    with pytest.raises(ModelError, match="max_new_tokens"):
        model.generate([1], -1)
    with pytest.raises(ModelError, match="ModelConfig"):
        TinyTransformer({"n_layers": 2})  # type: ignore[arg-type]


def test_streams_depend_on_their_context(model: TinyTransformer) -> None:
    """A degenerate model forgets its prompt and loops; this one's streams of random word
    prompts neither repeat each other nor end in a short token cycle."""
    result = context_dependence(model, n_prompts=12, new_tokens=96, seed=1)
    assert result["cycling"] == 0
    assert result["distinct_streams"] == 12
