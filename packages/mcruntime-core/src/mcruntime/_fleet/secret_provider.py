"""Clusters from kubeconfigs kept in labelled Secrets on a hub cluster.

A platform team registers a cluster by writing a Secret into one namespace of
the hub: the kubeconfig under one key, a label that says "this is a cluster".
The provider watches those Secrets (that namespace, that label, nothing else)
and keeps the engaged fleet equal to them: a new Secret engages a cluster, a
changed kubeconfig re-engages it (a rotated token is swapped in place), a
deleted, deleting or unlabelled Secret disengages it. A Secret that cannot be
used is reported by its namespace/name and never takes a working cluster down:
the last kubeconfig that worked stays in use. A Secret's content is input we do
not control: each version is parsed once, in a worker thread, and a value
above a size limit is refused without being decoded or parsed.

This module is also the worked example of the guide ``docs/guides/writing-a-provider.md`` (repository root),
which quotes the regions between ``--8<--`` markers; a test keeps the guide
and this file identical. Everything it uses is public API of ``mcruntime``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._base.kind import Kind
from .._base.permissions import READ, Permission
from .._cache.informer import Informer
from .._config.kubeconfig import ClusterConfig, TrustPolicy
from .cluster import Cluster, ClusterOptions
from .clusterset_provider import ClusterSetProvider
from .follow import hub_connection
from .lastgood import LastGood
from .protocols import Aware
from .secret_kubeconfig import secret_kubeconfig
from .slim import resource_version
from .status import SourceStatus

log = logging.getLogger("mcruntime.providers.secrets")

SECRET = Kind("v1", "Secret")
DEFAULT_LABEL_SELECTOR = "mcruntime.dev/kubeconfig=true"
MAX_KUBECONFIG_BYTES = 1024 * 1024  # decoded; as much as a Secret can hold
NameFrom = Callable[[Mapping[str, Any]], str | None]

# Metadata the provider keeps of each Secret; everything else is dropped on arrival.
_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp")
# kubectl apply stores the whole object, data included, in this annotation.
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def secret_name(secret: Mapping[str, Any]) -> str | None:
    """The default cluster name: the Secret's own name (unique in its namespace)."""
    name = (secret.get("metadata") or {}).get("name")
    return name if isinstance(name, str) else None


@dataclass(frozen=True)
class _Version:
    """What one resourceVersion of one Secret says: a name and a config, or why not."""

    resource_version: str
    created: str
    cluster: str | None
    config: ClusterConfig | None
    error: str | None


# --8<-- [start:provider]
class KubeconfigSecretProvider(ClusterSetProvider):
    """Engages one cluster per labelled kubeconfig Secret in a namespace of the hub.

    Args:
        hub: Where the Secrets live: a config (the provider opens and closes its
            own connection) or a running :class:`Cluster` the caller owns.
        namespace: The one namespace watched; the provider needs ``list`` and
            ``watch`` on Secrets there, nothing cluster-wide.
        label_selector: Which Secrets are clusters. Removing the label
            disengages the cluster, like deleting the Secret.
        key: The data key holding the kubeconfig (its current context is used).
        trust: What a kubeconfig may ask for. Untrusted by default: a Secret
            cannot make the controller run a program or skip TLS verification.
        name_from: The cluster name of a Secret (its metadata, labels and
            annotations are there); the Secret's name by default. Two Secrets
            claiming one name are reported, and the first keeps it.
        options: Options of every engaged cluster (and of the hub connection).
        probe_interval: Seconds between health probes of each cluster.
        max_kubeconfig_bytes: A kubeconfig larger than this (decoded) is
            refused and reported, never parsed.
    """

    def __init__(
        self,
        hub: ClusterConfig | Cluster,
        namespace: str,
        *,
        label_selector: str = DEFAULT_LABEL_SELECTOR,
        key: str = "kubeconfig",
        trust: TrustPolicy | None = None,
        name_from: NameFrom = secret_name,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
        max_kubeconfig_bytes: int = MAX_KUBECONFIG_BYTES,
    ) -> None:
        if not namespace:
            raise ValueError("KubeconfigSecretProvider watches one namespace; name it")
        if max_kubeconfig_bytes <= 0:
            raise ValueError(f"max_kubeconfig_bytes must be positive, not {max_kubeconfig_bytes}")
        self.max_kubeconfig_bytes = max_kubeconfig_bytes
        self.namespace = namespace
        self.label_selector = label_selector
        self.key = key
        self._hub = hub
        self._trust = trust or TrustPolicy.untrusted()
        self._name_from = name_from
        self._options = options
        self._owner = f"kubeconfig secrets in {namespace!r}"
        super().__init__(self._owner, options=options, probe_interval=probe_interval)
        self._versions: dict[str, _Version] = {}  # by "namespace/name": the latest version read
        self._last_good: LastGood[tuple[str, ClusterConfig]] = LastGood()  # by Secret: name and config
        self._holders: dict[str, str] = {}  # cluster name -> the Secret providing it

    def __repr__(self) -> str:
        return f"<KubeconfigSecretProvider namespace={self.namespace!r} clusters={self.clusters.names()}>"

    # Reporting comes from ClusterSetProvider: get, index_field, statuses, and
    # sources(), one SourceStatus per Secret ("namespace/name"), as published by follow().

    # --8<-- [end:provider]

    def rbac_rules(self) -> list[Permission]:
        """List and watch the kubeconfig Secrets in the one namespace, on the hub."""
        reason = f"{type(self).__name__}: kubeconfig Secrets"
        return [Permission(SECRET, READ, "hub", namespace=self.namespace, reason=reason)]

    # --8<-- [start:run]
    async def run(self, aware: Aware) -> None:
        """Watch the Secrets and keep the engaged clusters equal to them until cancelled."""
        connection = hub_connection(self._hub, f"{self._owner} (hub)", self._options)
        async with self.watching(connection, own=not isinstance(self._hub, Cluster)) as hub:
            informer = Informer(
                hub.client,
                SECRET,
                namespace=self.namespace,
                label_selector=self.label_selector,
                transform=self._slim,
                read_timeout=hub.options.watch_read_timeout,
            )

            async def answer() -> tuple[dict[str, ClusterConfig], dict[str, SourceStatus]]:
                read = await self._read_changed(informer.view())  # parsed in a thread
                return self._desired(informer.view(), read)

            await self.follow(aware, [informer], answer)

    # --8<-- [end:run]

    def _slim(self, secret: dict[str, Any]) -> dict[str, Any]:
        """Keep only what the provider reads: less memory, and no other key's secrets."""
        metadata = secret.get("metadata") or {}
        kept: dict[str, Any] = {field: metadata[field] for field in _KEPT_METADATA if field in metadata}
        for field in ("labels", "annotations"):
            if metadata.get(field):
                kept[field] = {k: v for k, v in metadata[field].items() if k != _LAST_APPLIED}
        data = secret.get("data") or {}
        return {
            "apiVersion": secret.get("apiVersion", "v1"),
            "kind": secret.get("kind", "Secret"),
            "metadata": kept,
            "data": {self.key: data[self.key]} if self.key in data else {},
        }

    # --8<-- [start:desired]
    async def _read_changed(self, secrets: Mapping[str, Mapping[str, Any]]) -> dict[str, _Version]:
        """Parse every Secret version not read yet, in a thread: YAML never runs on the event loop."""
        changed = {
            key: secret
            for key, secret in secrets.items()
            if key not in self._versions or self._versions[key].resource_version != resource_version(secret)
        }
        if not changed:
            return {}
        return await asyncio.to_thread(lambda: {key: self._read(key, s) for key, s in changed.items()})

    def _desired(
        self, secrets: Mapping[str, Mapping[str, Any]], read: Mapping[str, _Version]
    ) -> tuple[dict[str, ClusterConfig], dict[str, SourceStatus]]:
        """The clusters the Secrets ask for, and what became of every Secret.

        ``read`` holds the versions parsed ahead; a version that arrived since
        is parsed here. Only an absent or deleting Secret gives up its
        cluster; one that fails to parse keeps serving its last good kubeconfig.
        """
        live = {
            key: secret
            for key, secret in secrets.items()
            if not (secret.get("metadata") or {}).get("deletionTimestamp")
        }
        for key in [key for key in self._versions if key not in live]:
            del self._versions[key]
            self._last_good.forget(key)
        claims: dict[str, list[str]] = {}
        for key, secret in sorted(live.items()):
            version = self._versions.get(key)
            if version is None or version.resource_version != resource_version(secret):
                version = read.get(key)
                if version is None or version.resource_version != resource_version(secret):
                    version = self._read(key, secret)
                self._versions[key] = version
                if version.cluster is not None and version.config is not None:
                    self._last_good.keep(key, (version.cluster, version.config))
                elif version.error is not None:
                    keeping = self._last_good.keeping(key, "kubeconfig")
                    log.warning("%s: %s (%s)", self._owner, version.error, keeping)
            usable = self._usable(key)
            if usable is not None:
                claims.setdefault(usable[0], []).append(key)

        desired: dict[str, ClusterConfig] = {}
        holders: dict[str, str] = {}
        for cluster, keys in claims.items():
            holder = self._holders.get(cluster)
            if holder not in keys:  # the first claimant keeps a name; else the oldest Secret
                holder = min(keys, key=lambda key: (self._versions[key].created, key))
            holders[cluster] = holder
            usable = self._usable(holder)
            assert usable is not None
            desired[cluster] = usable[1]
        self._holders = holders
        return desired, self._report(live, holders)

    def _usable(self, key: str) -> tuple[str, ClusterConfig] | None:
        """The name and config this Secret provides: its current version's, or its last good one."""
        version = self._versions[key]
        if version.cluster is not None and version.config is not None:
            return version.cluster, version.config
        return self._last_good.get(key)

    # --8<-- [end:desired]

    def _report(
        self, live: Mapping[str, Mapping[str, Any]], holders: Mapping[str, str]
    ) -> dict[str, SourceStatus]:
        """A status per Secret; each newly found duplicate is logged once."""
        statuses: dict[str, SourceStatus] = {}
        reported = self.sources()  # as last published: each new duplicate is logged once
        for key in sorted(live):
            version = self._versions[key]
            usable = self._usable(key)
            cluster = usable[0] if usable is not None else version.cluster
            holder = holders.get(cluster) if cluster is not None else None
            duplicate_of = holder if holder is not None and holder != key else None
            error = version.error
            if duplicate_of is not None:
                error = f"Secret {key}: cluster name {cluster!r} is already provided by Secret {duplicate_of}"
                previous = reported.get(key)
                if previous is None or previous.detail.get("duplicate_of") != duplicate_of:
                    log.warning("%s: %s; this Secret is ignored", self._owner, error)
            statuses[key] = SourceStatus(
                "Secret",
                key,
                cluster=cluster,
                engaged=holder == key,
                version=version.resource_version,
                error=error,
                stale=holder == key and version.config is None,
                detail={"duplicate_of": duplicate_of} if duplicate_of is not None else {},
            )
        return statuses

    # --8<-- [start:read]
    def _read(self, key: str, secret: Mapping[str, Any]) -> _Version:
        """Parse one Secret version; every failure becomes a message that names the Secret.

        Messages never quote the Secret's content: a YAML error says where,
        not what, and kubeconfig errors are secret-free by construction.
        """
        metadata = secret.get("metadata") or {}
        rv, created = resource_version(secret), str(metadata.get("creationTimestamp", ""))

        def failed(message: str, cluster: str | None = None) -> _Version:
            return _Version(rv, created, cluster, None, f"Secret {key}: {message}")

        try:
            cluster = self._name_from(secret)
        except Exception as error:
            return failed(f"name_from failed: {type(error).__name__}: {error}")
        if not cluster:
            return failed("name_from gave no cluster name")
        encoded = (secret.get("data") or {}).get(self.key)
        if not encoded:
            return failed(f"has no data key {self.key!r}", cluster)
        where, limit = f"Secret {key} key {self.key!r}", self.max_kubeconfig_bytes
        config, problem = secret_kubeconfig(encoded, where=where, trust=self._trust, max_bytes=limit)
        return _Version(rv, created, cluster, config, problem)

    # --8<-- [end:read]
