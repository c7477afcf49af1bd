"""Long-input short-output requests: the rare traffic PDD's anomalous-traffic filter keeps off
the WAN (its KV would take longer to cross than the relay takes to finish the request).

PDD gives the output bound (under ~500 tokens) but not the input one; 32K modelled tokens, half
the default 64K agentic context, is this project's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

LISO_MAX_OUTPUT_TOKENS = 499
LISO_MIN_INPUT_TOKENS = 32_768


@dataclass(frozen=True)
class LongInputShortOutputRule:
    min_input_tokens: int = LISO_MIN_INPUT_TOKENS
    max_output_tokens: int = LISO_MAX_OUTPUT_TOKENS

    def applies(self, input_tokens: int, output_tokens: int) -> bool:
        return input_tokens >= self.min_input_tokens and output_tokens <= self.max_output_tokens


LISO_RULE = LongInputShortOutputRule()
