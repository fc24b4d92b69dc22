"""KindProvider: one engaged cluster per local kind cluster, found by polling the kind CLI.

kind has no watch API, so the provider polls: ``kind get clusters`` for the
names, then ``kind get kubeconfig --name <name>`` for *every* listed cluster on
*every* poll. Fetching known names again is the point: a cluster deleted and
recreated under the same name between two polls comes back with a new CA and a
new port, and only its kubeconfig's content tells. The provider hands the
whole picture to a :class:`mcruntime.provider.ClusterSet`, whose fingerprints decide
what is new, changed or gone; starting, engaging, replacing and stopping
clusters is the set's job, never the provider's.

What counts as "gone" is strict: only a name that ``kind get clusters`` no
longer lists. A listing that fails (no kind binary, the container runtime
down) changes nothing and is retried with backoff; a listed cluster whose
kubeconfig cannot be read (still being created, its container stopped) keeps
its last good kubeconfig if it had one and is otherwise not engaged yet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.kubeconfig import parse_kubeconfig
from mcruntime.provider import ClusterSetProvider

from ._cli import KindCLI, KindCommandError
from ._settings import KIND_NAME, KindSettings

log = logging.getLogger("mcruntime.providers.kind")

IndexFunc = Callable[[Any], Iterable[str]]
"""What :meth:`KindProvider.index_field` takes: an object in, its index values out (the core's shape)."""

_CLUSTER_RETRY_POLLS = 5
"""A listed cluster whose kubeconfig cannot be read is asked again at least every this many polls."""

_FETCH_CONCURRENCY = 4
"""kind commands in flight at once: each costs a ``docker exec``, and laptops have few cores."""


LISTING = "kind get clusters"
"""The name of the listing's own source in :meth:`KindProvider.sources` (never a kind cluster's name)."""


def context_name(name: str) -> str:
    """The kubeconfig context (and cluster and user entry) kind writes for cluster ``name``."""
    return f"kind-{name}"


@dataclass
class _Retry:
    """A listed cluster whose kubeconfig could not be used: why, and when to ask again."""

    error: str
    failures: int
    next_attempt: float


class KindProvider(ClusterSetProvider):
    """Engages every local kind cluster (or those a prefix or allow-list selects) under its kind name.

    The cluster ``dev``, whose kubeconfig context kind names ``kind-dev``, is
    engaged as ``"dev"``; the provider reads the context ``kind-dev`` of the
    kubeconfig kind prints for it.

    Args:
        binary: The kind executable: a name looked up on ``PATH`` or a path.
        poll_interval: Seconds between two polls; failed listings back off
            from there, up to ``max_backoff``.
        prefix: Only clusters whose kind name starts with this.
        clusters: Only these kind names (an allow-list; a string is read as
            comma-separated names); ``None`` for all.
        internal: Ask kind for the internal kubeconfig (``--internal``), whose
            server is ``https://<name>-control-plane:6443``: for a controller
            that runs in a container on kind's network.
        command_timeout: Seconds one kind command may take before it is killed.
        trust: What a kind kubeconfig may ask for. Untrusted by default, which
            kind's client-certificate kubeconfigs satisfy.
        options: Options of every engaged cluster.
        probe_interval: Seconds between health probes of each cluster (default: ``options``').
        max_backoff: The longest wait between two attempts after failures.
        backoff: The retry delays after failed polls, instead of ``poll_interval``
            doubling up to ``max_backoff``.
    """

    def __init__(
        self,
        *,
        binary: str = "kind",
        poll_interval: float = 2.0,
        prefix: str = "",
        clusters: Iterable[str] | None = None,
        internal: bool = False,
        command_timeout: float = 30.0,
        trust: mcr.TrustPolicy | None = None,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        max_backoff: float = 30.0,
        backoff: mcr.Backoff | None = None,
    ) -> None:
        self.settings = KindSettings.load(
            binary=binary,
            poll_interval=poll_interval,
            prefix=prefix,
            clusters=clusters if clusters is None or isinstance(clusters, str) else tuple(clusters),
            internal=internal,
            command_timeout=command_timeout,
        )
        if max_backoff <= 0:
            raise ValueError("max_backoff must be positive")
        self._cli = KindCLI(self.settings.binary, self.settings.command_timeout)
        self._trust = trust or mcr.TrustPolicy.untrusted()
        # The core's one backoff: poll_interval doubling up to max_backoff, overflow-safe.
        self._poll_backoff = backoff or mcr.Backoff(
            base=self.settings.poll_interval, cap=max(max_backoff, self.settings.poll_interval), jitter=0.2
        )
        self._owner = "kind clusters"
        super().__init__(self._owner, options=options, probe_interval=probe_interval)
        self._last_good: mcrp.LastGood[mcr.ClusterConfig] = mcrp.LastGood()
        self._retries: dict[str, _Retry] = {}
        self._last_error: str | None = None
        self._listed: tuple[str, ...] = ()
        self._started = 0  # polls begun
        self._completed = 0  # polls finished, successfully or not
        self._progress = asyncio.Condition()

    @classmethod
    def from_settings(
        cls,
        settings: KindSettings | None = None,
        *,
        trust: mcr.TrustPolicy | None = None,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        max_backoff: float = 30.0,
    ) -> KindProvider:
        """A provider configured from ``MCRUNTIME_KIND_*`` (or the given settings).

        Raises:
            mcruntime.SettingsError: a variable is invalid; the message names it.
        """
        values = settings or KindSettings.load()
        # Every setting is a constructor argument of the same name: none can be left behind.
        return cls(
            **values.model_dump(),
            trust=trust,
            options=options,
            probe_interval=probe_interval,
            max_backoff=max_backoff,
        )

    def __repr__(self) -> str:
        return (
            f"<KindProvider binary={self.settings.binary!r} prefix={self.settings.prefix!r} "
            f"clusters={self.clusters.names()}>"
        )

    # --- reporting (get, index_field and statuses come from ClusterSetProvider) ---------------

    def sources(self) -> dict[str, mcrp.SourceStatus]:
        """The listing, and each listed cluster's kubeconfig, with what is wrong with them.

        :data:`LISTING` (``"kind get clusters"``) is the listing itself: its
        ``error`` says why the last poll could not list (kind missing, the
        runtime down), and clusters already engaged stay meanwhile. Each listed
        cluster has a ``"kind cluster"`` source; its ``error`` says why its
        kubeconfig could not be used on the last attempt (still being created,
        refused by the trust policy). Such a cluster keeps its last good
        kubeconfig if it had one, and is otherwise not engaged until one can
        be read.
        """
        found = {LISTING: mcrp.SourceStatus("kind CLI", LISTING, error=self._last_error)}
        for name in self._listed:
            retry = self._retries.get(name)
            found[name] = mcrp.SourceStatus(
                "kind cluster",
                name,
                cluster=name,
                engaged=name in self._last_good,
                error=retry.error if retry is not None else None,
                stale=retry is not None and name in self._last_good,
            )
        return found

    def listed(self) -> list[str]:
        """The kind names the last successful listing held, after the prefix and allow-list."""
        return list(self._listed)

    @property
    def polls(self) -> int:
        """How many polls have finished (successfully or not) since the provider started."""
        return self._completed

    async def next_poll(self, timeout: float = 30.0) -> None:
        """Wait until a poll that began after this call has finished: for tests and tools.

        Raises:
            TimeoutError: no such poll finished within ``timeout`` seconds (is
                the provider running?).
        """
        target = self._started + 1
        async with asyncio.timeout(timeout), self._progress:
            await self._progress.wait_for(lambda: self._completed >= target)

    # --- discovery -------------------------------------------------------------------------

    async def run(self, aware: mcr.Aware) -> None:
        """Poll kind and keep the engaged clusters equal to what it lists until cancelled."""
        engaging = asyncio.create_task(self.clusters.run(aware), name=f"{self._owner}:clusters")
        try:
            await self._discover()
        finally:
            # Discovery has ended, so no change is half applied: now stop every cluster.
            engaging.cancel()
            await asyncio.gather(engaging, return_exceptions=True)

    async def _discover(self) -> None:
        failures = 0
        while True:
            self._started += 1
            try:
                await self._poll()
                if self._last_error is not None:
                    log.info("%s: kind answers again", self._owner)
                self._last_error = None
                failures = 0
                delay = self.settings.poll_interval
            except KindCommandError as error:  # kind or its runtime unavailable: retry, keep what we have
                failures += 1
                delay = self._backoff(failures)
                self._report(str(error), delay)
            except Exception as error:  # a bug or a surprise: never let one pass end discovery
                failures += 1
                delay = self._backoff(failures)
                log.exception("%s: a poll failed; retrying in %.1fs", self._owner, delay)
                self._last_error = f"poll failed: {type(error).__name__}: {error}"
            async with self._progress:
                self._completed += 1
                self._progress.notify_all()
            await asyncio.sleep(delay)

    def _report(self, error: str, delay: float) -> None:
        level = logging.WARNING if error != self._last_error else logging.DEBUG
        log.log(
            level,
            "%s: cannot list clusters, keeping those engaged; retrying in %.1fs: %s",
            self._owner,
            delay,
            error,
        )
        self._last_error = error

    def _backoff(self, failures: int) -> float:
        return self._poll_backoff.delay(failures)

    async def _poll(self) -> None:
        """List, fetch every listed kubeconfig that is due, and make the set match."""
        listed = tuple(name for name in await self._cli.clusters() if self._wanted(name))
        self._last_good.retain(listed)  # no longer listed: the one authoritative "gone"
        for name in [name for name in self._retries if name not in listed]:
            del self._retries[name]
        self._listed = listed
        now = asyncio.get_running_loop().time()
        due = [
            name for name in listed if name not in self._retries or self._retries[name].next_attempt <= now
        ]
        limit = asyncio.Semaphore(_FETCH_CONCURRENCY)

        async def fetch(name: str) -> None:
            async with limit:
                await self._fetch(name)

        await asyncio.gather(*(fetch(name) for name in due))
        desired = {name: config for name in listed if (config := self._last_good.get(name)) is not None}
        await self.clusters.sync(desired)  # finishes even if cancelled: a started replacement must end

    def _wanted(self, name: str) -> bool:
        allowed = self.settings.clusters
        return (
            bool(KIND_NAME.match(name))
            and name.startswith(self.settings.prefix)
            and (allowed is None or name in allowed)
        )

    async def _fetch(self, name: str) -> None:
        """Read one cluster's kubeconfig; on failure keep its last good one and schedule a retry."""
        try:
            text = await self._cli.kubeconfig(name, internal=self.settings.internal)
            config = self._parse(name, text)
        except (KindCommandError, mcr.KubeconfigError) as error:
            self._failed(name, str(error))
            return
        self._last_good.keep(name, config)
        if self._retries.pop(name, None) is not None:
            log.info("%s: cluster %r: kubeconfig readable again", self._owner, name)

    def _parse(self, name: str, text: str) -> mcr.ClusterConfig:
        """Kind's kubeconfig as a config; errors say where, never quote what."""
        origin = f"kubeconfig of kind cluster {name!r}"
        document = parse_kubeconfig(text, origin=origin)  # bounded: no aliases, depth, size
        try:
            return mcr.kubeconfig_from_dict(document, context_name(name), trust=self._trust, origin=origin)
        except mcr.KubeconfigError:
            raise  # secret-free by construction
        except Exception as error:  # a shape no check foresaw: name the type, quote nothing
            raise mcr.KubeconfigError(
                f"not a usable kubeconfig ({type(error).__name__})", origin=origin
            ) from None

    def _failed(self, name: str, error: str) -> None:
        previous = self._retries.get(name)
        failures = previous.failures + 1 if previous is not None else 1
        # A cluster being created becomes readable any moment: ask again within a few polls.
        delay = min(self._backoff(failures), _CLUSTER_RETRY_POLLS * self.settings.poll_interval)
        self._retries[name] = _Retry(error, failures, asyncio.get_running_loop().time() + delay)
        if previous is None or previous.error != error:
            keeping = self._last_good.keeping(name, "kubeconfig")
            log.warning("%s: cluster %r: %s (%s; retrying)", self._owner, name, error, keeping)
