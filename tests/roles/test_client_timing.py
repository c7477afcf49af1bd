"""The containment check the serve tests rely on fails on each of the orders it guards."""

from __future__ import annotations

import pytest

from tests.roles.client_timing import outside_the_emulator_s


def record(received: float, first_chunk: float, arrival: float, first_token: float) -> dict:
    return {
        "door": {"received_s": received, "first_chunk_s": first_chunk},
        "arrival_s": arrival,
        "first_token_s": first_token,
    }


def test_a_contained_request_gives_the_time_outside_the_emulator() -> None:
    inside = record(10.001, 10.200, arrival=5.0, first_token=5.150)
    assert outside_the_emulator_s(10.0, 10.203, inside, 1.0) == pytest.approx((0.001, 0.049, 0.003))
    # modelled time at twice real time: the emulator's TTFT is 0.075 wall seconds
    assert outside_the_emulator_s(10.0, 10.203, inside, 2.0)[1] == pytest.approx(0.124)


@pytest.mark.parametrize(
    ("sent", "first", "door_and_emulator"),
    [
        (10.002, 10.203, record(10.001, 10.200, 5.0, 5.150)),  # sent after the door received
        (10.0, 10.199, record(10.001, 10.200, 5.0, 5.150)),  # read before the door wrote
        (10.0, 10.203, record(10.001, 10.200, 5.0, 5.250)),  # emulator's TTFT beyond the door's
        (10.0, 10.203, record(10.001, None, 5.0, 5.150)),  # no first chunk written
    ],
)
def test_any_order_broken_fails(sent: float, first: float, door_and_emulator: dict) -> None:
    with pytest.raises(AssertionError):
        outside_the_emulator_s(sent, first, door_and_emulator, 1.0)
