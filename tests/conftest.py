"""Shared test fixtures: privilege checks that never skip under CI, and the logs of a failed
emulation test's run in its failure report (tests/run_logs.py)."""

from __future__ import annotations

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
