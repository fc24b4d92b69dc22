"""What ``import mcruntime`` leaves out, so that a process that does not need it never pays for it.

S1 counts the peer's CPU from process start, imports included: aiohttp's
server side comes with the first webhook or served endpoint, pydantic with
``ManagerSettings``, the distribution metadata with ``__version__``.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import mcruntime

DEFERRED = ("aiohttp.web", "mcruntime._webhook.server", "pydantic", "mcruntime._client.wire", "hpack")


def test_import_mcruntime_leaves_the_server_side_and_settings_out() -> None:
    code = f"import sys, mcruntime; print(sorted(m for m in {DEFERRED!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]", found.stdout


def test_the_version_is_read_when_asked_and_is_the_distribution_s() -> None:
    assert mcruntime.__version__ == version("mcruntime-core")
    assert "__version__" in mcruntime.__all__


def test_a_manager_still_builds_its_webhook_server_on_first_use() -> None:
    manager = mcruntime.Manager(mcruntime.StaticProvider({}), handle_signals=False)
    assert manager.webhook is manager.webhook
    assert type(manager.webhook).__name__ == "WebhookServer"
