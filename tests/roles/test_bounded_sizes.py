"""Every size a peer or a client sends is bounded before anything is allocated for it, fuzzed:
a message's attachment count on the data plane, and a request's lengths at the frontend."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pddemu.runtime.channel import MAX_ATTACHMENTS, Channel
from pddemu.wire import BadControl, Control, TokenIds, encode
from tests.roles.in_process import frontend

pytestmark = pytest.mark.timeout(120)
FUZZ = settings(max_examples=200, deadline=timedelta(milliseconds=1000))


class _Writer:
    def get_extra_info(self, _name: str) -> None:
        return None


def frames(*messages: Any) -> bytes:
    return b"".join(bytes(b) for m in messages for b in encode(m))


async def receive(data: bytes) -> Any:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    channel = Channel(reader, _Writer(), "peer", "test")  # type: ignore[arg-type]
    return await channel.receive()


attach_values = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63),
    st.booleans(),
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False),
    st.none(),
)


@FUZZ
@given(attach=attach_values, sent=st.integers(min_value=0, max_value=3))
def test_an_attachment_count_outside_its_bound_is_refused_before_a_frame_is_read(
    attach: Any, sent: int
) -> None:
    body = {"rid": "r"} if attach is None else {"rid": "r", "attach": attach}
    ids = [TokenIds.from_ints("r", 0, [i]) for i in range(sent)]
    data = frames(Control("prefill", body), *ids)
    valid = attach is None or (
        isinstance(attach, int) and not isinstance(attach, bool) and 0 <= attach <= sent
    )
    if valid:
        envelope = asyncio.run(receive(data))
        assert len(envelope.attachments) == (attach or 0)
    elif (
        isinstance(attach, int)
        and not isinstance(attach, bool)
        and sent < attach <= MAX_ATTACHMENTS
    ):
        with pytest.raises(Exception):  # noqa: B017, PT011 - announced more than it sent: truncated
            asyncio.run(receive(data))
    else:
        with pytest.raises(BadControl, match="attach"):
            asyncio.run(receive(data))


sizes = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**62),
    st.sampled_from([0, 1, 2, 10**15, 2**31, 2**63]),
)


@FUZZ
@given(
    prompt_len=st.integers(min_value=0, max_value=64),
    input_tokens=sizes,
    output_tokens=sizes,
    ids=st.one_of(st.integers(min_value=-5, max_value=300), st.just(10**12)),
)
def test_a_request_is_admitted_only_within_its_bounds(
    prompt_len: int, input_tokens: int, output_tokens: int, ids: int
) -> None:
    fe = frontend()
    body = {
        "rid": "r",
        "prompt_ids": [ids] * prompt_len,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
    }
    try:
        flight = fe.admit(body)
    except (ValueError, KeyError, TypeError):
        assert "r" not in fe.flights
        return
    record = flight.record
    assert 1 <= len(flight.prompt) <= fe.max_request_tokens
    assert record.input_tokens >= 1 and record.expected_output_tokens >= 1
    assert record.input_tokens + record.expected_output_tokens <= fe.max_request_tokens
    assert all(0 <= i < fe.model_config.vocab_size for i in flight.prompt)
