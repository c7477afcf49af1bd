from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from netem.registry import Registry, list_namespaces
from tests.conftest import require_namespaces


@pytest.fixture
def run_name() -> Iterator[str]:
    """A run name unique to this test; whatever it left behind is removed and reported."""
    require_namespaces()
    name = "t" + uuid.uuid4().hex[:10]
    yield name
    leftovers = [ns for ns in list_namespaces() if ns.startswith(f"netem-{name}-")]
    Registry().cleanup(name)
    assert not leftovers, f"test left namespaces behind: {leftovers}"


@pytest.fixture
def tools() -> None:
    missing = [t for t in ("ping", "iperf3") if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"missing tools {missing}: `make test` installs them (scripts/install-system-deps)"
        )
