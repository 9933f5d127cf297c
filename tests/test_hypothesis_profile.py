"""The suite's hypothesis profile (tests/conftest.py): derandomized, no deadline."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings


@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci", reason="another profile was asked for")
def test_ci_profile_is_loaded() -> None:
    current = settings()
    assert current.derandomize is True
    assert current.deadline is None
    assert current.database is None
