"""The tiny decoder-only transformer and the three operations the roles run on it.

- prefill (P): the KV of new prompt tokens on top of a cached prefix, chunk by chunk;
- decode (RLD, MD): one token for each of a batch of requests of different lengths;
- extend (MD after an Extend-Decode handoff): the KV and logits of k known tokens in one pass.

All three share one forward pass: projections and MLP are batched over every new token of every
request, attention runs per request over that request's past KV in place. Built from the
row-invariant primitives of `invariant.py` and `attention.py`, a token's logits and KV are
bit-identical whichever operation, chunking or batch computed them, so greedy streams agree
across P/RLD/MD exactly (see docs/model.md for the measurements).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator, Sequence

import torch

from pddemu.model.attention import causal_attention
from pddemu.model.config import ModelConfig
from pddemu.model.errors import ModelError
from pddemu.model.invariant import enable_determinism, linear, rms_norm, silu
from pddemu.model.kv import KV
from pddemu.model.rope import RotaryTable
from pddemu.model.weights import Weights, init_weights


def greedy(logits: torch.Tensor) -> int:
    """Index of the largest logit; ties go to the lowest id (torch.argmax returns the first)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 1:
        raise ModelError("greedy needs a 1-D logits tensor (one row of the logits)")
    if torch.isnan(logits).any():
        raise ModelError("greedy got NaN logits")
    return int(torch.argmax(logits))


class TinyTransformer:
    """Decoder-only transformer with RoPE and grouped-query attention, on CPU.

    Construction makes torch deterministic process-wide (one intra-op thread, deterministic
    algorithms): bit-exactness across operations depends on it, see `invariant.py`.
    """

    def __init__(self, config: ModelConfig | None = None) -> None:
        self.config = config if config is not None else ModelConfig()
        if not isinstance(self.config, ModelConfig):
            raise ModelError(f"config must be a ModelConfig, got {type(self.config).__name__}")
        enable_determinism()
        self.weights: Weights = init_weights(self.config)
        self._rope = RotaryTable(
            self.config.head_dim, self.config.rope_theta, self.config.torch_dtype
        )
        self._q_scale = 1.0 / math.sqrt(self.config.head_dim)

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

        Exactly `max_new_tokens` tokens (EOS is not special here; the caller decides lengths).
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
        hidden states [batch * new, d_model]."""
        self._check_threads()
        cfg, w = self.config, self.weights
        n_heads, kv_heads, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        batch, n_new = ids.shape
        rows = batch * n_new
        past_lens = torch.tensor([0 if p is None else len(p) for p in pasts])
        pos = (past_lens[:, None] + torch.arange(n_new)).reshape(rows)

        kv = torch.empty((cfg.n_layers, 2, kv_heads, rows, hd), dtype=cfg.torch_dtype)
        x = w.embedding[ids.reshape(rows)]
        for index, layer in enumerate(w.layers):
            qkv = linear(rms_norm(x, layer.attn_norm, cfg.norm_eps), layer.qkv)
            q, k, v = qkv.split([n_heads * hd, kv_heads * hd, kv_heads * hd], dim=1)
            q = self._rope.rotate(q.reshape(rows, n_heads, hd), pos) * self._q_scale
            kv[index, 0] = self._rope.rotate(k.reshape(rows, kv_heads, hd), pos).transpose(0, 1)
            kv[index, 1] = v.reshape(rows, kv_heads, hd).transpose(0, 1)
            attn = causal_attention(
                q.reshape(batch, n_new, n_heads, hd),
                [None if p is None else p.tensor[index] for p in pasts],
                kv[index].reshape(2, kv_heads, batch, n_new, hd).permute(2, 0, 1, 3, 4),
            )
            x = x + linear(attn.reshape(rows, n_heads * hd), layer.out)
            gate, up = linear(rms_norm(x, layer.mlp_norm, cfg.norm_eps), layer.gate_up).chunk(2, 1)
            x = x + linear(silu(gate) * up, layer.down)
        return kv, x

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        normed = rms_norm(hidden, self.weights.final_norm, self.config.norm_eps)
        return linear(normed, self.weights.lm_head)

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

    @staticmethod
    def _check_threads() -> None:
        if torch.get_num_threads() != 1:
            raise ModelError(
                f"torch uses {torch.get_num_threads()} threads; the model's outputs are only "
                "bit-identical across operations with 1 (set since model creation, then changed)"
            )
