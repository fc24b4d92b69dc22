"""The ClusterProfile provider: the clusters a hub's cluster inventory lists.

It watches ``multicluster.x-k8s.io/v1alpha1`` ClusterProfiles on the hub (one
namespace or all, optionally label-selected) and keeps a
:class:`mcruntime.provider.ClusterSet` equal to the usable ones, each named
``<namespace>/<name>``. A profile is engaged once ready (``ControlPlaneHealthy``
by default) and stays engaged until it is deleted or gets a deletionTimestamp:
a profile that stops looking ready, or whose access becomes unusable, keeps
its cluster on the last connection that worked, and says so in
:meth:`ClusterProfileProvider.sources`.

Credentials come from the consumer's provider file (:class:`AccessConfig`):
an exec plugin per access-provider name, run by the core's exec support. The
provider therefore opts in to exec plugins, and only to the consumer's own:
a profile can add arguments or variables to a plugin only where the file's
policies allow it, and can never name a program.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

import mcruntime as mcr
from mcruntime.cache import Informer
from mcruntime.provider import HubProvider, KindNotInstalled, LastGood, SourceStatus, resource_version

from ._access import AccessConfig, AccessConfigError
from ._profile import (
    MAX_ACCESS_PROVIDERS,
    MAX_PROFILE_BYTES,
    MAX_STRING_CHARS,
    Access,
    Limits,
    ProfileError,
    Readiness,
    control_plane_healthy,
    read_access,
)

log = logging.getLogger("mcruntime_clusterprofile")

GROUP = "multicluster.x-k8s.io"
CLUSTER_PROFILE = mcr.Kind(f"{GROUP}/v1alpha1", "ClusterProfile")
CLUSTER_MANAGER_LABEL = "x-k8s.io/cluster-manager"
"""The label a cluster manager puts on its profiles; select on it to use one manager's clusters."""

CRD_NAME = "clusterprofiles.multicluster.x-k8s.io"

ACCESS_POLL_INTERVAL = 2.0
"""Seconds between looks at a provider file given as a path; a change is in use within this."""

_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp", "labels")


class ClusterProfileNotInstalled(KindNotInstalled):
    """The hub serves no ``multicluster.x-k8s.io/v1alpha1`` ClusterProfile.

    Raised by :meth:`ClusterProfileProvider.run` only with ``wait_for_crd=False``;
    by default the provider waits for the CRD instead.
    """


@dataclass(frozen=True)
class _Version:
    """What one resourceVersion of one profile says."""

    resource_version: str
    ready: bool
    access: Access | None
    error: str | None
    read_with: AccessConfig | None = None


class ClusterProfileProvider(HubProvider):
    """Engages the clusters a hub's ClusterProfiles describe, with the consumer's credential plugins.

    Args:
        hub: The hub: a config (the provider connects and disconnects) or a
            running :class:`mcruntime.Cluster` the caller owns.
        access: The consumer's provider file (a path, read when the provider
            starts) or an :class:`AccessConfig`. A broken file fails ``run``
            at once with an error naming the file and the field.
        namespace: Watch one namespace only (``None``: all namespaces). A
            ClusterSet is one namespace of the hub.
        label_selector: Only profiles with these labels, for example
            ``{CLUSTER_MANAGER_LABEL: "ocm"}``.
        ready: When a profile not engaged yet may be engaged (default: its
            ``ControlPlaneHealthy`` condition is ``True``).
        trust: What a connection may ask for beyond what exec needs. Exec
            plugins are always allowed (they come from ``access``, never from
            a profile); everything else is refused unless allowed here
            (``insecure-skip-tls-verify`` needs ``allow_insecure``).
        options: Options of every cluster (and of the hub connection).
        probe_interval: Seconds between health probes of each cluster.
        wait_for_crd: On a hub without the ClusterProfile CRD, wait for it
            (reported by :attr:`waiting` and :meth:`sources`) rather than raise
            :class:`ClusterProfileNotInstalled`.
        max_profile_bytes: A profile larger than this (as JSON) is refused.
        max_access_providers: A profile listing more access providers is refused.
        max_string_chars: Longer names, servers, URLs, arguments and variables are refused.
        crd_backoff: How often a missing CRD is looked for again (default: 1 s
            doubling to 30 s).
        retry_backoff: How long a failed discovery pass waits before the next.
        access_poll_interval: Seconds between looks at the provider file (given
            as a path) for changes. A changed file is read again and every
            profile re-read with it; a file that no longer reads keeps the
            last good one in use and is reported in :meth:`sources` (kind
            ``ProviderFile``, by path) until it reads again.
    """

    not_installed = ClusterProfileNotInstalled

    def __init__(
        self,
        hub: mcr.ClusterConfig | mcr.Cluster,
        access: AccessConfig | str | os.PathLike[str],
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        ready: Readiness = control_plane_healthy,
        trust: mcr.TrustPolicy | None = None,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        wait_for_crd: bool = True,
        max_profile_bytes: int = MAX_PROFILE_BYTES,
        max_access_providers: int = MAX_ACCESS_PROVIDERS,
        max_string_chars: int = MAX_STRING_CHARS,
        crd_backoff: mcr.Backoff | None = None,
        retry_backoff: mcr.Backoff | None = None,
        access_poll_interval: float = ACCESS_POLL_INTERVAL,
    ) -> None:
        self.limits = Limits(max_profile_bytes, max_access_providers, max_string_chars)
        self.namespace = namespace
        self.label_selector = label_selector
        self.access: AccessConfig | None = access if isinstance(access, AccessConfig) else None
        """The consumer's provider file, once read (at the start of :meth:`run` when given as a path)."""
        self._access_path = None if isinstance(access, AccessConfig) else access
        self._access_poll_interval = access_poll_interval
        self._access_stamp: tuple[int, int, int] | None = None
        self._access_error: SourceStatus | None = None
        self._ready = ready
        # The explicit opt-in: exec plugins run, because the consumer's own file names them.
        self._trust = dataclasses.replace(trust or mcr.TrustPolicy.untrusted(), allow_exec=True)
        self._owner = f"cluster profiles in {namespace!r}" if namespace else "cluster profiles"
        super().__init__(
            hub,
            self._owner,
            options=options,
            probe_interval=probe_interval,
            wait_for_crd=wait_for_crd,
            crd_backoff=crd_backoff,
            retry_backoff=retry_backoff,
        )
        self._versions: dict[str, _Version] = {}
        self._last_good: LastGood[Access] = LastGood()

    def rbac_rules(self) -> list[mcr.Permission]:
        """On the hub: read ClusterProfiles (``namespace``, or all); access providers bring credentials."""
        why = "ClusterProfileProvider: ClusterProfiles"
        return [
            mcr.Permission(
                CLUSTER_PROFILE, ("get", "list", "watch"), "hub", namespace=self.namespace, reason=why
            )
        ]

    def __repr__(self) -> str:
        return f"<ClusterProfileProvider {self._owner} clusters={self.clusters.names()}>"

    def sources(self) -> Mapping[str, SourceStatus]:
        """One :class:`SourceStatus` per ClusterProfile (``namespace/name``), and the CRD while missing.

        What :meth:`follow` last published, plus what only running the plugin
        shows: an engaged profile whose credential cannot be got (the plugin
        is missing, exits non-zero or is killed after ``exec_timeout``) has
        that as its ``error``, and one whose plugin is still running says so,
        with the time so far, in ``detail["waiting"]``. The profile names the
        access provider, and the access provider the plugin, so this is where
        an operator looks.
        """
        found = dict(super().sources())
        if self._access_error is not None:
            found[self._access_error.name] = self._access_error
        for key, source in found.items():
            health = self.clusters.health(key) if source.engaged else None
            if health is None:
                continue
            if health.credential_error is not None and source.error is None:
                found[key] = dataclasses.replace(source, error=health.credential_error)
            elif health.waiting is not None:
                found[key] = dataclasses.replace(source, detail={**source.detail, "waiting": health.waiting})
        return found

    async def run(self, aware: mcr.Aware) -> None:
        """Watch ClusterProfiles and keep the engaged clusters equal to them until cancelled."""
        watchers: list[Callable[[Callable[[], None]], Coroutine[Any, Any, None]]] = []
        if self._access_path is not None:
            self._access_stamp, self.access = await asyncio.to_thread(_load, self._access_path)
            watchers.append(self._follow_access_file)
        async with self.connect() as hub:
            what = "the ClusterProfile API (multicluster.x-k8s.io)"
            await self.served_kind(hub, [CLUSTER_PROFILE], what=what, crd=CRD_NAME)
            informer = Informer(
                hub.client,
                CLUSTER_PROFILE,
                namespace=self.namespace,
                label_selector=self.label_selector,
                transform=_slim,
                read_timeout=hub.options.watch_read_timeout,
            )

            async def answer() -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
                read = await self._read_changed(informer.view())
                return self._desired(informer.view(), read)

            await self.follow(aware, [informer], answer, watchers=watchers)

    async def _follow_access_file(self, look_again: Callable[[], None]) -> None:
        """Read the provider file again when it changes; keep the last good one while it does not read."""
        path = self._access_path
        assert path is not None
        while True:
            await asyncio.sleep(self._access_poll_interval)  # a poll, as kubelet's file sources do
            if await asyncio.to_thread(_stamp, path) == self._access_stamp:
                continue
            try:
                stamp, access = await asyncio.to_thread(_load, path)
            except AccessConfigError as error:
                self._access_stamp = await asyncio.to_thread(_stamp, path)  # reported once per version
                version = _version(self._access_stamp)
                self._access_error = SourceStatus(
                    "ProviderFile", str(path), version=version, error=str(error), stale=True
                )
                log.warning("%s: %s; keeping the provider file last read", self._owner, error)
                continue
            self._access_stamp, self.access, self._access_error = stamp, access, None
            # Every profile's version was read with the old file: _current() reads each again.
            log.info("%s: provider file %s changed; reading every profile with it", self._owner, path)
            look_again()

    async def _read_changed(self, profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, _Version]:
        """Read every profile version not read yet, in a thread: measuring and building cost CPU."""
        changed = {
            key: profile
            for key, profile in profiles.items()
            if not self._current(self._versions.get(key), profile)
        }
        if not changed:
            return {}
        return await asyncio.to_thread(lambda: {key: self._read(key, p) for key, p in changed.items()})

    def _read(self, key: str, profile: Mapping[str, Any]) -> _Version:
        config = self.access  # one provider file for the whole read, even if a new one arrives
        assert config is not None
        ready = self._is_ready(key, profile)
        version = resource_version(profile)
        try:
            access = read_access(key, profile, config, trust=self._trust, limits=self.limits)
        except ProfileError as error:
            if not ready and not _offers_access(profile):
                # Just created: its manager has not published status yet. Waiting, not failing.
                return _Version(version, ready, None, None, config)
            return _Version(version, ready, None, str(error), config)
        except Exception as error:  # a shape no check foresaw: name the type, quote nothing
            message = f"ClusterProfile {key}: not usable ({type(error).__name__})"
            return _Version(version, ready, None, message, config)
        return _Version(version, ready, access, None, config)

    def _current(self, version: _Version | None, profile: Mapping[str, Any]) -> bool:
        """Whether ``version`` is this profile's version, read with the provider file now in use."""
        return (
            version is not None
            and version.resource_version == resource_version(profile)
            and version.read_with is self.access
        )

    def _is_ready(self, key: str, profile: Mapping[str, Any]) -> bool:
        try:
            return bool(self._ready(profile))
        except Exception as error:
            log.warning("%s: ClusterProfile %s: the readiness check failed: %s", self._owner, key, error)
            return False

    def _desired(
        self, profiles: Mapping[str, Mapping[str, Any]], read: Mapping[str, _Version]
    ) -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
        """The clusters the profiles ask for, and what became of every profile.

        A profile is engaged when ready, or when it already was (not ready is
        not gone), on its current access if usable, else on its last good
        one. Only an absent or deleting profile gives its cluster up.
        """
        live = {
            key: profile
            for key, profile in profiles.items()
            if not (profile.get("metadata") or {}).get("deletionTimestamp")
        }
        for key in [key for key in self._versions if key not in live]:
            del self._versions[key]
        self._last_good.retain(live)
        desired: dict[str, mcr.ClusterConfig] = {}
        statuses: dict[str, SourceStatus] = {}
        reported = self.sources()  # as last published: each new error is logged once
        for key, profile in sorted(live.items()):
            version = self._versions.get(key)
            if version is None or not self._current(version, profile):
                version = read.get(key)
                if version is None or not self._current(version, profile):
                    version = self._read(key, profile)  # arrived (or a new file did) since the threaded read
                self._versions[key] = version
                if version.error is not None:
                    previous = reported.get(key)
                    if previous is None or previous.error != version.error:
                        keeping = "; keeping its last good connection" if key in self._last_good else ""
                        log.warning("%s: %s%s", self._owner, version.error, keeping)
            # Not ready is not gone: an engaged profile stays engaged on its usable access.
            usable = version.access if version.ready or key in self._last_good else None
            chosen = self._last_good.keep(key, usable)
            if chosen is not None:
                desired[key] = chosen.config
            detail = {"ready": "true" if version.ready else "false"}
            if chosen is not None:
                detail["access_provider"] = chosen.provider
            statuses[key] = SourceStatus(
                "ClusterProfile",
                key,
                cluster=key,
                engaged=chosen is not None,
                version=version.resource_version,
                error=version.error,
                stale=chosen is not None and version.access is not chosen,
                detail=detail,
            )
        return desired, statuses


def _stamp(path: str | os.PathLike[str]) -> tuple[int, int, int] | None:
    """What changes when the file is written or replaced: inode, size, modification time."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (status.st_ino, status.st_size, status.st_mtime_ns)


def _version(stamp: tuple[int, int, int] | None) -> str | None:
    return None if stamp is None else f"{stamp[0]}-{stamp[1]}-{stamp[2]}"


def _load(path: str | os.PathLike[str]) -> tuple[tuple[int, int, int] | None, AccessConfig]:
    """The file's stamp, taken before reading (a write during the read is seen next time), and its config."""
    stamp = _stamp(path)
    return stamp, AccessConfig.load(path)


def _offers_access(profile: Mapping[str, Any]) -> bool:
    status = profile.get("status")
    return isinstance(status, Mapping) and bool(
        status.get("accessProviders") or status.get("credentialProviders")
    )


def _slim(profile: dict[str, Any]) -> dict[str, Any]:
    """Keep what the provider reads: metadata it needs, the spec, and the status (no managedFields)."""
    metadata = profile.get("metadata") or {}
    return {
        "apiVersion": profile.get("apiVersion", CLUSTER_PROFILE.api_version),
        "kind": profile.get("kind", "ClusterProfile"),
        "metadata": {key: metadata[key] for key in _KEPT_METADATA if key in metadata},
        "spec": profile.get("spec") or {},
        "status": profile.get("status") or {},
    }
