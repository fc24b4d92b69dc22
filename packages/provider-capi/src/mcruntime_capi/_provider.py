"""The Cluster API provider: workload clusters of a management (hub) cluster.

It watches ``cluster.x-k8s.io`` ``Cluster`` objects in whichever of v1beta2 and
v1beta1 the hub serves (discovered, never assumed), and the kubeconfig Secrets
Cluster API writes for them (``<cluster>-kubeconfig``, key ``value``, label
``cluster.x-k8s.io/cluster-name``), and keeps a :class:`mcruntime.provider.ClusterSet`
equal to the ready ones. Only a deleted or deleting Cluster gives up its
workload cluster: a missing or malformed Secret keeps the last good kubeconfig
and is reported, and a rotated one is followed (a new token swapped in place).

Cluster API is often installed after the controller that uses it, so a hub
without the CRD is waited for (reported by :attr:`ClusterAPIProvider.waiting`)
rather than ending the manager. Kubeconfig Secrets are input we do not
control: each version is parsed once, in a thread, and refused above a size.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.cache import Informer
from mcruntime.provider import (
    HubProvider,
    KindNotInstalled,
    SourceStatus,
    resource_version,
    secret_key_only,
    secret_kubeconfig,
)

log = logging.getLogger("mcruntime_capi")

GROUP = "cluster.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
SECRET = mcr.Kind("v1", "Secret")
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
MAX_KUBECONFIG_BYTES = 1024 * 1024
"""Default size limit of a kubeconfig Secret's ``value`` (decoded): what a Secret can hold at most."""

Readiness = Callable[[Mapping[str, Any], str], bool]
"""``ready(cluster_object, api_version)``: may the workload cluster be engaged?"""


class ClusterAPINotInstalled(KindNotInstalled):
    """The hub serves no ``cluster.x-k8s.io`` Cluster in v1beta2 or v1beta1.

    Raised by :meth:`ClusterAPIProvider.run` only with ``wait_for_crd=False``;
    by default the provider waits for the CRD instead.
    """


def control_plane_initialized(obj: Mapping[str, Any], api_version: str) -> bool:
    """The default readiness: the control plane is up, read the way each version says it.

    v1beta2 has ``status.initialization.controlPlaneInitialized``, v1beta1
    ``status.controlPlaneReady``. ``status.phase`` alone is never trusted.
    """
    status = obj.get("status") or {}
    if api_version.endswith("/v1beta2"):
        return bool((status.get("initialization") or {}).get("controlPlaneInitialized"))
    return bool(status.get("controlPlaneReady"))


class ClusterAPIProvider(HubProvider):
    """Engages the workload clusters of a Cluster API management cluster.

    Args:
        hub: The management cluster: a config (the provider connects and
            disconnects) or a running :class:`mcruntime.Cluster` the caller owns.
        namespace: Watch one namespace only (``None``: all namespaces).
        label_selector: Only Clusters with these labels.
        ready: When a Cluster may be engaged (default: its control plane is initialized).
        trust: What a kubeconfig Secret may ask for (untrusted by default).
        options: Options of every workload cluster (and of the hub connection).
        probe_interval: Seconds between health probes of each workload cluster.
        wait_for_crd: On a hub without the Cluster CRD, wait for it (reported by
            :attr:`waiting`, the manager keeps running) rather than raise
            :class:`ClusterAPINotInstalled`.
        max_kubeconfig_bytes: A kubeconfig Secret's ``value`` larger than this
            (decoded) is refused and reported, never parsed.
        crd_backoff: How often a missing CRD is looked for again (default: 1 s
            doubling to 30 s).
        retry_backoff: How long a failed discovery pass waits before the next.

    Reports (from :class:`mcruntime.provider.HubProvider`): ``sources()``
    holds one ``SourceStatus`` per Cluster object, by ``namespace/name``
    (``version`` its resourceVersion; ``detail``: ``ready``,
    ``secret_version`` and ``waiting`` while the control plane is not
    initialized, which is not an error), and the CRD while the hub serves no
    Cluster kind (also :attr:`waiting`).
    """

    not_installed = ClusterAPINotInstalled

    def __init__(
        self,
        hub: mcr.ClusterConfig | mcr.Cluster,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        ready: Readiness = control_plane_initialized,
        trust: mcr.TrustPolicy | None = None,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        wait_for_crd: bool = True,
        max_kubeconfig_bytes: int = MAX_KUBECONFIG_BYTES,
        crd_backoff: mcr.Backoff | None = None,
        retry_backoff: mcr.Backoff | None = None,
    ) -> None:
        if max_kubeconfig_bytes <= 0:
            raise ValueError(f"max_kubeconfig_bytes must be positive, not {max_kubeconfig_bytes}")
        self.namespace = namespace
        self.max_kubeconfig_bytes = max_kubeconfig_bytes
        self.label_selector = label_selector
        self._ready = ready
        self._trust = trust or mcr.TrustPolicy.untrusted()
        self._owner = f"cluster api clusters in {namespace!r}" if namespace else "cluster api clusters"
        super().__init__(
            hub,
            self._owner,
            options=options,
            probe_interval=probe_interval,
            wait_for_crd=wait_for_crd,
            crd_backoff=crd_backoff,
            retry_backoff=retry_backoff,
        )
        self.api_version: str | None = None
        self._kept = mcrp.LastGoodConfigs(self._owner, log)
        # Secret "namespace/name" -> (resourceVersion, config, error): each version is parsed once.
        self._parsed: dict[str, tuple[str, mcr.ClusterConfig | None, str | None]] = {}

    def rbac_rules(self) -> list[mcr.Permission]:
        """On the hub: read Cluster API Clusters and their kubeconfig Secrets (in ``namespace``, or all)."""
        why = "ClusterAPIProvider: Cluster objects and their kubeconfig Secrets"
        return [
            mcr.Permission(
                mcr.Kind(f"{GROUP}/{VERSIONS[0]}", "Cluster"),
                ("get", "list", "watch"),
                "hub",
                namespace=self.namespace,
                reason=why,
            ),
            mcr.Permission(SECRET, ("get", "list", "watch"), "hub", namespace=self.namespace, reason=why),
        ]

    def __repr__(self) -> str:
        return f"<ClusterAPIProvider {self.api_version or GROUP} clusters={self.clusters.names()}>"

    # Reporting comes from HubProvider: sources() holds one SourceStatus per
    # Cluster object ("namespace/name"; version is its resourceVersion; detail has
    # "ready", "secret_version" and "waiting" while the control plane is not
    # initialized), and the CRD while the hub serves no Cluster kind (see waiting).

    async def run(self, aware: mcr.Aware) -> None:
        """Watch Clusters and kubeconfig Secrets until cancelled.

        On a hub that serves no Cluster kind, waits for the CRD (see
        :attr:`waiting`); with ``wait_for_crd=False``, raises
        :class:`ClusterAPINotInstalled` at once instead.
        """
        async with self.connect() as hub:
            candidates = [mcr.Kind(f"{GROUP}/{version}", "Cluster") for version in VERSIONS]
            kind = await self.served_kind(hub, candidates, what="Cluster API", crd=f"clusters.{GROUP}")
            self.api_version = kind.api_version
            read_timeout = hub.options.watch_read_timeout
            clusters = Informer(
                hub.client,
                kind,
                namespace=self.namespace,
                label_selector=self.label_selector,
                read_timeout=read_timeout,
            )
            secrets = Informer(
                hub.client,
                SECRET,
                namespace=self.namespace,
                label_selector=CLUSTER_NAME_LABEL,
                transform=secret_key_only("value"),
                read_timeout=read_timeout,
            )

            async def answer() -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
                await self._parse_changed(secrets.view())
                return self._desired(clusters.view(), secrets.view())

            await self.follow(aware, [clusters, secrets], answer)

    async def _parse_changed(self, secrets: Mapping[str, Mapping[str, Any]]) -> None:
        """Parse the Secret versions not seen yet, in a thread: the event loop never parses YAML."""
        for key in [key for key in self._parsed if key not in secrets]:
            del self._parsed[key]
        fresh = {
            key: secret
            for key, secret in secrets.items()
            if key not in self._parsed or self._parsed[key][0] != resource_version(secret)
        }
        if not fresh:
            return
        parsed = await asyncio.to_thread(
            lambda: {key: self._parse(key, secret) for key, secret in fresh.items()}
        )
        for key, (config, error) in parsed.items():
            self._parsed[key] = (resource_version(fresh[key]), config, error)

    def _desired(
        self, objects: Mapping[str, Mapping[str, Any]], secrets: Mapping[str, Mapping[str, Any]]
    ) -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
        desired: dict[str, mcr.ClusterConfig] = {}
        statuses: dict[str, SourceStatus] = {}
        reported = self.sources()  # as last published: each new error is logged once
        live = set()
        for key, obj in objects.items():
            metadata = obj.get("metadata") or {}
            if metadata.get("deletionTimestamp"):
                continue  # deleting: let go now, whatever finalizers still hold the object
            live.add(key)
            namespace, name = str(metadata.get("namespace", "")), str(metadata.get("name", ""))
            ready, unknown = self._is_ready(obj)
            secret = secrets.get(f"{namespace}/{name}-kubeconfig")
            config, error = (None, unknown) if not ready else self._config(key, secret)
            detail = {"ready": "true" if ready else "false"}
            if not ready and unknown is None:  # waiting, not failing: Cluster API has not initialized it yet
                detail["waiting"] = "waiting for the control plane to be initialized"
            if secret is not None:
                detail["secret_version"] = resource_version(secret)
            version = resource_version(obj)
            chosen, statuses[key] = self._kept.judge(  # not ready is not gone: the last good config stays
                "Cluster", key, config, error, previous=reported.get(key), version=version, detail=detail
            )
            if chosen is not None:
                desired[key] = chosen
        self._kept.retain(live)
        return desired, statuses

    def _is_ready(self, obj: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Whether the Cluster may be engaged; when the check itself failed, also why.

        A failed check is an error of this Cluster's source, named and logged once
        with it like any other, not a wait for a control plane.
        """
        try:
            return self._ready(obj, str(obj.get("apiVersion") or self.api_version or "")), None
        except Exception as error:
            return False, f"the readiness check failed: {type(error).__name__}: {error}"

    def _config(
        self, key: str, secret: Mapping[str, Any] | None
    ) -> tuple[mcr.ClusterConfig | None, str | None]:
        secret_key = f"{key}-kubeconfig"
        if secret is None:
            return None, f"Secret {secret_key} does not exist (yet)"
        parsed = self._parsed.get(secret_key)
        if parsed is None or parsed[0] != resource_version(secret):
            return self._parse(secret_key, secret)  # not parsed ahead (a direct call): parse now
        return parsed[1], parsed[2]

    def _parse(
        self, secret_key: str, secret: Mapping[str, Any]
    ) -> tuple[mcr.ClusterConfig | None, str | None]:
        """One Secret version as a config, or why not; messages name the Secret and never quote it."""
        encoded = (secret.get("data") or {}).get("value")
        if not encoded:
            return None, f"Secret {secret_key} has no key 'value'"
        where = f"Secret {secret_key} key 'value'"
        return secret_kubeconfig(encoded, where=where, trust=self._trust, max_bytes=self.max_kubeconfig_bytes)
