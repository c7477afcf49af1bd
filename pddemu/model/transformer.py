"""The tiny decoder-only transformer and the three operations the roles run on it.

- prefill (P): the KV of new prompt tokens on top of a cached prefix, chunk by chunk;
- decode (RLD, MD): one token for each of a batch of requests of different lengths;
- extend (MD after an Extend-Decode handoff): the KV and logits of k known tokens in one pass.

All three share one forward pass: projections and MLP are batched over every new token of every
request, attention runs per request over that request's past KV in place. The arithmetic is
integer-valued and exact (`exact.py`), so a token's logits and KV are the same bits whichever
operation, chunking, batch, CPU or thread count computed them, and greedy streams agree across
P/RLD/MD exactly (docs/model.md).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence

import torch

from pddemu.model.attention import causal_attention
from pddemu.model.config import ModelConfig
from pddemu.model.errors import ModelError
from pddemu.model.exact import (
    ACT_BOUND,
    EXACT_LIMIT,
    WEIGHT_BOUND,
    check_ieee_matmul,
    exact_matmul,
    requantize,
    require_ieee_matmul,
    rms_quantize,
)
from pddemu.model.kv import KV
from pddemu.model.rope import RotaryTable
from pddemu.model.tables import silu_table
from pddemu.model.tokenizer import TEXT_IDS
from pddemu.model.weights import WEIGHT_VARIANCE, Weights, init_weights

# Normalised activations have rms NORM_RMS (|x| <= ACT_BOUND, so clamping starts near 4 sigma).
NORM_RMS = 32
# The MLP gate is read in units of 2**-SILU_FRAC_BITS (SiLU's input range +-7.9).
SILU_FRAC_BITS = 4
# SiLU(gate) * up (both activations) is scaled down by 2**MLP_PRODUCT_SHIFT to an activation.
MLP_PRODUCT_SHIFT = 4
# Residual-stream updates are clamped to this (never reached at the default sizes): the
# stream's squares then sum exactly in float64 for any configuration.
RESIDUAL_BOUND = 2**15

_TEXT_IDS = torch.tensor(TEXT_IDS)
_BOUNDS = (ACT_BOUND, WEIGHT_BOUND)  # of every product of activations and weights


def greedy(logits: torch.Tensor) -> int:
    """The text id with the largest logit; ties go to the lowest id.

    Only ids in `tokenizer.TEXT_IDS` are chosen (tab, newline, printable ASCII): every
    generated id is valid UTF-8 text on its own, so clients that re-tokenize the text count
    exactly the tokens generated.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1:
        raise ModelError("greedy needs a 1-D logits tensor (one row of the logits)")
    if len(logits) <= TEXT_IDS[-1]:
        raise ModelError(f"greedy needs logits for ids 0..{TEXT_IDS[-1]}, got {len(logits)}")
    if torch.isnan(logits).any():
        raise ModelError("greedy got NaN logits")
    # TEXT_IDS ascend and argmax returns the first maximum: ties go to the lowest id.
    return int(_TEXT_IDS[torch.argmax(logits[_TEXT_IDS])])


def output_shift(fan_in: int) -> int:
    """Power-of-two scale that maps a product over `fan_in` terms back to activation size.

    Its output has standard deviation ~ NORM_RMS * sqrt(fan_in * WEIGHT_VARIANCE); dividing
    by 2**shift with shift ~ log2(sqrt(fan_in * WEIGHT_VARIANCE)) keeps it near NORM_RMS.
    """
    return (fan_in * WEIGHT_VARIANCE).bit_length() // 2


class TinyTransformer:
    """Decoder-only transformer with RoPE and grouped-query attention, on CPU, in exact
    integer-valued arithmetic.

    Construction holds float32 matmul precision at full IEEE, process-wide (`exact.py`); every
    forward pass checks it is still so.
    """

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config if config is not None else ModelConfig()
        if not isinstance(self.config, ModelConfig):
            raise ModelError(f"config must be a ModelConfig, got {type(self.config).__name__}")
        cfg = self.config
        residual_bound = WEIGHT_BOUND + 2 * cfg.n_layers * RESIDUAL_BOUND
        if cfg.d_model * residual_bound**2 >= EXACT_LIMIT[torch.float64]:
            raise ModelError(
                f"n_layers {cfg.n_layers} x d_model {cfg.d_model} is too large: the residual "
                "stream's sum of squares would not be exact in float64"
            )
        require_ieee_matmul()
        self.weights: Weights = init_weights(cfg)
        self._rope = RotaryTable(cfg.head_dim, cfg.rope_theta, cfg.torch_dtype)
        self._silu = torch.tensor(silu_table(SILU_FRAC_BITS, ACT_BOUND), dtype=cfg.torch_dtype)
        self._norm_gain = math.isqrt(NORM_RMS**2 * cfg.d_model)
        self._model_shift = output_shift(cfg.d_model)
        self._attn_shift = output_shift(cfg.n_heads * cfg.head_dim)
        self._ff_shift = output_shift(cfg.d_ff)

    # ---- public operations -------------------------------------------------------------

    def prefill_chunks(
        self, tokens: Sequence[int], past: KV | None = None, chunk_size: int = 512
    ) -> Iterator[tuple[KV, torch.Tensor]]:
        """Prefill `tokens` after `past`, `chunk_size` tokens per forward pass.

        Yields, per chunk, the chunk's KV and the logits [vocab] of its last token, as soon as
        the chunk is computed (the prefill role streams each chunk to the wire).
        """
        ids = self._token_ids(tokens, "prefill tokens")
        self._check_past(past)
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ModelError(f"chunk_size must be a positive int, got {chunk_size!r}")
        return self._prefill_chunks(ids, past, chunk_size)

    def prefill(
        self, tokens: Sequence[int], past: KV | None = None, chunk_size: int = 512
    ) -> tuple[KV, torch.Tensor]:
        """KV of all of `tokens` (after `past`) and the logits [vocab] of the last one."""
        chunks = list(self.prefill_chunks(tokens, past, chunk_size))
        kv = chunks[0][0] if len(chunks) == 1 else KV.concat([c[0] for c in chunks])
        return kv, chunks[-1][1]

    @torch.inference_mode()
    def decode_batch(
        self, tokens: Sequence[int], pasts: Sequence[KV]
    ) -> tuple[list[KV], torch.Tensor]:
        """One decode step for a batch: request i adds token tokens[i] after pasts[i].

        Returns each request's 1-token KV (the caller appends it to its KV) and the logits
        [batch, vocab] of the added tokens. Pasts may have any lengths; they are read in place.
        """
        ids = self._token_ids(tokens, "decode tokens")
        if len(pasts) != len(ids):
            raise ModelError(f"decode_batch got {len(ids)} tokens but {len(pasts)} pasts")
        for past in pasts:
            self._check_past(past)
        kv, hidden = self._forward(ids.view(-1, 1), pasts)
        logits = self._logits(hidden)
        return [KV(kv.narrow(3, i, 1)) for i in range(len(ids))], logits

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], past: KV | None) -> tuple[KV, torch.Tensor]:
        """KV of k known tokens after `past` and the logits [k, vocab] of each, in one pass.

        logits[i] predicts the token after tokens[i]: what k decode steps fed with these tokens
        would have produced, bit for bit.
        """
        ids = self._token_ids(tokens, "extend tokens")
        self._check_past(past)
        kv, hidden = self._forward(ids.view(1, -1), [past])
        return KV(kv), self._logits(hidden)

    def generate(
        self, prompt_ids: Sequence[int], max_new_tokens: int, chunk_size: int = 512
    ) -> list[int]:
        """Greedy continuation of `prompt_ids` in one process: the reference token stream.

        Exactly `max_new_tokens` tokens (greedy never chooses EOS; the caller decides lengths).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ModelError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
        if max_new_tokens < 0:
            raise ModelError(f"max_new_tokens must be non-negative, got {max_new_tokens}")
        prompt_kv, logits = self.prefill(prompt_ids, None, chunk_size)
        if max_new_tokens == 0:
            return []
        context = KV.empty(self.config, capacity=len(prompt_kv) + max_new_tokens)
        context.append(prompt_kv)
        out = [greedy(logits)]
        while len(out) < max_new_tokens:
            (step_kv,), step_logits = self.decode_batch([out[-1]], [context])
            context.append(step_kv)
            out.append(greedy(step_logits[0]))
        return out

    # ---- internals ---------------------------------------------------------------------

    def _prefill_chunks(
        self, ids: torch.Tensor, past: KV | None, chunk_size: int
    ) -> Iterator[tuple[KV, torch.Tensor]]:
        context = past
        owns_context = False
        for start in range(0, len(ids), chunk_size):
            chunk = ids[start : start + chunk_size]
            with torch.inference_mode():
                kv_tensor, hidden = self._forward(chunk.view(1, -1), [context])
                logits = self._logits(hidden[-1:])[0]
            kv = KV(kv_tensor)
            if start + chunk_size < len(ids):
                if not owns_context:
                    # Later chunks attend to earlier ones: one buffer, copied into once.
                    past_len = 0 if context is None else len(context)
                    grown = KV.empty(self.config, capacity=past_len + len(ids))
                    if context is not None:
                        grown.append(context)
                    context, owns_context = grown, True
                context.append(kv)
            yield kv, logits

    def _forward(
        self, ids: torch.Tensor, pasts: Sequence[KV | None]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """New tokens ids [batch, new] after pasts[i] -> their KV [layers, 2, kv_heads,
        batch * new, head_dim] (requests one after the other along the token axis) and final
        residual stream [batch * new, d_model] (float64 integers)."""
        check_ieee_matmul()
        cfg, w = self.config, self.weights
        dtype = cfg.torch_dtype
        n_heads, kv_heads, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        batch, n_new = ids.shape
        rows = batch * n_new
        past_lens = torch.tensor([0 if p is None else len(p) for p in pasts])
        pos = (past_lens[:, None] + torch.arange(n_new)).reshape(rows)

        kv = torch.empty((cfg.n_layers, 2, kv_heads, rows, hd), dtype=dtype)
        x = w.embedding[ids.reshape(rows)].to(torch.float64)
        for index, layer in enumerate(w.layers):
            qkv = requantize(self._product(x, layer.qkv), self._model_shift)
            q, k, v = qkv.split([n_heads * hd, kv_heads * hd, kv_heads * hd], dim=1)
            q = self._rope.rotate(q.reshape(rows, n_heads, hd), pos)
            kv[index, 0] = self._rope.rotate(k.reshape(rows, kv_heads, hd), pos).transpose(0, 1)
            kv[index, 1] = v.reshape(rows, kv_heads, hd).transpose(0, 1)
            attn = causal_attention(
                q.reshape(batch, n_new, n_heads, hd),
                [None if p is None else p.tensor[index] for p in pasts],
                kv[index].reshape(2, kv_heads, batch, n_new, hd).permute(2, 0, 1, 3, 4),
            )
            attn_out = exact_matmul(attn.reshape(rows, n_heads * hd), layer.out, *_BOUNDS)
            x = x + requantize(attn_out, self._attn_shift, RESIDUAL_BOUND)
            gate, up = self._product(x, layer.gate_up).chunk(2, 1)
            gate = requantize(gate, self._model_shift).long() + ACT_BOUND
            hidden = requantize(
                self._silu[gate] * requantize(up, self._model_shift), MLP_PRODUCT_SHIFT
            )
            down = exact_matmul(hidden, layer.down, *_BOUNDS)
            x = x + requantize(down, self._ff_shift, RESIDUAL_BOUND)
        return kv, x

    def _product(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMS-normalised residual stream x times a weight matrix (exact integers)."""
        normed = rms_quantize(x, self._norm_gain, self.config.norm_eps)
        return exact_matmul(normed.to(self.config.torch_dtype), weight, *_BOUNDS)

    def _logits(self, residual: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab]: exact integers, in the model's dtype."""
        return self._product(residual, self.weights.lm_head).to(self.config.torch_dtype)

    def _token_ids(self, tokens: Sequence[int], what: str) -> torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() != 1 or tokens.is_floating_point() or tokens.is_complex():
                raise ModelError(f"{what} must be a 1-D integer tensor or a sequence of ints")
            ids = tokens.to(torch.long)
        else:
            try:
                ids = torch.tensor([operator.index(t) for t in tokens], dtype=torch.long)
            except TypeError:
                raise ModelError(f"{what} must be a sequence of ints, got {tokens!r:.80}") from None
        if len(ids) == 0:
            raise ModelError(f"{what} must not be empty")
        bad = (ids < 0) | (ids >= self.config.vocab_size)
        if bad.any():
            raise ModelError(
                f"{what}: id {int(ids[bad][0])} is outside [0, {self.config.vocab_size})"
            )
        return ids

    def _check_past(self, past: KV | None) -> None:
        if past is None:
            return
        if not isinstance(past, KV):
            raise ModelError(f"past must be a KV or None, got {type(past).__name__}")
        past.check_fits(self.config)
