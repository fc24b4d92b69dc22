"""The base of providers that discover clusters from objects on a hub whose kind may come late.

Cluster API, KubeFed and ClusterProfile providers all take a hub (a config or
a caller's cluster), may find it without their CRD (the product is often
installed after the controller), and retry failed passes. What they take for
that (``wait_for_crd``, ``crd_backoff``, ``retry_backoff``) and what they do
with it (wait for the kind, or raise their :class:`KindNotInstalled` at once)
is the same everywhere, so it lives here once; a provider adds its kinds, its
informers and what it makes of the objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import ClassVar

from .._base.backoff import Backoff
from .._base.kind import Kind
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .clusterset_provider import ClusterSetProvider
from .follow import KindNotInstalled, hub_connection


class HubProvider(ClusterSetProvider):
    """A :class:`ClusterSetProvider` that watches a hub whose CRD may be installed after it starts.

    Args:
        hub: The hub: a config (the provider opens and closes its own
            connection, see :meth:`connect`) or a running :class:`Cluster`
            the caller owns.
        owner: Names the provider in logs and errors.
        options: Options of every cluster (and of the hub connection).
        probe_interval: Seconds between health probes of each cluster.
        wait_for_crd: On a hub serving none of the provider's kinds, wait for
            one (reported by :attr:`waiting`; the manager keeps running)
            rather than raise :attr:`not_installed`.
        crd_backoff: How often a missing CRD is looked for again (default: 1 s
            doubling to 30 s).
        retry_backoff: How long a failed discovery pass waits before the next.

    A subclass sets :attr:`not_installed` to its own :class:`KindNotInstalled`
    subclass, and from its ``run`` calls :meth:`connect`, :meth:`served_kind`
    and :meth:`~ClusterSetProvider.follow` (which retries after ``retry_backoff``).
    """

    not_installed: ClassVar[type[KindNotInstalled]] = KindNotInstalled
    """What :meth:`served_kind` raises with ``wait_for_crd=False``: the provider's own error."""

    def __init__(
        self,
        hub: ClusterConfig | Cluster,
        owner: str,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
        wait_for_crd: bool = True,
        crd_backoff: Backoff | None = None,
        retry_backoff: Backoff | None = None,
    ) -> None:
        super().__init__(owner, options=options, probe_interval=probe_interval, retry_backoff=retry_backoff)
        self.wait_for_crd = wait_for_crd
        self._hub = hub
        self._options = options
        self._crd_backoff = crd_backoff

    def connect(self) -> AbstractAsyncContextManager[Cluster]:
        """The hub connection (see :func:`hub_connection`): the provider's own, or the caller's cluster."""
        connection = hub_connection(self._hub, f"{self.owner} (hub)", self._options)
        return self.watching(connection, own=not isinstance(self._hub, Cluster))

    async def served_kind(self, hub: Cluster, candidates: Sequence[Kind], *, what: str, crd: str) -> Kind:
        """The first of ``candidates`` the hub serves: waited for, or :attr:`not_installed` at once.

        Which one depends on ``wait_for_crd``; the wait is reported as in
        :meth:`ClusterSetProvider.wait_for_kind` and looks again after ``crd_backoff``.
        """
        return await self.wait_for_kind(
            hub,
            candidates,
            what=what,
            crd=crd,
            backoff=self._crd_backoff,
            wait=self.wait_for_crd,
            not_installed=self.not_installed,
        )
