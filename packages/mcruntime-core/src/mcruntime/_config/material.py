"""Certificates and keys as files that exist only in this process's memory.

``ssl.SSLContext.load_cert_chain`` and kubernetes-asyncio's ``Configuration``
take file paths, but a private key written to a temporary file survives a
SIGKILL (no ``finally`` runs). On Linux each piece of inline material goes into
a ``memfd`` instead: an anonymous in-memory file, reachable as
``/proc/self/fd/N`` by this process only, gone with its last descriptor, so
with the process whatever ends it. Systems without ``memfd_create`` (macOS,
for development) fall back to a private 0700 directory removed by
:meth:`MaterialFiles.close`, which a SIGKILL does leave behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

MEMFD = hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd")


class MaterialFiles:
    """The in-memory files of one transport; :meth:`close` drops them all."""

    def __init__(self) -> None:
        self._fds: list[int] = []
        self._directory: str | None = None

    def __repr__(self) -> str:
        return f"<MaterialFiles {len(self._fds)} open>"

    def path(self, name: str, data: bytes) -> str:
        """A path that reads ``data`` until :meth:`close`; on Linux never a file on disk."""
        if not MEMFD:  # pragma: no cover - non-Linux development machines
            return self._private_file(name, data)
        fd = os.memfd_create(f"mcruntime-{name}", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except BaseException:
            os.close(fd)
            raise
        self._fds.append(fd)
        return f"/proc/self/fd/{fd}"

    def _private_file(self, name: str, data: bytes) -> str:  # pragma: no cover - non-Linux
        if self._directory is None:
            self._directory = tempfile.mkdtemp(prefix="mcruntime-")
        path = os.path.join(self._directory, f"{name}-{len(os.listdir(self._directory))}")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return path

    def close(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = None
