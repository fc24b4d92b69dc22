"""The provider tests' stand-in ``kind`` (see ``kind_standin.py``), as a fixture for every module here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kind_standin import FakeKind


@pytest.fixture
def kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeKind:
    """A stand-in ``kind`` first on ``PATH``, with no clusters yet."""
    fake = FakeKind(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ.get('PATH', '')}")
    return fake
