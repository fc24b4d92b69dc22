"""Errors the testbed raises; each message says what failed and what to do."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A control-plane process failed to start or answer; the message has its log tail."""

    __test__ = False  # not a pytest test class, despite the name


class AssetsError(TestbedError):
    """A testbed binary could not be found or built."""
