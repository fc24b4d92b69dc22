"""Errors the testbed raises; each message says what failed and what to do."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """A control-plane process failed to start or answer; the message has its log tail."""

    __test__ = False  # not a pytest test class, despite the name


class AssetsError(TestbedError):
    """A testbed binary could not be found or built."""


class MissingExtraError(TestbedError):
    """The testbed needs a package of the ``testing`` extra that is not installed.

    Installing ``mcruntime-core`` without the extra is supported (the pytest
    plugin still loads); this error says what to install when the testbed is
    used anyway, instead of a bare ``ModuleNotFoundError`` from deep inside.
    """

    INSTALL = "pip install 'mcruntime-core[testing]'"

    def __init__(self, module: str, purpose: str) -> None:
        super().__init__(
            f"the mcruntime testbed needs {module!r} {purpose}, which comes with the 'testing' "
            f"extra: {self.INSTALL}"
        )
        self.module = module
