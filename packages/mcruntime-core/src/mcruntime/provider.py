"""The provider author's kit: everything needed to write a provider, in one place.

A provider turns an outside source of truth (files, Secrets, Cluster API
objects, a cloud's API) into engaged clusters. Start from
:class:`ClusterSetProvider` (or :class:`HubProvider`, for a provider that
watches objects on a hub whose CRD may be installed late): put what the source
says into ``self.clusters`` and the base answers the rest of the
:class:`~mcruntime.Provider` protocol the way every other provider does;
report what you read with :meth:`ClusterSetProvider.sources`, one
:class:`SourceStatus` each. Providers that watch a hub use
:func:`hub_connection`, :func:`wait_for_kind` (raising a
:class:`KindNotInstalled` subclass when told not to wait) and
:func:`follow_informers`, read informers through ``Informer.view()``, slim
Secrets with :func:`secret_key_only`, read kubeconfigs out of them with
:func:`secret_kubeconfig`, compare :func:`resource_version` to re-parse only
what changed, and keep a cluster on its last working config through broken
versions with :class:`LastGood`. Run :mod:`mcruntime.testing.conformance`
against the result.
"""

from __future__ import annotations

from ._fleet.clusterset import ClusterSet
from ._fleet.clusterset_provider import Answer, ClusterSetProvider
from ._fleet.follow import KindNotInstalled, follow_informers, hub_connection, wait_for_kind
from ._fleet.hub_provider import HubProvider
from ._fleet.lastgood import LastGood, LastGoodConfigs
from ._fleet.protocols import Aware as Aware  # exported by mcruntime; reachable here too
from ._fleet.protocols import Provider as Provider  # exported by mcruntime; reachable here too
from ._fleet.protocols import ProviderRunnable
from ._fleet.secret_kubeconfig import secret_kubeconfig
from ._fleet.slim import resource_version, secret_key_only
from ._fleet.status import ClusterPhase as ClusterPhase  # exported by mcruntime; reachable here too
from ._fleet.status import ClusterStatus as ClusterStatus  # exported by mcruntime; reachable here too
from ._fleet.status import SourceStatus

__all__ = [
    "Answer",
    "ClusterSet",
    "ClusterSetProvider",
    "HubProvider",
    "KindNotInstalled",
    "LastGood",
    "LastGoodConfigs",
    "ProviderRunnable",
    "SourceStatus",
    "follow_informers",
    "hub_connection",
    "resource_version",
    "secret_key_only",
    "secret_kubeconfig",
    "wait_for_kind",
]
