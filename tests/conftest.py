"""Shared test fixtures: privilege and extra-package checks that never skip under CI, and the
logs of a failed emulation test's run in its failure report (tests/run_logs.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.run_logs import (  # noqa: F401 - the hooks
    pytest_fixture_setup,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)


def require_namespaces() -> None:
    """Skip a namespace test on a laptop without root; under CI=true it must run."""
    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("namespace tests must run under CI=true: run them as root")
    pytest.skip("needs root to create network namespaces")


def require_ray() -> None:
    """Skip a Ray test where the `ray` extra is not installed (`make install` leaves it out;
    `make test` installs it); under CI=true it must run."""
    if importlib.util.find_spec("ray") is not None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("Ray tests must run under CI=true: install the extra, pip install '.[ray]'")
    pytest.skip("needs the ray extra: pip install -e '.[ray]' (make test installs it)")
