"""The KubeFed provider: members registered as KubeFedCluster objects on a hub.

It watches ``KubeFedCluster`` objects and the Secrets of the KubeFed namespace
on the hub, and keeps a :class:`mcruntime.provider.ClusterSet` equal to them. Only the
object's deletion (or a deletionTimestamp) removes a member: a missing or
unreadable Secret keeps the last good token, so ``kubefedctl unjoin``, which
deletes the Secret first, still disengages the member when the object goes. A
rotated token in the Secret is swapped in place without restarting caches.

KubeFed may be installed after the controller: a hub without the CRD is waited
for (reported by :attr:`KubeFedProvider.waiting`) instead of ending the manager.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.cache import Informer
from mcruntime.provider import HubProvider, KindNotInstalled, SourceStatus, resource_version, secret_key_only

from ._config import MemberConfigError, member_config, token_of

log = logging.getLogger("mcruntime_kubefed")

KUBEFED_CLUSTER = mcr.Kind("core.kubefed.io/v1beta1", "KubeFedCluster")
SECRET = mcr.Kind("v1", "Secret")
DEFAULT_NAMESPACE = "kube-federation-system"
MAX_TOKEN_BYTES = 64 * 1024
"""A token Secret's ``token`` above this (decoded) is refused: bearer tokens are a few KiB at most."""


class KubeFedNotInstalled(KindNotInstalled):
    """The hub serves no ``KubeFedCluster`` (``core.kubefed.io/v1beta1``): KubeFed is not installed.

    Raised by :meth:`KubeFedProvider.run` only with ``wait_for_crd=False``;
    by default the provider waits for the CRD instead.
    """


class KubeFedProvider(HubProvider):
    """Engages every member cluster registered with KubeFed on the hub.

    Args:
        hub: The KubeFed host cluster: a config (the provider opens and closes
            its connection) or a running :class:`mcruntime.Cluster` the caller owns.
        namespace: The KubeFed system namespace, where KubeFedClusters and their
            token Secrets live.
        wait_for_ready: Engage a member only once KubeFed's ``Ready`` condition
            is ``True``. Off by default: the conditions are written only while
            KubeFed's controller runs, so they are hints.
        allow_insecure: Accept ``disabledTLSValidations: ["*"]`` (and http
            endpoints), with a warning. Off by default.
        options: Options of every member (and of the hub connection).
        probe_interval: Seconds between health probes of each member.
        wait_for_crd: On a hub without the KubeFedCluster CRD, wait for it
            (reported by :attr:`waiting`; the manager keeps running) rather
            than raise :class:`KubeFedNotInstalled`.
        crd_backoff: How often a missing CRD is looked for again (default: 1 s
            doubling to 30 s).
        retry_backoff: How long a failed discovery pass waits before the next.

    Reports (from :class:`mcruntime.provider.HubProvider`): ``sources()``
    holds one ``SourceStatus`` per KubeFedCluster, by name (``version`` its
    resourceVersion; ``detail``: ``secret_version``, and ``waiting`` while
    ``wait_for_ready`` holds it back, which is not an error), and the CRD while
    KubeFed is not installed (also :attr:`waiting`).
    """

    not_installed = KubeFedNotInstalled

    def __init__(
        self,
        hub: mcr.ClusterConfig | mcr.Cluster,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        wait_for_ready: bool = False,
        allow_insecure: bool = False,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        wait_for_crd: bool = True,
        crd_backoff: mcr.Backoff | None = None,
        retry_backoff: mcr.Backoff | None = None,
    ) -> None:
        self.namespace = namespace
        self.wait_for_ready = wait_for_ready
        self.allow_insecure = allow_insecure
        self._owner = f"kubefed members in {namespace!r}"
        super().__init__(
            hub,
            self._owner,
            options=options,
            probe_interval=probe_interval,
            wait_for_crd=wait_for_crd,
            crd_backoff=crd_backoff,
            retry_backoff=retry_backoff,
        )
        self._kept = mcrp.LastGoodConfigs(self._owner, log)
        self._insecure: dict[str, str] = {}
        """Members warned of as unverified, with their endpoint then: one warning until either changes."""

    def rbac_rules(self) -> list[mcr.Permission]:
        """On the hub: read KubeFedClusters and their token Secrets in the federation namespace."""
        why = "KubeFedProvider: KubeFedClusters and their token Secrets"
        return [
            mcr.Permission(
                KUBEFED_CLUSTER, ("get", "list", "watch"), "hub", namespace=self.namespace, reason=why
            ),
            mcr.Permission(SECRET, ("get", "list", "watch"), "hub", namespace=self.namespace, reason=why),
        ]

    def __repr__(self) -> str:
        return f"<KubeFedProvider namespace={self.namespace!r} clusters={self.clusters.names()}>"

    # Reporting comes from HubProvider: sources() holds one SourceStatus per
    # KubeFedCluster (by name; version is its resourceVersion; detail has
    # "secret_version" and "waiting" for the Ready condition), and the CRD while
    # KubeFed is not installed (see waiting).

    async def run(self, aware: mcr.Aware) -> None:
        """Watch KubeFedClusters and Secrets and keep the members engaged until cancelled.

        On a hub without the KubeFed CRD, waits for it (see :attr:`waiting`);
        with ``wait_for_crd=False``, raises :class:`KubeFedNotInstalled` at once.
        """
        async with self.connect() as hub:
            crd = "kubefedclusters.core.kubefed.io"
            await self.served_kind(hub, [KUBEFED_CLUSTER], what="KubeFed", crd=crd)
            read_timeout = hub.options.watch_read_timeout
            members = Informer(
                hub.client, KUBEFED_CLUSTER, namespace=self.namespace, read_timeout=read_timeout
            )
            secrets = Informer(
                hub.client,
                SECRET,
                namespace=self.namespace,
                transform=secret_key_only("token"),
                read_timeout=read_timeout,
            )

            def answer() -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
                return self._desired(members.view(), secrets.view())

            await self.follow(aware, [members, secrets], answer)

    def _desired(
        self, objects: Mapping[str, Mapping[str, Any]], secrets: Mapping[str, Mapping[str, Any]]
    ) -> tuple[dict[str, mcr.ClusterConfig], dict[str, SourceStatus]]:
        desired: dict[str, mcr.ClusterConfig] = {}
        statuses: dict[str, SourceStatus] = {}
        reported = self.sources()  # as last published: each new error is logged once
        live_names = set()
        for obj in objects.values():
            metadata = obj.get("metadata") or {}
            name = str(metadata.get("name", ""))
            if not name or metadata.get("deletionTimestamp"):
                continue  # deleting: gone, whatever its Secret says
            live_names.add(name)
            config, error = self._config(name, obj, secrets)
            waiting = None
            if error == _NOT_READY:
                waiting, error = error, None  # not a failure: KubeFed has not said Ready yet
            secret_ref = str((obj.get("spec") or {}).get("secretRef", {}).get("name", ""))
            secret = secrets.get(f"{self.namespace}/{secret_ref}")
            detail = {"waiting": waiting} if waiting is not None else {}
            if secret is not None:
                detail["secret_version"] = resource_version(secret)
            chosen, statuses[name] = self._kept.judge(
                "KubeFedCluster",
                name,
                config,
                error,
                previous=reported.get(name),
                version=resource_version(obj),
                detail=detail,
            )
            if chosen is not None:
                desired[name] = chosen
        self._kept.retain(live_names)
        self._insecure = {name: server for name, server in self._insecure.items() if name in live_names}
        return desired, statuses

    def _config(
        self, name: str, obj: Mapping[str, Any], secrets: Mapping[str, Mapping[str, Any]]
    ) -> tuple[mcr.ClusterConfig | None, str | None]:
        spec = obj.get("spec") or {}
        if self.wait_for_ready and not _ready(obj) and name not in self._kept:
            return None, _NOT_READY
        secret_name = (spec.get("secretRef") or {}).get("name")
        if not secret_name:
            return None, "spec.secretRef.name is empty"
        secret = secrets.get(f"{self.namespace}/{secret_name}")
        encoded = str(((secret or {}).get("data") or {}).get("token") or "")
        if len(encoded) // 4 * 3 > MAX_TOKEN_BYTES:
            return None, (
                f"Secret {self.namespace}/{secret_name} key 'token' is larger than the limit of "
                f"{MAX_TOKEN_BYTES} bytes; not used"
            )
        try:
            token = token_of(secret, f"Secret {self.namespace}/{secret_name}")
            config = member_config(
                name,
                spec,
                token,
                allow_insecure=self.allow_insecure,
                token_from=f"Secret {self.namespace}/{secret_name} key 'token'",
            )
        except MemberConfigError as error:
            return None, str(error)
        self._warn_if_insecure(name, config)
        return config, None

    def _warn_if_insecure(self, name: str, config: mcr.ClusterConfig) -> None:
        """Warn once that ``name`` is not verified, again only after it was verified or moved.

        Every Secret event in the namespace makes a discovery pass over every
        member: a warning per pass would be a stream of them on a busy namespace.
        """
        if not config.insecure:
            self._insecure.pop(name, None)
        elif self._insecure.get(name) != config.server:
            self._insecure[name] = config.server
            log.warning("%s: KubeFedCluster %s: TLS verification is off for this member", self._owner, name)


_NOT_READY = "waiting for KubeFed's Ready condition"


def _ready(obj: Mapping[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
