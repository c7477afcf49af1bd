"""`PDDEMU_STALL` (forced lateness, `pddemu.roles.base.stalls_of`): read as written, and a
malformed value refused with an error that names the setting and the part at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from netem.clock import SharedClock
from pddemu.roles.base import STALL_ENV, stalls_of
from pddemu.roles.relay import RelayInstance
from tests.roles.in_process import instance


def test_a_stall_setting_gives_each_named_instance_its_kinds() -> None:
    setting = "FE0:p_hit,routed:0.02;MD0:kv_end:0.1m"
    assert stalls_of(setting, "FE0") == {"p_hit": (0.02, False), "routed": (0.02, False)}
    assert stalls_of(setting, "MD0") == {"kv_end": (0.1, True)}
    assert stalls_of(setting, "P0") == {}


@pytest.mark.parametrize(
    "part",
    ["FE0", "FE0:0.02", "FE0:p_hit:", "FE0:p_hit:soon", "FE0::0.02", "FE0:p_hit,:0.02",
     ":p_hit:0.02", "FE0:p_hit:-1", "FE0:p_hit:nan", "FE0:p_hit:0.02:m"],
)  # fmt: skip
def test_a_malformed_stall_setting_is_refused_naming_it(part: str) -> None:
    """Each malformed part, for this instance or another, is refused by name. On the code
    before, a part without three fields raised a bare ValueError (values to unpack), and the
    others passed unnoticed (read only by the instance they name, where 'soon' or '' raised
    a bare ValueError too, and empty kinds, -1 or nan were taken)."""
    with pytest.raises(ValueError, match=rf"^{STALL_ENV}: {part!r} is not INSTANCE:KIND"):
        stalls_of(f"MD0:kv_end:0.1;{part}", "P0")


def test_an_instance_given_a_malformed_stall_setting_claims_no_clock_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setting is read before the instance takes a slot on the run's clock page: refused,
    it leaves none claimed (on the code before, its slot stayed taken)."""
    page = tmp_path / "clock"
    SharedClock.create(page).close()
    monkeypatch.setenv(STALL_ENV, "RLD0:tokens")
    with pytest.raises(ValueError, match=STALL_ENV):
        instance(RelayInstance, "RLD", clock=str(page))
    with SharedClock(page) as clock:
        assert clock.slot_named("RLD0") is None
