"""Talking to the ``kind`` command line: two commands, their outputs, their failures.

The provider never talks to Docker or Podman itself: kind already knows which
container runtime to use (``KIND_EXPERIMENTAL_PROVIDER``, its auto-detection),
which labels mark a cluster and where the API server's port is published, and
those details drift between runtimes and releases. Shelling out to ``kind``
keeps all of that kind's problem.

Every failure becomes a :class:`KindCommandError` whose message says which
command failed and how. Only kind's *error* output is quoted (and shortened);
a kubeconfig, which kind prints on standard output, never reaches a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass

import mcruntime as mcr

NO_CLUSTERS = "No kind clusters found."
"""What ``kind get clusters`` writes to stderr (exit 0) when there are none: zero clusters, no error."""

_DETAIL_LIMIT = 400

_REAP_LIMIT = 5.0
"""Seconds to wait for a killed kind's exit status before closing its pipes regardless."""


class KindCommandError(mcr.MCRuntimeError):
    """A ``kind`` command could not run, failed or timed out.

    Attributes:
        command: The command as a user would type it (``kind get clusters``).
        exit_code: kind's exit code; ``None`` when it never ran or was killed.
        detail: kind's own error output, shortened; never its standard output.
    """

    def __init__(self, command: str, message: str, *, exit_code: int | None = None, detail: str = "") -> None:
        self.command = command
        self.exit_code = exit_code
        self.detail = detail
        super().__init__(f"`{command}` {message}" + (f": {detail}" if detail else ""))


@dataclass(frozen=True)
class KindCLI:
    """Runs ``kind`` subcommands as subprocesses, each with a deadline.

    Args:
        binary: The executable: a name looked up on ``PATH`` when the command
            runs, or a path.
        timeout: Seconds one command may take before it is killed.
    """

    binary: str = "kind"
    timeout: float = 30.0

    async def clusters(self) -> list[str]:
        """The names ``kind get clusters`` lists, sorted; ``[]`` when it says there are none."""
        output = await self._run(["get", "clusters"])
        names = {line.strip() for line in output.splitlines()}
        return sorted(names - {"", NO_CLUSTERS})  # the notice goes to stderr, but never take it for a name

    async def kubeconfig(self, name: str, *, internal: bool = False) -> str:
        """The kubeconfig ``kind get kubeconfig --name <name>`` prints (with ``--internal`` if asked)."""
        args = ["get", "kubeconfig", "--name", name]
        if internal:
            args.append("--internal")
        return await self._run(args)

    async def _run(self, args: Sequence[str]) -> str:
        command = " ".join(["kind", *args])
        try:  # the child inherits our environment: PATH, KIND_EXPERIMENTAL_PROVIDER, DOCKER_HOST
            process = await asyncio.create_subprocess_exec(
                self.binary,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group: a kill ends what it started too
            )
        except FileNotFoundError:
            raise KindCommandError(
                command,
                f"could not run: no kind executable {self.binary!r} "
                f"(install kind, or point {_binary_setting()} at it)",
            ) from None
        except PermissionError:
            raise KindCommandError(command, f"could not run: {self.binary!r} is not executable") from None
        except OSError as error:
            raise KindCommandError(command, f"could not run {self.binary!r}: {error.strerror}") from None
        try:
            async with asyncio.timeout(self.timeout):
                stdout, stderr = await process.communicate()
        except TimeoutError:
            await _kill(process)
            raise KindCommandError(command, f"did not finish within {self.timeout:g}s; killed it") from None
        except BaseException:  # cancelled: leave no kind process behind
            await _kill(process)
            raise
        if process.returncode != 0:
            raise KindCommandError(
                command,
                f"failed with exit code {process.returncode}",
                exit_code=process.returncode,
                detail=_shorten(stderr.decode("utf-8", "replace")),
            )
        return stdout.decode("utf-8", "replace")


async def _kill(process: asyncio.subprocess.Process) -> None:
    """SIGKILL kind and all it started, then collect its exit, even through a second cancellation.

    A child of kind's (``docker``) that inherited its output would keep the pipes open,
    and the exit status is only reported once they close: so the whole group is killed.
    A cancellation that arrives while we wait (a shutdown giving up, an event loop
    closing) is raised after the wait, which SIGKILL keeps short. Cut short instead,
    it would leave a zombie and a transport that the garbage collector closes later,
    with a ResourceWarning, in whatever code runs then.
    """
    if process.returncode is None:  # once reaped, its pid may be someone else's
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _REAP_LIMIT
    exited = asyncio.ensure_future(process.wait())
    interrupted = False
    try:
        while not exited.done() and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait({exited}, timeout=left)
            except asyncio.CancelledError:
                interrupted = True
    finally:
        exited.cancel()  # nothing to cancel once it is done
        transport = getattr(process, "_transport", None)  # asyncio's Process has no close() of its own
        if transport is not None:
            transport.close()
    if interrupted:
        raise asyncio.CancelledError


def _shorten(text: str) -> str:
    """Kind's error output on one line, bounded: enough to act on, never a flood."""
    flat = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return flat if len(flat) <= _DETAIL_LIMIT else flat[: _DETAIL_LIMIT - 1] + "…"


def _binary_setting() -> str:
    return "the provider's `binary` option or MCRUNTIME_KIND_BINARY"
