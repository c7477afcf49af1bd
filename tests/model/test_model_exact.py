"""Exact by construction: the product function, the tables, the weights, and the model under
reordered sums, other thread counts and other dtypes."""

from __future__ import annotations

import ast
import decimal
import hashlib
import math
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import pddemu.model
from pddemu.model import KV, ModelConfig, ModelError, TinyTransformer, exact, tables
from pddemu.model.attention import _softmax_weights

MODEL_DIR = Path(pddemu.model.__file__).parent

TABLES_DIGEST = "c5e55191ce668d1f79c177d89c23878a1831575aaa4300035baf035cf9bf32ae"
WEIGHTS_DIGEST = "1e2c750d87a7b6ba2d11326a7cfb6104e8ce5c65ccb754d154c926e3c8308088"


def integers(shape: tuple[int, ...], bound: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-bound, bound + 1, shape, generator=gen).to(dtype)


# ---- the product and the sum ------------------------------------------------------------------


@pytest.mark.parametrize("inner", [1, 100, 512, 516, 517, 1500, 4097])
@pytest.mark.parametrize("bounds", [(127, 126), (256, 127)])
def test_exact_matmul_equals_integer_arithmetic(inner: int, bounds: tuple[int, int]) -> None:
    a = integers((3, 5, inner), bounds[0], seed=inner)
    b = integers((3, inner, 7), bounds[1], seed=inner + 1)
    # Extreme operands: every term at its bound, the worst case for exactness.
    a[0, 0] = bounds[0]
    b[0, :, 0] = bounds[1]
    want = torch.matmul(a.long(), b.long())
    got = exact.exact_matmul(a, b, *bounds)
    assert got.dtype == (torch.float32 if inner * bounds[0] * bounds[1] < 2**24 else torch.float64)
    assert torch.equal(got.long(), want)
    assert torch.equal(exact.exact_matmul(a.double(), b.double(), *bounds).long(), want)


def test_exact_matmul_refuses_a_product_beyond_float64() -> None:
    a, b = torch.zeros(1, 2), torch.zeros(2, 1)
    with pytest.raises(ModelError, match="not exact"):
        exact.exact_matmul(a, b, 2**27, 2**26)


@pytest.mark.parametrize("inner", [10, 65535, 65537, 200000])
def test_exact_sum_equals_integer_arithmetic(inner: int) -> None:
    x = integers((2, inner), 256, seed=inner).abs()
    x[0] = 256
    assert torch.equal(exact.exact_sum(x, 256).long(), x.long().sum(dim=-1))


def test_requantize_scales_by_powers_of_two_rounds_ties_to_even_and_clamps() -> None:
    y = torch.tensor([256.0, 768.0, -256.0, 1000.0, 2**20, -(2**20)])
    assert exact.requantize(y, 9).tolist() == [0.0, 2.0, -0.0, 2.0, 127.0, -127.0]


def test_rms_quantize_is_the_same_from_float32_and_float64() -> None:
    x = integers((50, 128), 3000, seed=3)
    q = exact.rms_quantize(x, 362, 1e-5)
    assert torch.equal(q, exact.rms_quantize(x.double(), 362, 1e-5))
    assert float(q.abs().max()) <= exact.ACT_BOUND
    assert 28 < float(q.square().mean().sqrt()) < 33  # rms ~ 362 / sqrt(128) = 32


def test_softmax_weights_are_exact_integers_of_the_gap_to_the_row_best() -> None:
    best = 100_000.0
    gaps = [0, 63, 64, 1024, 2048, 4095, 4096, 50_000]  # score units: 1,024 per logit
    scores = torch.tensor([[best - g for g in gaps] + [-torch.inf]])
    weights = _softmax_weights(scores.clone(), scores.amax(dim=-1, keepdim=True))
    assert weights.tolist() == [[256, 256, 240, 81, 16, 0, 0, 0, 0]]
    for gap, weight in zip(gaps, weights[0].tolist(), strict=False):
        x = gap / 1024  # logits below the best
        assert abs(weight - 256 * max(0.0, 1 - x / 4) ** 4) <= 256 * 0.07


# ---- tables and weights: the same integers on every machine -----------------------------------


def _tables_digest() -> str:
    built = (
        tables.silu_table(4, 127),
        tables.cos_table(14, 14),
        tables.rotary_phase_steps(32, 10000.0, 40),
    )
    return hashlib.sha256(repr(built).encode()).hexdigest()


def _clear_table_caches() -> None:
    for build in (tables.silu_table, tables.cos_table, tables.rotary_phase_steps):
        build.cache_clear()


def test_tables_are_the_committed_integers_whatever_the_decimal_context() -> None:
    assert _tables_digest() == TABLES_DIGEST
    context = decimal.getcontext()
    saved = context.prec, context.rounding
    context.prec, context.rounding = 6, decimal.ROUND_FLOOR
    try:
        _clear_table_caches()
        assert _tables_digest() == TABLES_DIGEST
    finally:
        context.prec, context.rounding = saved


def test_tables_approximate_their_functions() -> None:
    """Within one unit of the functions (checked here with libm, which the model never uses)."""
    for g, value in zip(range(-127, 128), tables.silu_table(4, 127), strict=True):
        assert abs(value - 16 * (g / 16) / (1 + math.exp(-g / 16))) <= 0.5 + 1e-9
    cos = tables.cos_table(14, 14)
    for k in range(0, 2**14, 7):
        assert abs(cos[k] - 2**14 * math.cos(2 * math.pi * k / 2**14)) <= 0.5 + 1e-6
    steps = tables.rotary_phase_steps(32, 10000.0, 40)
    for i, step in enumerate(steps):
        assert abs(step - 10000.0 ** (-2 * i / 32) / (2 * math.pi) * 2**40) <= 0.5 + 1e-3


def test_weights_are_the_committed_integers_whatever_torch_rng_state() -> None:
    torch.manual_seed(12345)  # the weights must not come from torch's generator
    weights = TinyTransformer(ModelConfig()).weights
    tensors = [weights.embedding]
    for layer in weights.layers:
        tensors += [layer.qkv, layer.out, layer.gate_up, layer.down]
    tensors.append(weights.lm_head)
    digest = hashlib.sha256()
    for t in tensors:
        assert float(t.abs().max()) <= exact.WEIGHT_BOUND
        assert torch.equal(t, t.round())
        digest.update(t.numpy().astype("<f4").tobytes())
    assert digest.hexdigest() == WEIGHTS_DIGEST
    assert weights.n_parameters == 360_960


# ---- the whole model: every product reordered, operands checked -----------------------------


def _every_path(model: TinyTransformer) -> list[torch.Tensor]:
    """Logits and KV of a long prefill in chunks, a batched decode and an extend."""
    rng = random.Random(5)
    prompt = [rng.randrange(256) for _ in range(700)]
    kv, logits = model.prefill(prompt, chunk_size=300)
    other, _ = model.prefill(prompt[:40])
    step_kvs, step_logits = model.decode_batch([65, 66], [kv, other])
    ext_kv, ext_logits = model.extend([70, 71, 72], kv)
    kvs = [kv.tensor, step_kvs[0].tensor, step_kvs[1].tensor, ext_kv.tensor]
    return [*kvs, logits, step_logits, ext_logits]


def _route_through(monkeypatch: pytest.MonkeyPatch, name: str, wrapper: Callable) -> None:
    """Replace `exact.<name>` in every model module that imported it."""
    original = getattr(exact, name)
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("pddemu.model") and getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, wrapper)


@pytest.fixture(scope="module")
def unpatched() -> list[torch.Tensor]:
    return _every_path(TinyTransformer(ModelConfig()))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_permuting_every_inner_dimension_changes_no_bit(
    monkeypatch: pytest.MonkeyPatch, unpatched: list[torch.Tensor], seed: int
) -> None:
    """Each product and sum of the model adds its terms in another order (the inner dimension
    shuffled the same way in both operands: the same terms): each result, and so the model's
    outputs, must be the same bits."""
    gen = torch.Generator().manual_seed(seed)
    differing = {"matmul": 0, "sum": 0}
    calls = {"matmul": 0, "sum": 0}
    matmul, total = exact.exact_matmul, exact.exact_sum

    def shuffled_matmul(a, b, a_bound, b_bound, out=None):
        order = torch.randperm(a.shape[-1], generator=gen)
        got = matmul(a[..., order], b[..., order, :], a_bound, b_bound, out=out)
        calls["matmul"] += 1
        differing["matmul"] += not torch.equal(got, matmul(a, b, a_bound, b_bound))
        return got

    def shuffled_sum(x, bound):
        got = total(x[..., torch.randperm(x.shape[-1], generator=gen)], bound)
        calls["sum"] += 1
        differing["sum"] += not torch.equal(got, total(x, bound))
        return got

    _route_through(monkeypatch, "exact_matmul", shuffled_matmul)
    _route_through(monkeypatch, "exact_sum", shuffled_sum)
    got = _every_path(TinyTransformer(ModelConfig()))
    assert calls["matmul"] > 100 and calls["sum"] > 10
    assert differing == {"matmul": 0, "sum": 0}
    for a, b in zip(got, unpatched, strict=True):
        assert torch.equal(a, b)


def test_every_product_operand_is_an_integer_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked = []
    matmul = exact.exact_matmul

    def checking(a, b, a_bound, b_bound, out=None):
        for x, bound in ((a, a_bound), (b, b_bound)):
            assert torch.equal(x, x.round()), "a product operand is not integer-valued"
            assert float(x.abs().max()) <= bound, f"a product operand exceeds {bound}"
        checked.append((a_bound, b_bound))
        return matmul(a, b, a_bound, b_bound, out=out)

    _route_through(monkeypatch, "exact_matmul", checking)
    _every_path(TinyTransformer(ModelConfig()))
    assert {(127, 126), (127, 127), (256, 127)} <= set(checked)
    assert max(max(bounds) for bounds in checked) <= 256  # exact even in bfloat16


# ---- what no longer matters: threads, dtype ---------------------------------------------------


def test_thread_count_changes_no_bit(unpatched: list[torch.Tensor]) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = _every_path(TinyTransformer(ModelConfig()))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(got, unpatched, strict=True):
        assert torch.equal(a, b)


def test_float64_model_computes_the_same_values(unpatched: list[torch.Tensor]) -> None:
    got = _every_path(TinyTransformer(ModelConfig(dtype="float64")))
    for a, b in zip(got, unpatched, strict=True):
        assert a.dtype == torch.float64
        assert torch.equal(a, b.double())


def test_lowered_matmul_precision_is_refused() -> None:
    model = TinyTransformer(ModelConfig())
    torch.set_float32_matmul_precision("medium")
    try:
        with pytest.raises(ModelError, match="precision"):
            model.prefill([1, 2, 3])
    finally:
        exact.require_ieee_matmul()
    model.prefill([1, 2, 3])


# ---- nothing in the model computes outside the exact rules ------------------------------------

# Calls whose results may differ by CPU or kernel: library products outside exact_matmul, libm
# functions, fused operations.
FORBIDDEN_CALLS = {
    "addbmm", "addcdiv", "addcmul", "addmm", "addmv", "baddbmm", "bmm", "cos", "cosh", "dot",
    "einsum", "erf", "exp", "exp2", "expm1", "gelu", "layer_norm", "lerp", "linear", "log",
    "log1p", "log2", "log_softmax", "matmul", "mm", "mv", "pow", "rms_norm", "rsqrt",
    "scaled_dot_product_attention", "sigmoid", "silu", "sin", "sinh", "softmax", "tan", "tanh",
    "tensordot",
}  # fmt: skip


def _model_sources() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(MODEL_DIR.glob("*.py")):
        yield path.name, ast.parse(path.read_text())


def test_model_code_uses_only_exact_operations() -> None:
    found = []
    for name, tree in _model_sources():
        if name == "tables.py":  # decimal and integer arithmetic only: checked below
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                allowed = name == "exact.py" and node.func.attr == "matmul"
                if node.func.attr in FORBIDDEN_CALLS and not allowed:
                    found.append(f"{name}:{node.lineno} {node.func.attr}")
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                found.append(f"{name}:{node.lineno} @")
            if isinstance(node, ast.keyword) and node.arg == "alpha":
                found.append(f"{name}:{node.lineno} alpha=")
    assert not found, found


def test_tables_use_no_float_library() -> None:
    imported = set()
    for node in ast.walk(dict(_model_sources())["tables.py"]):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert imported <= {"__future__", "functools", "decimal"}, imported


def test_no_past_is_modified_and_kv_holds_integers() -> None:
    model = TinyTransformer(ModelConfig())
    past, _ = model.prefill(list(range(200)))
    before = past.tensor.clone()
    new, _ = model.extend([1, 2, 3], past)
    assert torch.equal(past.tensor, before)
    for kv in (past, new):
        assert isinstance(kv, KV)
        assert torch.equal(kv.tensor, kv.tensor.round())
        assert float(kv.tensor.abs().max()) <= exact.ACT_BOUND


def test_a_configuration_too_large_for_exact_sums_is_refused() -> None:
    with pytest.raises(ModelError, match="too large"):
        TinyTransformer(ModelConfig(n_layers=200))
