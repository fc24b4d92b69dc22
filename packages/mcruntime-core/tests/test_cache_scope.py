"""Scoped and lean caches: several namespaces, per-kind selectors, metadata-only informers."""

from __future__ import annotations

import re
from typing import Any, cast

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster
from prometheus_client import generate_latest

import mcruntime as mcr
from mcruntime.cache import Informer
from mcruntime.client import object_key
from mcruntime.testing import Fleet, running, wait_until

SECRET = mcr.Kind("v1", "Secret")
NAMESPACE = mcr.Kind("v1", "Namespace")


def _names(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects)


def _secret(name: str, namespace: str, kind: str = "Opaque", **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "type": kind,
        "stringData": {"tls.crt": "not-a-cert", "tls.key": "not-a-key"}
        if kind == "kubernetes.io/tls"
        else {"token": "hunter2"},
    }


async def test_several_namespaces_are_one_view_and_a_read_outside_them_is_an_error(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"], "setup") as setup:
        first, second, outside = [await new_namespace(setup, "scope") for _ in range(3)]
        for namespace in (first, second, outside):
            await setup.client.create(configmap("cm", namespace, v=namespace))
    options = mcr.ClusterOptions(cache=mcr.CacheOptions(namespaces=[first, second]), cache_sync_timeout=20)
    async with running_cluster(fleet["cluster-1"], "scoped", options) as cluster:
        assert _names(await cluster.cache.list(CONFIGMAP)) == sorted([(first, "cm"), (second, "cm")])
        # One informer behind the view, one list per namespace.
        [informer] = cluster.cache.informers()
        assert informer.namespaces == tuple(sorted([first, second])) and informer.stats.lists == 2
        assert (await cluster.cache.get(CONFIGMAP, "cm", namespace=second))["data"] == {"v": second}
        assert _names(await cluster.cache.list(CONFIGMAP, namespace=first)) == [(first, "cm")]
        # Outside the scope: an error naming cluster, kind and namespace, never "absent".
        for read in (
            cluster.cache.get(CONFIGMAP, "cm", namespace=outside),
            cluster.cache.get_or_none(CONFIGMAP, "cm", namespace=outside),
            cluster.cache.list(CONFIGMAP, namespace=outside),
        ):
            with pytest.raises(mcr.NamespaceNotCached) as refused:
                await read
            message = str(refused.value)
            assert "'scoped'" in message and "ConfigMap.v1" in message and repr(outside) in message
            assert refused.value.namespace == outside and refused.value.cluster == "scoped"
        # Events of both namespaces reach the one store; the outside one's do not.
        await cluster.client.create(configmap("late", second, v="2"))
        await cluster.client.create(configmap("late", outside, v="3"))
        await cluster.client.delete(CONFIGMAP, "cm", namespace=first)
        await wait_until(
            lambda: informer.get(f"{second}/late") is not None and informer.get(f"{first}/cm") is None
        )
        assert _names(await cluster.cache.list(CONFIGMAP)) == sorted([(second, "cm"), (second, "late")])
        # A cluster-scoped kind is cached whole, by one list-and-watch, not one per namespace.
        namespaces = {o["metadata"]["name"] for o in await cluster.cache.list(NAMESPACE)}
        assert {first, second, outside} <= namespaces
        [namespace_informer] = [i for i in cluster.cache.informers() if i.kind == NAMESPACE]
        assert namespace_informer.stats.lists == 1


async def test_by_object_scopes_selectors_and_transform_per_kind(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"], "setup") as setup:
        web, other = await new_namespace(setup, "byobj"), await new_namespace(setup, "byobj")
        for name, app in (("front", "web"), ("back", "db")):
            manifest = configmap(name, web)
            manifest["metadata"]["labels"] = {"app": app}
            await setup.client.create(manifest)
        await setup.client.create(_secret("cert", web, "kubernetes.io/tls"))
        await setup.client.create(_secret("token", web))
        await setup.client.create(_secret("cert", other, "kubernetes.io/tls"))
    options = mcr.ClusterOptions(
        cache=mcr.CacheOptions(
            by_object={
                CONFIGMAP: mcr.ByObject(label_selector={"app": "web"}, transform=None),
                SECRET: mcr.ByObject(namespaces=[web], field_selector="type=kubernetes.io/tls"),
            }
        ),
        cache_sync_timeout=20,
    )
    async with running_cluster(fleet["cluster-2"], "by-object", options) as cluster:
        assert cluster.cache.scope(SECRET) == ((web,), None, "type=kubernetes.io/tls")
        # Label selector: the excluded object is simply absent.
        front = await cluster.cache.get(CONFIGMAP, "front", namespace=web)
        assert "managedFields" in front["metadata"]  # this kind's transform=None keeps objects whole
        with pytest.raises(mcr.NotFound):
            await cluster.cache.get(CONFIGMAP, "back", namespace=web)
        assert _names(await cluster.cache.list(CONFIGMAP)) == [(web, "front")]
        # Field selector and the kind's own namespaces.
        assert _names(await cluster.cache.list(SECRET)) == [(web, "cert")]
        assert await cluster.cache.get_or_none(SECRET, "token", namespace=web) is None
        with pytest.raises(mcr.NamespaceNotCached, match=re.escape(repr(other))):
            await cluster.cache.get(SECRET, "cert", namespace=other)
        # A label change out of the selector is a deletion for the cache, and back in an addition.
        await cluster.client.patch(
            CONFIGMAP, "front", {"metadata": {"labels": {"app": "gone"}}}, namespace=web
        )
        await _wait_absent(cluster, CONFIGMAP, "front", web)
        await cluster.client.patch(CONFIGMAP, "back", {"metadata": {"labels": {"app": "web"}}}, namespace=web)
        await _wait_present(cluster, CONFIGMAP, "back", web)
        # Selectors given to informer() narrow the kind's own further, never widen it.
        narrowed = cluster.cache.informer(CONFIGMAP, label_selector="tier")
        assert narrowed.label_selector.text == "app=web,tier"


async def _wait_absent(cluster: mcr.Cluster, kind: mcr.Kind, name: str, namespace: str) -> None:
    async def absent() -> bool:
        return await cluster.cache.get_or_none(kind, name, namespace=namespace) is None

    await wait_until(absent)


async def _wait_present(cluster: mcr.Cluster, kind: mcr.Kind, name: str, namespace: str) -> None:
    async def present() -> bool:
        return await cluster.cache.get_or_none(kind, name, namespace=namespace) is not None

    await wait_until(present)


async def test_a_metadata_only_view_holds_metadata_delivers_events_and_indexes(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-3"], "lean") as cluster:
        namespace = await new_namespace(cluster, "lean")
        manifest = configmap("big", namespace, payload="x" * 4096)
        manifest["metadata"]["labels"] = {"team": "blue"}
        created = await cluster.client.create(manifest)
        cluster.cache.index_field(
            CONFIGMAP, "team", lambda obj: [obj["metadata"].get("labels", {}).get("team", "")]
        )
        lean = await cluster.cache.get(CONFIGMAP, "big", namespace=namespace, metadata_only=True)
        # Metadata only, under the real kind's name, so owner mapping and Kind.of work.
        assert set(lean) == {"apiVersion", "kind", "metadata"}
        assert mcr.Kind.of(lean) == CONFIGMAP
        assert lean["metadata"]["uid"] == created["metadata"]["uid"]
        assert lean["metadata"]["labels"] == {"team": "blue"}
        assert "managedFields" not in lean["metadata"]  # the cluster's transform still applies
        [informer] = cluster.cache.informers()
        assert informer.metadata_only
        # The whole view is a different informer; reading it does not change the lean one.
        whole = await cluster.cache.get(CONFIGMAP, "big", namespace=namespace)
        assert whole["data"]["payload"] == "x" * 4096
        assert len(cluster.cache.informers()) == 2
        # Events flow through a metadata-only source, as the builder wires it.
        events: list[tuple[str, str, set[str]]] = []
        source = mcr.KindSource(CONFIGMAP, namespace=namespace, metadata_only=True)
        attachment = source.attach(
            "lean",
            cluster,
            lambda event: events.append((event.type, event.object["metadata"]["name"], set(event.object))),
        )
        assert attachment.informer is informer
        await cluster.client.create(configmap("second", namespace, payload="y"))
        await cluster.client.patch(
            CONFIGMAP,
            "big",
            {"metadata": {"labels": {"team": "green"}}, "data": {"payload": "z"}},
            namespace=namespace,
        )
        await cluster.client.delete(CONFIGMAP, "second", namespace=namespace)
        await wait_until(lambda: ("delete", "second", {"apiVersion", "kind", "metadata"}) in events)
        kinds = {(kind, name) for kind, name, _keys in events}
        assert {("create", "big"), ("create", "second"), ("update", "big")} <= kinds
        assert all(keys == {"apiVersion", "kind", "metadata"} for _kind, _name, keys in events)
        # The index answers from metadata, and follows the label change.
        assert _names(await cluster.cache.list(CONFIGMAP, index=("team", "green"), metadata_only=True)) == [
            (namespace, "big")
        ]
        assert await cluster.cache.list(CONFIGMAP, index=("team", "blue"), metadata_only=True) == []
        attachment.detach()


async def test_a_controller_owning_a_metadata_only_kind_in_a_scoped_fleet(fleet: Fleet) -> None:
    """End to end: the provider's ClusterOptions scope the cache; owns(..., metadata_only=True) maps children."""
    config = mcr.kubeconfig_from_dict(fleet["cluster-3"].kubeconfig())
    async with mcr.Cluster("writer", config) as writer:
        namespace = await new_namespace(writer, "owned")
        options = mcr.ClusterOptions(cache=mcr.CacheOptions(namespaces=[namespace]), cache_sync_timeout=20)
        manager = mcr.Manager(mcr.StaticProvider({"one": config}, options=options), handle_signals=False)
        children: dict[str, list[dict[str, Any]]] = {}

        async def reconcile(request: mcr.Request) -> None:
            cluster = await manager.get_cluster(request.cluster)
            owned = await cluster.cache.list(SECRET, namespace=request.namespace, metadata_only=True)
            children[request.name] = [
                obj for obj in owned if obj["metadata"].get("labels", {}).get("owner") == request.name
            ]

        (
            mcr.controller_managed_by(manager)
            .named("lean-owner")
            .for_(CONFIGMAP)
            .owns(SECRET, metadata_only=True)
            .complete(reconcile)
        )
        async with running(manager):
            owner = await writer.client.create(configmap("parent", namespace))
            await wait_until(lambda: "parent" in children)
            child = _secret("child", namespace, owner="parent")
            child["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "parent",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ]
            await writer.client.create(child)
            # The child's (metadata-only) event reconciles its owner, which sees the child's metadata.
            await wait_until(lambda: [c["metadata"]["name"] for c in children.get("parent", [])] == ["child"])
            assert set(children["parent"][0]) == {"apiVersion", "kind", "metadata"}
            cluster = await manager.get_cluster("one")
            secret_informers = [i for i in cluster.cache.informers() if i.kind == SECRET]
            assert [(i.metadata_only, i.namespaces) for i in secret_informers] == [(True, (namespace,))]
            # A second view of the kind is a second informer, and still one metrics series per kind.
            await cluster.cache.list(SECRET, namespace=namespace)
            assert len([i for i in cluster.cache.informers() if i.kind == SECRET]) == 2
            exposition = generate_latest(manager.metrics.registry).decode()
            for family in ("mcruntime_informer_relists_total", "mcruntime_cache_sync_duration_seconds"):
                series = [line for line in exposition.splitlines() if line.startswith(family + "{")]
                assert len([line for line in series if 'kind="Secret.v1"' in line]) == 1, series


def test_builder_sources_carry_metadata_only() -> None:
    config = mcr.kubeconfig_from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c"}}],
            "current-context": "c",
        }
    )
    manager = mcr.Manager(None, local=config)

    async def reconcile(_request: mcr.Request) -> None:
        return None

    controller = (
        mcr.controller_managed_by(manager)
        .for_(CONFIGMAP, metadata_only=True)
        .owns(SECRET, metadata_only=True)
        .watches(NAMESPACE, mcr.enqueue_for_object(), metadata_only=True)
        .complete(reconcile)
    )
    assert [source.metadata_only for source in controller.sources] == [True, True, True]
    plain = mcr.controller_managed_by(manager).named("plain").for_(CONFIGMAP).complete(reconcile)
    assert [source.metadata_only for source in plain.sources] == [False]


def test_scope_options_are_checked_when_written() -> None:
    with pytest.raises(TypeError, match="list of namespaces"):
        mcr.CacheOptions(namespaces=cast("Any", "team-a"))
    with pytest.raises(ValueError, match="cache nothing"):
        mcr.ByObject(namespaces=[])
    with pytest.raises(ValueError, match="invalid label selector"):
        mcr.ByObject(label_selector="a in ()")
    with pytest.raises(TypeError, match="maps Kind to ByObject"):
        mcr.CacheOptions(by_object=cast("Any", {"ConfigMap": mcr.ByObject()}))
    with pytest.raises(ValueError, match="not both"):
        mcr.ClusterOptions(cache_namespace="a", cache=mcr.CacheOptions(namespaces=["b"]))
    assert mcr.CacheOptions(namespaces=["b", "a", "b"]).namespaces == ("a", "b")
    # Options stay hashable values, as ClusterOptions always was; a mapping selector equals its text.
    mapped = mcr.CacheOptions(by_object={SECRET: mcr.ByObject(label_selector={"app": "web"})})
    text = mcr.CacheOptions(by_object={SECRET: mcr.ByObject(label_selector="app=web")})
    assert mapped == text and hash(mcr.ClusterOptions(cache=mapped)) == hash(mcr.ClusterOptions(cache=text))


def test_a_relist_of_one_namespace_leaves_the_others_alone() -> None:
    """Pure store logic: each namespace's relist replaces only that namespace's part."""
    informer = Informer(cast("mcr.Client", None), CONFIGMAP, namespaces=["a", "b"])
    informer._streams = ("a", "b")
    deleted: list[str] = []
    informer.add_handler(mcr.ResourceEventHandler(on_delete=lambda obj: deleted.append(object_key(obj))))

    def obj(namespace: str, name: str, version: str) -> dict[str, Any]:
        meta = {"namespace": namespace, "name": name, "resourceVersion": version}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}

    informer._replace({"a/x": obj("a", "x", "1")}, "10", "a")
    assert not informer._synced.is_set()
    informer._replace({"b/y": obj("b", "y", "2"), "b/z": obj("b", "z", "3")}, "20", "b")
    assert informer._synced.is_set() and informer.resource_version == ""
    informer._replace({}, "30", "a")
    assert deleted == ["a/x"] and sorted(informer.store.objects) == ["b/y", "b/z"]


async def test_a_cache_read_asks_what_the_client_asks_of_the_kind_and_its_scope(fleet: Fleet) -> None:
    # Found by a review: a read of a kind the cluster does not serve held the reconcile for the
    # sync timeout (60 s) at every attempt, where the client raises KindNotFound at once; and a
    # namespace that does not fit the kind's scope answered "absent" (to a reconciler: deleted),
    # where the client refuses a missing one and ignores one a cluster-scoped kind does not take.
    async with running_cluster(fleet["cluster-1"], "reads") as cluster:
        namespace = await new_namespace(cluster, "reads")
        await cluster.client.create(configmap("present", namespace, v="1"))
        typo = mcr.Kind("v1", "ConfigMapp")
        for read in (
            cluster.client.get(typo, "x", namespace=namespace),
            cluster.cache.get_or_none(typo, "x", namespace=namespace),
        ):
            with pytest.raises(mcr.KindNotFound, match="serves no ConfigMapp in v1"):
                await read
        with pytest.raises(mcr.KindNotFound):
            await cluster.cache.list(typo, namespace=namespace)
        assert not [informer for informer in cluster.cache.informers() if informer.kind == typo]
        # A namespaced kind without a namespace: refused, by the client and the cache alike.
        for read in (
            cluster.client.get(CONFIGMAP, "present"),
            cluster.cache.get_or_none(CONFIGMAP, "present"),
        ):
            with pytest.raises(ValueError, match="ConfigMap is namespaced: give a namespace for 'present'"):
                await read
        # A cluster-scoped kind with a namespace: the namespace does not apply, for either.
        live = await cluster.client.get(NAMESPACE, namespace, namespace="kube-system")
        cached = await cluster.cache.get_or_none(NAMESPACE, namespace, namespace="kube-system")
        assert cached is not None and cached["metadata"]["name"] == live["metadata"]["name"] == namespace
        listed = await cluster.cache.list(NAMESPACE, namespace="kube-system")
        assert namespace in {obj["metadata"]["name"] for obj in listed}
        await cluster.client.delete(NAMESPACE, namespace)


async def test_a_cluster_scoped_read_with_a_namespace_passes_a_namespace_scoped_cache(fleet: Fleet) -> None:
    # A cache of one namespace holds cluster-scoped kinds whole: a namespace given with one of
    # their reads is not "outside the cache".
    options = mcr.ClusterOptions(cache_namespace="default")
    async with running_cluster(fleet["cluster-2"], "scoped", options) as cluster:
        found = await cluster.cache.get_or_none(NAMESPACE, "kube-system", namespace="elsewhere")
        assert found is not None and found["metadata"]["name"] == "kube-system"
        with pytest.raises(mcr.NamespaceNotCached):
            await cluster.cache.get_or_none(CONFIGMAP, "x", namespace="elsewhere")
