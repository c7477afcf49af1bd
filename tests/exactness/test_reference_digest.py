"""The reference token streams (and their logits) of a fixed set are the committed ones: the
same tokens on every machine (docs/model.md)."""

from __future__ import annotations

from pddemu.model import TEXT_IDS, ModelConfig
from pddemu.reference import (
    DIGEST_REQUESTS,
    DIGEST_TOKENS,
    REFERENCE_DIGEST,
    digest_requests,
    reference_digest,
    reference_outputs,
)


def test_reference_streams_of_the_fixed_set_have_the_committed_digest() -> None:
    requests = digest_requests()
    assert len(requests) == DIGEST_REQUESTS
    assert reference_digest(requests, ModelConfig(), 256) == REFERENCE_DIGEST
    # The same streams through the function the emulator checks against; all text ids.
    few = reference_outputs(requests[:3], ModelConfig(), 256)
    assert all(len(s) == DIGEST_TOKENS and set(s) <= set(TEXT_IDS) for s in few.values())
