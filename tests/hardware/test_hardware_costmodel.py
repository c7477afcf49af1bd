"""Cost model: hand-computed step times on a made-up profile, monotonicity, the tail-chunk
effect, and the shipped chips' strengths."""

from __future__ import annotations

import pytest

from pddemu.hardware import (
    ChipProfile,
    CostModel,
    InstanceError,
    InstanceHardware,
    StepError,
    TargetModel,
    load_chip,
    load_target,
)

# Made-up numbers chosen so every term is easy to compute by hand. With 2 chips at 50 %:
# 1e12 FLOP/s, 1e11 B/s of memory, 5e9 B/s of interconnect per chip, 16e9 B usable memory.
TOY_CHIP = ChipProfile(
    name="toy",
    peak_flops=1e12,
    memory_bytes=10e9,
    memory_bw=1e11,
    interconnect_bw=1e10,
    host_bw=2e10,
    price_per_hour=2.0,
    source="made up for tests",
)
# 2e9 linear FLOPs per token, 4 * 2 * 1000 = 8000 attention FLOPs per (query, key) pair,
# 8e9 B of weights, 1000 B of KV per token, 2 * 2 * 1000 * 2 B * 2 * (2-1)/2 = 8000 B of
# all-reduce traffic per token and chip.
TOY_TARGET = TargetModel(
    name="toy-model",
    total_params=4e9,
    active_params=1e9,
    n_layers=2,
    hidden_size=1000,
    kv_bytes_per_token=1000,
    weight_bytes_per_param=2.0,
    source="made up for tests",
)
TOY_INSTANCE = InstanceHardware(
    chip=TOY_CHIP,
    chips=2,
    compute_efficiency=0.5,
    memory_efficiency=0.5,
    step_overhead_s=0.001,
    interconnect_efficiency=0.5,
    memory_utilization=0.8,
)


def toy(**changes: object) -> CostModel:
    settings: dict[str, object] = {"prefill_chunk_tokens": 512, "pad_chunks": True}
    settings.update(changes)
    return CostModel(TOY_INSTANCE, TOY_TARGET, **settings)  # type: ignore[arg-type]


def shipped(chip: str, **changes: object) -> CostModel:
    return CostModel(InstanceHardware(load_chip(chip)), load_target("agentic-50kb"), **changes)  # type: ignore[arg-type]


def test_decode_step_by_hand() -> None:
    # 2 tokens, pairs (1000 + 1) + (3000 + 1) = 4002, context read 4000.
    # compute 2 * 2e9 + 8000 * 4002 = 4.032016e9 FLOPs -> 4.032016 ms
    # memory 8e9 + 1000 * (4000 + 2) = 8.004002e9 B -> 80.04002 ms (the bound)
    # interconnect 2 * 8000 B -> 3.2 us
    model = toy()
    terms = model.explain([(1, 1000), (1, 3000)])
    assert terms.compute_s == pytest.approx(4.032016e-3)
    assert terms.memory_s == pytest.approx(0.08004002)
    assert terms.interconnect_s == pytest.approx(3.2e-6)
    assert terms.bound == "memory"
    assert model.decode_step([1000, 3000]) == pytest.approx(0.08104002)


def test_padded_prefill_step_by_hand() -> None:
    # A 100-token chunk is costed as a 512-token slot: pairs 512 * 513 / 2 = 131328.
    # compute 512 * 2e9 + 8000 * 131328 = 1.025050624e12 FLOPs -> 1.025050624 s (the bound)
    model = toy()
    assert model.prefill_step([(100, 0)]) == pytest.approx(1.025050624 + 0.001)
    assert model.prefill_step([(100, 0)]) == model.prefill_step([(512, 0)])


def test_unpadded_prefill_step_by_hand() -> None:
    # 100 tokens, pairs 100 * 2000 + 100 * 101 / 2 = 205050.
    # compute 2e11 + 8000 * 205050 = 2.016404e11 FLOPs -> 0.2016404 s
    # memory 8e9 + 1000 * (2000 + 100) -> 0.080021 s
    model = toy(pad_chunks=False)
    assert model.prefill_step([(100, 2000)]) == pytest.approx(0.2016404 + 0.001)


def test_batched_prefill_step_by_hand() -> None:
    # Two padded slots: 1024 tokens; pairs 2 * 131328 + 512 * 1000 = 774656; the weights are
    # read once for the step, not once per chunk.
    # compute 1024 * 2e9 + 8000 * 774656 = 2.054197248e12 -> 2.054197248 s
    model = toy()
    assert model.prefill_step([(512, 0), (7, 1000)]) == pytest.approx(2.054197248 + 0.001)


def test_extend_step_by_hand() -> None:
    # 10 tokens on 5000: pairs 10 * 5000 + 55 = 50055.
    # compute 2e10 + 8000 * 50055 = 2.040044e10 -> 20.40044 ms
    # memory 8e9 + 1000 * (5000 + 10) = 8.00501e9 -> 80.0501 ms (the bound)
    model = toy()
    assert model.extend_step(10, 5000) == pytest.approx(0.0800501 + 0.001)
    assert model.extend_step(10, 5000) == model.forward_step([(10, 5000)])


def test_interconnect_can_bound_a_step() -> None:
    slow_links = ChipProfile(
        name="slow-links",
        peak_flops=1e12,
        memory_bytes=10e9,
        memory_bw=1e11,
        interconnect_bw=1e3,
        host_bw=1e3,
        price_per_hour=1.0,
        source="made up",
    )
    instance = InstanceHardware(slow_links, chips=2, interconnect_efficiency=0.5)
    model = CostModel(instance, TOY_TARGET, prefill_chunk_tokens=512)
    terms = model.explain([(1, 0)])
    assert terms.bound == "interconnect"
    assert terms.interconnect_s == pytest.approx(8000 / 500)


def test_one_chip_has_no_tensor_parallel_traffic() -> None:
    instance = InstanceHardware(TOY_CHIP, chips=1, memory_utilization=1.0)
    model = CostModel(instance, TOY_TARGET, prefill_chunk_tokens=512)
    assert model.explain([(512, 0)]).interconnect_s == 0.0


def test_mixed_step_is_one_forward_pass() -> None:
    model = toy()
    mixed = model.forward_step([(1, 3000), (1, 4000), (20, 5000)])
    separate = model.decode_step([3000, 4000]) + model.extend_step(20, 5000)
    assert model.decode_step([3000, 4000]) < mixed < separate


def test_kv_capacity_and_price() -> None:
    model = toy()
    assert model.kv_capacity_tokens() == (16e9 - 8e9) // 1000
    assert model.price_per_hour == pytest.approx(4.0)


def test_weights_that_do_not_fit_are_refused() -> None:
    instance = InstanceHardware(TOY_CHIP, chips=1, memory_utilization=0.5)  # 5 GB < 8 GB
    with pytest.raises(InstanceError, match="no room for KV"):
        CostModel(instance, TOY_TARGET)


def test_more_context_is_slower() -> None:
    model = toy(pad_chunks=False)
    contexts = [0, 1000, 10_000, 100_000, 1_000_000]
    decode = [model.decode_step([c] * 4) for c in contexts]
    prefill = [model.prefill_step([(256, c)]) for c in contexts]
    extend = [model.extend_step(8, c) for c in contexts]
    for series in (decode, prefill, extend):
        assert series == sorted(series) and len(set(series)) == len(series)


def test_bigger_batch_is_slower_per_step_but_faster_per_token() -> None:
    for model in (toy(), shipped("gpu-a"), shipped("gpu-b")):
        batches = [1, 2, 4, 8, 16, 32, 64, 128]
        steps = [model.decode_step([65536] * b) for b in batches]
        rates = [b / s for b, s in zip(batches, steps, strict=True)]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        assert rates == sorted(rates) and len(set(rates)) == len(rates)


def prefill_throughput(model: CostModel, new_tokens: int) -> float:
    """Tokens/s of one request's prefill run chunk by chunk, one chunk per step."""
    steps = model.chunks_for(new_tokens, 0)
    return new_tokens / sum(model.prefill_step([chunk]) for chunk in steps)


@pytest.mark.parametrize("chip", ["gpu-a", "gpu-b"])
def test_small_tail_chunk_drops_prefill_throughput(chip: str) -> None:
    padded = shipped(chip)
    unpadded = shipped(chip, pad_chunks=False)
    size = padded.prefill_chunk_tokens
    for full in (1, 2, 3):
        boundary = full * size
        # With static slots a 1-token tail costs a whole chunk: throughput falls by ~1/(full+1).
        drop = prefill_throughput(padded, boundary + 1) / prefill_throughput(padded, boundary)
        assert drop < 1 - 0.8 / (full + 1)
        # Without padding the tail costs only its own tokens plus one read of the weights.
        gentle = prefill_throughput(unpadded, boundary + 1) / prefill_throughput(unpadded, boundary)
        assert gentle > drop + 0.15
        # Within a padded chunk, throughput climbs back as the tail fills its slot.
        climbing = [
            prefill_throughput(padded, boundary + t) for t in (1, size // 4, size // 2, size)
        ]
        assert climbing == sorted(climbing)


def test_chunks_for_splits_in_order() -> None:
    model = toy()
    assert model.chunks_for(1100, 50) == [(512, 50), (512, 562), (76, 1074)]
    assert model.chunks_for(512, 0) == [(512, 0)]
    assert model.chunks_for(1, 7) == [(1, 7)]


def expected_weight_bytes(tokens: int) -> float:
    """The shipped target's weights read by a step of `tokens` tokens, written out by hand:
    17.07 B always-active parameters plus, in each of 58 layers, the distinct experts of 256
    that `tokens` tokens picking 8 each touch, 44 040 192 parameters each, 1 byte per parameter."""
    routed = 58 * 256 * 44_040_192
    touched = 256 * (1 - (1 - 8 / 256) ** tokens)
    return (671e9 - routed) + 58 * touched * 44_040_192


@pytest.mark.parametrize("chip", ["gpu-a", "gpu-b"])
@pytest.mark.parametrize("batch", [1, 128])
def test_decode_cost_follows_the_expert_touch_formula(chip: str, batch: int) -> None:
    model = shipped(chip)
    context = 8192
    terms = model.explain([(1, context)] * batch)
    kv = 51200 * (batch * context + batch)
    bandwidth = model.instance.achievable_memory_bw
    assert terms.memory_s == pytest.approx((expected_weight_bytes(batch) + kv) / bandwidth)
    assert terms.bound == "memory"
    assert model.decode_step([context] * batch) == pytest.approx(terms.memory_s + 0.005)


def test_batch_1_reads_a_twentieth_of_the_experts_and_batch_128_nearly_all() -> None:
    target = load_target("agentic-50kb")
    assert target.experts_touched(1) == pytest.approx(8)
    assert target.experts_touched(128) == pytest.approx(256 * (1 - (248 / 256) ** 128))
    assert target.weight_bytes_read(1) == pytest.approx(37.5e9, rel=0.01)  # the active weights
    assert 0.98 < target.weight_bytes_read(128) / target.weight_bytes < 0.99


def test_a_dense_target_reads_all_its_weights_at_any_batch() -> None:
    assert TOY_TARGET.weight_bytes_read(1) == TOY_TARGET.weight_bytes_read(10_000) == 8e9


@pytest.mark.parametrize("chip", ["gpu-a", "gpu-b"])
@pytest.mark.parametrize("k", [1, 4, 16, 100])
def test_an_extend_reads_the_experts_its_tokens_touch(chip: str, k: int) -> None:
    model = shipped(chip)
    terms = model.explain([(k, 65536)])
    kv = 51200 * (65536 + k)
    assert terms.memory_s == pytest.approx(
        (expected_weight_bytes(k) + kv) / model.instance.achievable_memory_bw
    )
    if k == 1:
        assert model.extend_step(1, 65536) == pytest.approx(model.decode_step([65536]))


def test_toy_extend_costs_about_one_decode_step() -> None:
    model = toy()
    assert model.extend_step(8, 5000) <= 1.03 * model.decode_step([5000])


def test_kv_copy_is_the_bytes_over_the_host_links_plus_one_overhead() -> None:
    # 100 tokens x 1000 B over 2 chips x 2e10 B/s x 0.5 = 2e10 B/s: 5 us, plus 1 ms.
    assert toy().kv_copy(100) == pytest.approx(0.001 + 1e5 / 2e10)


def test_shipped_chips_have_their_strengths() -> None:
    a, b = shipped("gpu-a"), shipped("gpu-b")
    for context in (0, 32768, 57344):
        assert a.prefill_step([(8192, context)]) < b.prefill_step([(8192, context)])
    for batch in (1, 8, 32, 64):
        assert b.decode_step([65536] * batch) < a.decode_step([65536] * batch)
    assert b.kv_capacity_tokens() > a.kv_capacity_tokens()
    assert 1.2 <= b.price_per_hour / a.price_per_hour <= 1.3


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.decode_step([]), "at least one request"),
        (lambda m: m.decode_step([100, -1]), "decode context"),
        (lambda m: m.decode_step([1.5]), "decode context"),
        (lambda m: m.decode_step([True]), "decode context"),
        (lambda m: m.prefill_step([]), "at least one chunk"),
        (lambda m: m.prefill_step([(513, 0)]), "at most 512 new tokens"),
        (lambda m: m.prefill_step([(0, 0)]), "new tokens"),
        (lambda m: m.prefill_step([(10, -5)]), "context"),
        (lambda m: m.prefill_step([(10,)]), "pair"),
        (lambda m: m.prefill_step([5]), "pair"),
        (lambda m: m.forward_step([]), "at least one"),
        (lambda m: m.extend_step(0, 10), "extend tokens k"),
        (lambda m: m.extend_step(5, -1), "extend context"),
        (lambda m: m.chunks_for(0, 0), "new_tokens"),
        (lambda m: m.chunks_for(10, -1), "context"),
        (lambda m: m.kv_copy(0), "copied tokens"),
    ],
)
def test_bad_steps_are_refused(call: object, message: str) -> None:
    with pytest.raises(StepError, match=message):
        call(toy())  # type: ignore[operator]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"chips": 0}, "chips"),
        ({"chips": 2.0}, "chips"),
        ({"compute_efficiency": 0}, "compute_efficiency"),
        ({"compute_efficiency": 1.5}, "compute_efficiency"),
        ({"memory_efficiency": float("nan")}, "memory_efficiency"),
        ({"interconnect_efficiency": -0.1}, "interconnect_efficiency"),
        ({"memory_utilization": True}, "memory_utilization"),
        ({"step_overhead_s": -0.001}, "step_overhead_s"),
        ({"step_overhead_s": float("inf")}, "step_overhead_s"),
        ({"step_overhead_s": "5ms"}, "step_overhead_s"),
        ({"chip": "gpu-a"}, "ChipProfile"),
    ],
)
def test_bad_instances_are_refused(changes: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"chip": TOY_CHIP}
    settings.update(changes)
    with pytest.raises(InstanceError, match=message):
        InstanceHardware(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"prefill_chunk_tokens": 0}, "prefill_chunk_tokens"),
        ({"pad_chunks": 1}, "pad_chunks"),
        ({"target": "agentic-50kb"}, "TargetModel"),
        ({"instance": TOY_CHIP}, "InstanceHardware"),
    ],
)
def test_bad_cost_models_are_refused(changes: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"instance": TOY_INSTANCE, "target": TOY_TARGET}
    settings.update(changes)
    with pytest.raises(InstanceError, match=message):
        CostModel(**settings)  # type: ignore[arg-type]
