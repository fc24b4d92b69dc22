"""The directory watches run in threads of their own, and a process pays for watchfiles only once it watches.

``import mcruntime_file`` must not import watchfiles, and a running provider
must not bring anyio's asyncio backend: both were on the event loop at start,
right when the first clusters connect. Run in a fresh interpreter, since the
test process has imported both long before.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from file_helpers import dump, kubeconfig, write_atomic

from mcruntime.testing import Fleet

WATCHING = """
import asyncio, sys, threading
from pathlib import Path
import mcruntime as mcr
from mcruntime.testing import wait_until
from mcruntime_file import KubeconfigFileProvider

async def main():
    members, staged = Path(sys.argv[1]), Path(sys.argv[2])
    print("imported watchfiles:", "watchfiles" in sys.modules)
    # No periodic rescan within the test: only the watch can see the second file.
    provider = KubeconfigFileProvider(members, naming="context", rescan_interval=3600, debounce=0.05)
    manager = mcr.Manager(provider, handle_signals=False)
    running = asyncio.create_task(manager.start())

    async def engaged(name):
        try:
            await provider.get(name)
        except mcr.ClusterNotFound:
            return False
        return True

    await wait_until(lambda: engaged("east"), timeout=60, what="east engaged")
    staged.rename(members / staged.name)
    await wait_until(lambda: engaged("west"), timeout=60, what="west engaged through the watch")
    watches = sorted(t.name for t in threading.enumerate() if t.name.endswith(":watch"))
    print("watch threads:", len(watches))
    print("anyio backend:", "anyio._backends._asyncio" in sys.modules)
    manager.stop()
    await running
    print("after stop:", sum(1 for t in threading.enumerate() if t.name.endswith(":watch")))

asyncio.run(main())
"""


def test_a_provider_watches_from_threads_without_anyio_and_stops_them(fleet: Fleet, tmp_path: Path) -> None:
    members = tmp_path / "members"
    write_atomic(members / "east.kubeconfig", dump(kubeconfig(("east", fleet["cluster-1"], None))))
    staged = tmp_path / "west.kubeconfig"  # renamed into the directory once east is engaged
    staged.write_bytes(dump(kubeconfig(("west", fleet["cluster-2"], None))))
    found = subprocess.run(
        [sys.executable, "-c", WATCHING, str(members), str(staged)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    lines = found.stdout.strip().splitlines()
    assert lines[0] == "imported watchfiles: False", found.stdout
    assert lines[1].startswith("watch threads: ") and int(lines[1].split()[-1]) >= 1, found.stdout
    assert lines[2:] == ["anyio backend: False", "after stop: 0"], found.stdout
