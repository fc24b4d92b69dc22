"""Inline private keys never touch the disk: a SIGKILLed manager leaves no key material behind.

A manager process engages clusters whose kubeconfigs carry ``client-key-data``
(and hands out kubernetes-asyncio Configurations, which need the key as a
path). While it runs, its keys must be open only as in-memory files (memfd);
after SIGKILL, no file in its temporary directory, ``/dev/shm`` or anything it
had open may contain the key, in PEM, base64 or DER form.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from kube_helpers import unique

from mcruntime.testing import Fleet

HOLDER = Path(__file__).with_name("key_holder_process.py")


def fragments(pem: bytes) -> set[bytes]:
    """Distinctive pieces of a key in every form it could be written in."""
    body = [line for line in pem.splitlines() if line and not line.startswith(b"-----")]
    der = base64.b64decode(b"".join(body))
    encoded = base64.b64encode(pem)
    return {line for line in body if len(line) >= 40} | {der[40:80], der[-80:-40], encoded[64:128]}


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            yield from (path for path in root.rglob("*") if path.is_file() and not path.is_symlink())


async def test_a_killed_manager_leaves_no_key_material_on_disk(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-2"]
    users = [plane.add_cert_user(unique("sigkill"), groups=("system:masters",)) for _ in range(2)]
    secret: set[bytes] = set()
    for user in users:
        assert user.client_cert is not None
        secret |= fragments(user.client_cert.key_pem)
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    documents = [json.dumps(plane.kubeconfig(user)) for user in users]
    assert users[0].client_cert is not None
    assert (
        base64.b64encode(users[0].client_cert.key_pem)[64:128].decode() in documents[0]
    )  # what we search for

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HOLDER),
        *documents,
        stdout=asyncio.subprocess.PIPE,
        env=dict(os.environ, TMPDIR=str(private_tmp)),
        cwd=tmp_path,
    )
    try:
        assert process.stdout is not None
        key_paths = []
        async with asyncio.timeout(60):
            while (line := (await process.stdout.readline()).decode().strip()) != "ready":
                assert line, "the manager process ended before it was ready"
                key_paths.append(line.removeprefix("key "))

        # While it runs: each key is an in-memory file, and typed clients read it through /proc.
        assert len(key_paths) == 2
        open_files = {}
        for fd in os.listdir(f"/proc/{process.pid}/fd"):
            try:
                open_files[fd] = os.readlink(f"/proc/{process.pid}/fd/{fd}")
            except OSError:
                continue
        for path in key_paths:
            fd = path.removeprefix("/proc/self/fd/")
            assert open_files[fd].startswith("/memfd:mcruntime-client-key")
        on_disk = [
            Path(target)
            for target in open_files.values()
            if target.startswith("/") and Path(target).is_file()
        ]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()
    assert process.returncode == -signal.SIGKILL

    shared_memory = Path("/dev/shm")  # noqa: S108 - only read, to look for leftovers
    searched = list(files_under(private_tmp, tmp_path, shared_memory, *on_disk))
    leftovers = [path for path in searched if any(piece in path.read_bytes() for piece in secret)]
    assert not leftovers, f"key material left in {leftovers}"
    assert not list(private_tmp.iterdir())  # not even an empty private directory
