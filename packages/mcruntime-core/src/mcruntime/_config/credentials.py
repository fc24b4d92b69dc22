"""The identity a transport presents: a header per request, a client certificate per connection.

Static tokens and basic auth are fixed; a ``tokenFile`` is re-read when it
changes (mounted service-account tokens rotate that way); an exec plugin runs
single-flight (concurrent requests share one run), again shortly before its
credential expires and after a 401, and is killed when the transport closes.
A client certificate, static or from a plugin, is handed to the transport
through ``use_certificate`` so new connections present it without touching
the caches above.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import logging
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from .._base.errors import Unreachable
from .exec import ExecCredential, ExecLimits, ExecPlugin
from .fields import read_regular, shown_path, within
from .kubeconfig import ClusterConfig
from .tokens import token_problem

if TYPE_CHECKING:
    from kubernetes_asyncio.config.kube_config import KubeConfigLoader

log = logging.getLogger("mcruntime.transport")

_EXPIRY_SKEW = datetime.timedelta(minutes=5)
MAX_TOKEN_FILE_BYTES = 64 << 10
"""A token file's bound: a ServiceAccount token is about a kilobyte, a large OIDC one a few."""

UseCertificate = Callable[[bytes, bytes], Awaitable[None]]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ClusterCredentials:
    """Produces the Authorization header for each request; ``invalidate`` after a 401."""

    def __init__(
        self,
        config: ClusterConfig,
        cluster: str,
        *,
        use_certificate: UseCertificate | None = None,
        prepare: Callable[[], Awaitable[None]] | None = None,
        exec_limits: ExecLimits | None = None,
        waiting: Callable[[str], AbstractContextManager[None]] | None = None,
    ) -> None:
        self._cluster = cluster
        self._waiting = waiting
        self._use_certificate = use_certificate
        self._prepare = prepare
        self._prepared: asyncio.Task[None] | None = None
        self._token_file: Path | None = None
        self._token_file_stamp: tuple[float, int] | None = None
        self._token_root: str | None = None
        """Where the token file must stay, for an untrusted kubeconfig (its own directory)."""
        self._header: str | None = None
        self._plugin: ExecPlugin | None = None
        self._refresh: asyncio.Task[ExecCredential] | None = None
        self._credential: ExecCredential | None = None
        self._obtained: datetime.datetime | None = None
        self._loader: KubeConfigLoader | None = None
        self._loader_dir: str | None = None
        self._closed = False
        user = config.user
        if user.get("token"):
            self._header = f"Bearer {user['token']}"
        elif user.get("tokenFile"):
            self._token_file = Path(user["tokenFile"])
            self._token_root = user.get("_token_root")
        elif user.get("username") is not None and user.get("password") is not None:
            raw = f"{user['username']}:{user['password']}".encode()
            self._header = f"Basic {base64.b64encode(raw).decode()}"
        elif "exec" in user:
            spec = dict(user["exec"])
            limits = exec_limits or ExecLimits()
            self._plugin = ExecPlugin(
                spec,
                cluster=cluster,
                server=config.server,
                base_dir=spec.pop("_base_dir", None),
                cluster_entry=config.cluster,
                timeout=limits.timeout,
                max_output=limits.max_output,
            )
        elif "auth-provider" in user:
            # Legacy gcp/oidc providers (removed from kubectl): still kubernetes-asyncio's,
            # with its temporary files in a private directory removed on close.
            from kubernetes_asyncio.config.kube_config import KubeConfigLoader

            self._loader_dir = tempfile.mkdtemp(prefix="mcruntime-")
            self._loader = KubeConfigLoader(
                {
                    "clusters": [{"name": "c", "cluster": dict(config.cluster)}],
                    "users": [{"name": "u", "user": dict(user)}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                },
                temp_file_path=self._loader_dir,
            )

    def __repr__(self) -> str:
        return f"<ClusterCredentials cluster={self._cluster!r}>"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def plugin(self) -> ExecPlugin | None:
        """The exec plugin, if the user has one (tests count its runs)."""
        return self._plugin

    def sent_secret(self) -> str | None:
        """The secret part of the header last sent (a token, basic auth's pair), to scrub from answers.

        A server may quote the request's credentials back in an error (a hostile one
        does it on purpose): what it says goes into exceptions and logs, so the
        client removes this string from every refusal's body first.
        """
        header = self._header
        if not header:
            return None
        secret = header.split(" ", 1)[-1]
        return secret if len(secret) >= 8 else None  # a shorter one would scrub ordinary words

    async def header(self) -> str | None:
        """The Authorization header value for the next request (``None``: no header)."""
        if self._prepare is not None:
            if self._prepared is None:
                self._prepared = asyncio.ensure_future(self._prepare())
            await asyncio.shield(self._prepared)
        if self._token_file is not None:
            return await self._read_token_file()
        if self._plugin is not None:
            running = self._refresh is not None and not self._refresh.done()
            if running or self._credential is None or self._expiring():
                await self._refreshed()  # a run under way (after a 401, say) brings the fresher one
            return self._header
        if self._loader is not None and self._header is None:
            self._header = await self._run_auth_provider()
        return self._header

    def _expiring(self) -> bool:
        assert self._credential is not None
        expires = self._credential.expires
        if expires is None or self._obtained is None:
            return False
        # Five minutes early, or a fifth of the lifetime for short-lived credentials.
        skew = min(_EXPIRY_SKEW, (expires - self._obtained) / 5)
        return _now() >= expires - skew

    async def _refreshed(self) -> None:
        """Run the plugin, or wait for the run already under way (single-flight)."""
        assert self._plugin is not None
        if self._closed:
            raise Unreachable("the cluster was stopped", cluster=self._cluster)
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._plugin.run())
        task = self._refresh
        # Shielded: one waiting request being cancelled must not kill the run the
        # others share; close() cancels the run itself.
        plugin = self._plugin
        what = f"exec plugin {plugin.name!r} (stopped after {plugin.timeout:g} s)"
        try:
            with self._waiting(what) if self._waiting is not None else contextlib.nullcontext():
                credential = await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            ended_by_close = task.cancelled() and self.closed
            if ended_by_close and not (current is not None and current.cancelling()):
                raise Unreachable("the cluster was stopped", cluster=self._cluster) from None
            raise
        if credential is not self._credential:
            self._credential = credential
            self._obtained = _now()
            if credential.client_certificate and credential.client_key and self._use_certificate:
                await self._use_certificate(credential.client_certificate, credential.client_key)
            self._header = f"Bearer {credential.token}" if credential.token else None

    async def _read_token_file(self) -> str | None:
        assert self._token_file is not None
        try:
            status = self._token_file.stat()
        except OSError:
            # Keep the last good token while the file is swapped; but a link swapped to lead
            # outside is named whether or not its target exists (the policy decides first).
            self._check_token_root()
            return self._header
        stamp = (status.st_mtime, status.st_ino)
        if stamp != self._token_file_stamp or self._header is None:
            shown = shown_path(str(self._token_file))
            self._check_token_root()
            try:
                raw = await asyncio.to_thread(read_regular, self._token_file, MAX_TOKEN_FILE_BYTES)
            except OSError as error:
                message = f"tokenFile {shown} cannot be read: {error}"
                raise Unreachable(message, cluster=self._cluster) from None
            token = raw.decode("utf-8", "replace").strip()
            problem = token_problem(token)
            if problem:  # sent, it would fail in the HTTP client: say which file is wrong instead
                raise Unreachable(f"tokenFile {shown}: the token {problem}", cluster=self._cluster)
            if token:
                self._header = f"Bearer {token}"
                self._token_file_stamp = stamp
        return self._header

    def _check_token_root(self) -> None:
        """Checked at load too; a link swapped in since must not send another file as the token."""
        assert self._token_file is not None
        if self._token_root is not None and not within(str(self._token_file), self._token_root):
            raise Unreachable(
                f"tokenFile {shown_path(str(self._token_file))} now leads outside its kubeconfig's "
                "directory; not read",
                cluster=self._cluster,
            )

    async def _run_auth_provider(self) -> str | None:
        assert self._loader is not None
        loader = self._loader
        provider: str | None = getattr(loader, "provider", None)
        if provider == "gcp":
            await loader.load_gcp_token()
        elif provider == "oidc":
            await loader._load_oid_token()
        token = getattr(loader, "token", None)
        return f"Bearer {token}" if isinstance(token, str) and not token.startswith("Bearer ") else token

    def invalidate(self) -> None:
        """Forget the current credential so the next request fetches a fresh one."""
        if self._token_file is not None:
            self._token_file_stamp = None
        if self._plugin is not None and (self._refresh is None or self._refresh.done()):
            self._credential = None  # a run under way already brings a fresh one
        if self._loader is not None:
            self._header = None

    async def close(self) -> None:
        """Kill a plugin run under way (its whole process group) and drop temporary files."""
        self._closed = True
        for task in (self._refresh, self._prepared):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self._loader_dir is not None:
            shutil.rmtree(self._loader_dir, ignore_errors=True)
            self._loader_dir = None
