"""The namespace provider against a real API server: runtime changes, scoping, one informer, conformance."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import aiohttp
import pytest
import pytest_asyncio

import mcruntime as mcr
from mcruntime.cache import field_getter
from mcruntime.testing import ControlPlane, Fleet
from mcruntime.testing import running as run_manager
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
    Target,
    wait_until,
)
from mcruntime_namespace import NAMESPACE, NamespaceProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
SELECT = "test.mcruntime.dev/namespace-provider"
OPTIONS = dataclasses.replace(CLUSTER_OPTIONS, health_probe_interval=PROBE_INTERVAL)


class Host:
    """One control plane as the provider's host, and an admin client that edits its namespaces.

    Every namespace made here carries ``SELECT=<token>``, so tests on the shared
    control plane never select each other's namespaces.
    """

    def __init__(self, plane: ControlPlane, admin: mcr.Cluster) -> None:
        self.plane = plane
        self.admin = admin
        self.token = uuid.uuid4().hex[:8]
        self.made: list[str] = []

    def name(self, short: str) -> str:
        return f"nsp-{self.token}-{short}"

    def provider(self, **kwargs: Any) -> NamespaceProvider:
        config = mcr.kubeconfig_from_dict(self.plane.kubeconfig(self.plane.token_user), origin="host")
        return NamespaceProvider(config, label_selector={SELECT: self.token}, options=OPTIONS, **kwargs)

    async def namespace(self, name: str, *, selected: bool = True) -> str:
        labels = {SELECT: self.token} if selected else {SELECT: "someone-else"}
        await self.admin.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
        )
        self.made.append(name)
        return name

    async def label(self, name: str, value: str | None) -> None:
        await self.admin.client.patch(NAMESPACE, name, {"metadata": {"labels": {SELECT: value}}})

    async def close(self) -> None:
        for name in self.made:
            with contextlib.suppress(mcr.NotFound):
                await self.admin.client.delete(NAMESPACE, name)


@pytest_asyncio.fixture
async def host(fleet: Fleet) -> AsyncIterator[Host]:
    plane = fleet["cluster-1"]
    config = mcr.kubeconfig_from_dict(plane.kubeconfig(), origin="admin")
    async with mcr.Cluster("nsp-admin", config) as admin:
        made = Host(plane, admin)
        try:
            yield made
        finally:
            await made.close()


class Recorder:
    """A reconciler on ConfigMaps that records, per cluster, the requests and what its cache and client list."""

    def __init__(self, manager: mcr.Manager) -> None:
        self.manager = manager
        self.requests: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)
        self.cached: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)
        self.listed: defaultdict[str, set[tuple[str, str]]] = defaultdict(set)

    async def __call__(self, request: mcr.Request) -> None:
        cluster = await self.manager.get_cluster(request.cluster)
        # Written for whole clusters: no namespace anywhere.
        for obj in await cluster.cache.list(CONFIGMAP):
            self.cached[request.cluster].add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        for obj in (await cluster.client.list(CONFIGMAP)).items:
            self.listed[request.cluster].add((obj["metadata"]["namespace"], obj["metadata"]["name"]))
        self.requests[request.cluster].add((request.namespace or "", request.name))  # last: all recorded


@asynccontextmanager
async def running(provider: NamespaceProvider) -> AsyncIterator[tuple[mcr.Manager, Recorder]]:
    manager = mcr.Manager(provider, handle_signals=False)
    recorder = Recorder(manager)
    mcr.controller_managed_by(manager).named("recorder").for_(CONFIGMAP).complete(recorder)
    async with run_manager(manager, tasks_must_end=False):
        yield manager, recorder


def host_of(provider: NamespaceProvider) -> mcr.Cluster | None:
    return provider.host  # read afresh: a type checker narrows ``provider.host`` for good


def engaged(manager: mcr.Manager) -> set[str]:
    return {name for name in manager.clusters() if name != mcr.LOCAL_CLUSTER}


async def test_namespaces_engage_and_disengage_at_runtime(host: Host) -> None:
    first = await host.namespace(host.name("a"))
    await host.namespace(host.name("unselected"), selected=False)
    provider = host.provider()
    async with running(provider) as (manager, _recorder):
        await wait_until(lambda: engaged(manager) == {first}, what="the first namespace engaged")
        # Created at runtime: engaged.
        second = await host.namespace(host.name("b"))
        third = await host.namespace(host.name("c"))
        await wait_until(lambda: engaged(manager) == {first, second, third}, what="new namespaces engaged")
        views = {name: await provider.get(name) for name in (first, second, third)}
        # Deleted (terminating): disengaged, its cluster stopped; the host and the others run on.
        await host.admin.client.delete(NAMESPACE, second)
        await wait_until(lambda: engaged(manager) == {first, third}, what="the deleted namespace disengaged")
        await wait_until(lambda: second not in provider.statuses(), what="its cluster released")
        assert views[second].stopped and len(views[second].tasks) == 0
        assert provider.host is not None
        configmaps = next(i for i in provider.host.cache.informers() if i.kind == CONFIGMAP)
        await wait_until(
            lambda: configmaps.handler_count == 2, what="the controller's handler for it removed"
        )
        with pytest.raises(mcr.ClusterNotFound):
            await provider.get(second)
        # Label removed: deselected; label back: engaged again, as a new cluster.
        await host.label(third, None)
        await wait_until(lambda: engaged(manager) == {first}, what="the de-labelled namespace disengaged")
        await wait_until(lambda: third not in provider.statuses(), what="its cluster released")
        assert views[third].stopped and len(views[third].tasks) == 0
        await host.label(third, host.token)
        await wait_until(lambda: engaged(manager) == {first, third}, what="the re-labelled namespace engaged")
        assert await provider.get(third) is not views[third]
        # An unselected namespace gaining the label is engaged too.
        await host.label(host.name("unselected"), host.token)
        await wait_until(
            lambda: host.name("unselected") in engaged(manager), what="a newly selected namespace"
        )
        assert provider.host is not None and not provider.host.stopped and not views[first].stopped
        status = provider.statuses()[first]
        assert status.source is not None and status.source.kind == "Namespace" and status.source.name == first
    assert host_of(provider) is None and all(view.stopped for view in views.values())


async def test_a_reconciler_written_for_whole_clusters_sees_only_its_namespace(host: Host) -> None:
    tenants = [await host.namespace(host.name(short)) for short in ("t1", "t2")]
    outsider = await host.namespace(host.name("out"), selected=False)
    for namespace in (*tenants, outsider):
        await host.admin.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "data", "namespace": namespace}}
        )
    async with running(host.provider()) as (manager, recorder):

        def reconciled_all() -> bool:
            return all((tenant, "data") in recorder.requests[tenant] for tenant in tenants)

        await wait_until(reconciled_all, what="each tenant's ConfigMap reconciled")
        for tenant in tenants:
            for seen in (recorder.requests[tenant], recorder.cached[tenant], recorder.listed[tenant]):
                assert seen and {namespace for namespace, _name in seen} == {tenant}
        assert outsider not in recorder.requests and outsider not in engaged(manager)
        # A write outside the tenant's namespace is refused, naming cluster and namespace.
        cluster = await manager.get_cluster(tenants[0])
        with pytest.raises(mcr.Forbidden) as refused:
            await cluster.client.create(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": tenants[1]}}
            )
        assert refused.value.cluster == tenants[0] and refused.value.namespace == tenants[1]
        assert await host.admin.client.get_or_none(CONFIGMAP, "x", namespace=tenants[1]) is None


async def test_one_informer_per_kind_serves_every_namespace(host: Host) -> None:
    tenants = [await host.namespace(host.name(f"n{i}")) for i in range(6)]
    for tenant in tenants:
        await host.admin.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "data", "namespace": tenant}}
        )
    provider = host.provider()
    async with running(provider) as (_manager, recorder):
        await wait_until(
            lambda: all((t, "data") in recorder.cached[t] for t in tenants), what="every tenant reconciled"
        )
        assert provider.host is not None
        kinds = [informer.kind for informer in provider.host.cache.informers()]
        assert sorted(map(str, kinds)) == sorted(map(str, [NAMESPACE, CONFIGMAP]))  # one each, for 6 tenants
        shared = next(i for i in provider.host.cache.informers() if i.kind == CONFIGMAP)
        assert shared.stats.lists == 1
        assert shared.handler_count == len(tenants)  # one controller, one handler per tenant


async def test_a_field_index_is_registered_once_on_the_host(host: Host) -> None:
    tenant = await host.namespace(host.name("idx"))
    await host.admin.client.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "data", "namespace": tenant},
            "data": {"k": "v"},
        }
    )
    provider = host.provider()
    await provider.index_field(CONFIGMAP, "by-k", field_getter("data", "k"))
    async with running(provider) as (manager, _recorder):
        await wait_until(lambda: tenant in engaged(manager), what="the tenant engaged")
        cluster = await manager.get_cluster(tenant)
        found = await cluster.cache.list(CONFIGMAP, index=("by-k", "v"))
        assert [(obj["metadata"]["namespace"], obj["metadata"]["name"]) for obj in found] == [
            (tenant, "data")
        ]


def test_a_namespace_scoped_host_cache_is_refused() -> None:
    config = mcr.kubeconfig_from_dict(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    with pytest.raises(ValueError, match="cache_namespace must be None"):
        NamespaceProvider(config, options=mcr.ClusterOptions(cache_namespace="ns"))


# --- the conformance suite -------------------------------------------------------------------


class NamespaceDriver(ProviderDriver):
    """The source is the namespaces of one control plane, selected by a label of the driver's own.

    The suite keeps each case's objects in a namespace of its own
    (:meth:`use_namespace`); the first cluster the suite names is that
    namespace, so the reconciler sees what the case writes.
    """

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.MULTIPLE_CLUSTERS: (
            "the suite's clusters are separate API servers, a namespace provider's are namespaces of one "
            "(its own tests engage many)"
        ),
        Capability.OWN_CONNECTION: "a namespace's cluster runs on its host's connection: it cannot point elsewhere",
        Capability.CREDENTIAL_CHANGE: "the credential is the host's, given to the provider in code",
        Capability.DUPLICATE_NAMES: "namespace names are unique in a cluster",
        Capability.UNPARSEABLE_SOURCE: "a namespace is an object the API server validated: nothing to parse",
    }

    def __init__(self, admin: mcr.Cluster) -> None:
        self.admin = admin
        self.token = uuid.uuid4().hex[:8]
        self.case_namespace = ""
        self.names: dict[str, str] = {}
        self.target: Target | None = None
        self.provider: NamespaceProvider | None = None
        self.touches = 0

    def use_namespace(self, namespace: str) -> None:
        self.case_namespace = namespace

    def engaged_name(self, name: str) -> str:
        if name not in self.names:
            taken = self.case_namespace in self.names.values()
            self.names[name] = f"{self.case_namespace}-{name}" if taken else self.case_namespace
        return self.names[name]

    def build(self) -> mcr.Provider:
        assert self.target is not None, "add a cluster before building"
        self.provider = NamespaceProvider(
            self.target.config(), label_selector={SELECT: self.token}, options=OPTIONS
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(self.engaged_name(name)) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        assert self.target is None or self.target.plane is target.plane, "one host per provider"
        self.target = target
        namespace = self.engaged_name(name)
        with contextlib.suppress(mcr.AlreadyExists):  # the suite's seeder may have made it
            await self.admin.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        await self.admin.client.patch(NAMESPACE, namespace, {"metadata": {"labels": {SELECT: self.token}}})

    async def change(self, name: str, target: Target) -> None:
        raise AssertionError("unreachable: OWN_CONNECTION is declared unsupported")

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1
        patch = {"metadata": {"annotations": {"touched": str(self.touches)}}}
        await self.admin.client.patch(NAMESPACE, self.engaged_name(name), patch)

    async def remove(self, name: str) -> None:
        await self.admin.client.patch(
            NAMESPACE, self.engaged_name(name), {"metadata": {"labels": {SELECT: None}}}
        )

    async def settle(self) -> None:
        """Wait until the provider's view of every namespace is the version on the server."""
        provider = self.provider
        if provider is None:
            return
        for name, namespace in self.names.items():
            current = await self.admin.client.get_or_none(NAMESPACE, namespace)
            if current is None:
                continue
            selected = (current["metadata"].get("labels") or {}).get(SELECT) == self.token
            version = current["metadata"]["resourceVersion"]

            def caught_up(
                namespace: str = namespace, selected: bool = selected, version: str = version
            ) -> bool:
                status = provider.statuses().get(namespace)
                if not selected:
                    return status is None
                return status is not None and status.source is not None and status.source.version == version

            await wait_until(caught_up, what=f"the provider caught up with namespace {name!r}")


class TestNamespaceProviderConformance(ProviderConformance):
    @pytest_asyncio.fixture
    async def driver(self, fleet: Fleet) -> AsyncIterator[ProviderDriver]:
        plane = fleet["cluster-1"]
        config = mcr.kubeconfig_from_dict(plane.kubeconfig(), origin="admin")
        async with mcr.Cluster("conformance-admin-nsp", config) as admin:
            driver = NamespaceDriver(admin)
            yield driver
            for namespace in driver.names.values():
                with contextlib.suppress(mcr.NotFound):
                    await admin.client.delete(NAMESPACE, namespace)


async def test_scoped_informers_hold_only_the_selected_namespaces(host: Host) -> None:
    """With scoped_informers, an unselected namespace's objects are never listed into this process."""
    tenants = [await host.namespace(host.name(f"s{i}")) for i in range(2)]
    outsider = await host.namespace(host.name("outside"), selected=False)
    for namespace in (*tenants, outsider):
        await host.admin.client.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "data", "namespace": namespace},
                "data": {"k": "v"},
            }
        )
    provider = host.provider(scoped_informers=True)
    await provider.index_field(CONFIGMAP, "by-k", field_getter("data", "k"))
    async with running(provider) as (manager, recorder):
        await wait_until(
            lambda: all((t, "data") in recorder.cached[t] for t in tenants), what="every tenant reconciled"
        )
        host_cluster = host_of(provider)
        assert host_cluster is not None
        held: set[str] = set()
        views = [await manager.get_cluster(t) for t in tenants]
        for cluster in [host_cluster, *views]:
            for informer in cluster.cache.informers():
                if informer.kind == CONFIGMAP:
                    held.update(key.split("/", 1)[0] for key in informer.store.objects)
        assert held == set(tenants), f"ConfigMaps held for namespaces {sorted(held)}"
        assert all(recorder.cached[t] == {(t, "data")} for t in tenants)
        for tenant in tenants:  # an index registered before engagement applies to each namespace's own
            cluster = await manager.get_cluster(tenant)
            found = await cluster.cache.list(CONFIGMAP, index=("by-k", "v"))
            assert [obj["metadata"]["namespace"] for obj in found] == [tenant]
            with pytest.raises(mcr.Forbidden):
                await cluster.cache.list(CONFIGMAP, namespace=outsider)
        gone = tenants[0]
        view = await manager.get_cluster(gone)
        await host.label(gone, None)  # deselected: its own informers end with it
        await wait_until(lambda: gone not in engaged(manager), what="the deselected namespace disengaged")
        assert view.stopped
        # Disengaged is announced before the view's own tasks are ended; stop() waits for that end.
        await view.stop()
        assert len(view.tasks) == 0


# --- a host that refuses --------------------------------------------------------------


async def test_a_host_that_refuses_its_namespaces_is_named_in_readyz_until_granted(host: Host) -> None:
    # A token user bound to nothing: the host answers, and refuses to list namespaces.
    account = host.name("refused")
    user = host.plane.add_token_user(account, cluster_admin=False)
    config = mcr.kubeconfig_from_dict(host.plane.kubeconfig(user), origin="refused host")
    provider = NamespaceProvider(
        config, label_selector={SELECT: host.token}, options=OPTIONS, host_name="tenants"
    )
    manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
    mcr.controller_managed_by(manager).named("recorder").for_(CONFIGMAP).complete(Recorder(manager))
    name = await host.namespace(host.name("a"))
    binding = host.name("grant")
    try:
        async with run_manager(manager, tasks_must_end=False):
            await wait_until(lambda: "host:tenants" in provider.statuses(), what="the refused host reported")
            status = provider.statuses()["host:tenants"]
            assert status.phase is mcr.ClusterPhase.UNHEALTHY
            assert status.error is not None and "forbidden by RBAC" in status.error
            assert any("namespaces" in missing for missing in status.missing_permissions), status
            code, body = await _get(manager.endpoints.url("/readyz") + "?verbose")
            line = (
                "[-]cluster:host:tenants failed: not engaged: the host's namespaces cannot be read: forbidden"
            )
            assert code == 500 and line in body, body

            await _grant(host, binding, user.name)
            # Granted: the refusal clears without a restart, the namespace engages, the line goes.
            await wait_until(lambda: engaged(manager) == {name}, timeout=60, what="the namespace engaged")
            assert "host:tenants" not in provider.statuses()
            await wait_until(lambda: _ready(manager), timeout=60, what="ready once the namespace synced")
            _code, body = await _get(manager.endpoints.url("/readyz") + "?verbose")
            assert "host:tenants" not in body, body
    finally:
        for kind in (CLUSTERROLEBINDING, CLUSTERROLE):
            with contextlib.suppress(mcr.NotFound):
                await host.admin.client.delete(kind, binding)
        host.plane.revoke_token_user(account)


async def test_a_refusal_by_rbac_makes_engaged_namespaces_unhealthy_as_readyz_says(host: Host) -> None:
    # statuses() said READY while /readyz named the host's refusals: it never read missing_permissions.
    account = host.name("revoked")
    user = host.plane.add_token_user(account, cluster_admin=False)
    config = mcr.kubeconfig_from_dict(host.plane.kubeconfig(user), origin="revoked host")
    provider = NamespaceProvider(
        config, label_selector={SELECT: host.token}, options=OPTIONS, host_name="tenants"
    )
    manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
    mcr.controller_managed_by(manager).named("recorder").for_(CONFIGMAP).complete(Recorder(manager))
    name = await host.namespace(host.name("a"))
    grant = host.name("grant")
    try:
        await _grant(host, grant, user.name)
        async with run_manager(manager, tasks_must_end=False):
            await wait_until(lambda: _phase(provider, name) is mcr.ClusterPhase.READY, what="ready")
            await wait_until(lambda: _ready(manager), timeout=60, what="ready once the namespace synced")
            tenant = await manager.get_cluster(name)
            await host.admin.client.delete(CLUSTERROLEBINDING, grant)  # revoked

            async def refused() -> bool:
                return not await _list_succeeds(tenant)

            await wait_until(refused, what="the revoked list refused by the host")
            status = provider.statuses()[name]
            refusal = f"cannot list ConfigMap (configmaps) in namespace {name!r}"
            assert status.phase is mcr.ClusterPhase.UNHEALTHY, status
            assert status.error == f"forbidden by RBAC: {refusal}", status
            assert status.missing_permissions == (refusal,), status
            code, body = await _get(manager.endpoints.url("/readyz") + "?verbose")
            assert code == 500, body
            assert f"[-]cluster:{name} failed: forbidden by RBAC: {refusal}" in body, body

            await _grant(host, grant, user.name)  # granted again: the same request succeeds, and clears it
            await wait_until(lambda: _list_succeeds(tenant), timeout=60, what="the list allowed again")
            status = provider.statuses()[name]
            assert status.phase is mcr.ClusterPhase.READY and status.missing_permissions == (), status
            await wait_until(lambda: _ready(manager), timeout=60, what="/readyz passes again")
    finally:
        for kind in (CLUSTERROLEBINDING, CLUSTERROLE):
            with contextlib.suppress(mcr.NotFound):
                await host.admin.client.delete(kind, grant)
        host.plane.revoke_token_user(account)


def _phase(provider: NamespaceProvider, name: str) -> mcr.ClusterPhase | None:
    status = provider.statuses().get(name)
    return status.phase if status is not None else None


async def _list_succeeds(cluster: mcr.Cluster) -> bool:
    try:
        await cluster.client.list(CONFIGMAP)
    except mcr.Forbidden:
        return False
    return True


async def _grant(host: Host, name: str, user: str) -> None:
    """What the provider's generated member role would grant this controller, bound to ``user``."""
    with contextlib.suppress(mcr.AlreadyExists):
        await host.admin.client.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [
                    {
                        "apiGroups": [""],
                        "resources": ["namespaces", "configmaps"],
                        "verbs": ["get", "list", "watch"],
                    }
                ],
            }
        )
    await host.admin.client.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "User", "name": user}],
        }
    )


CLUSTERROLE = mcr.Kind("rbac.authorization.k8s.io/v1", "ClusterRole")
CLUSTERROLEBINDING = mcr.Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")


async def _ready(manager: mcr.Manager) -> bool:
    code, _body = await _get(manager.endpoints.url("/readyz"))
    return code == 200


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()
