"""enqueue_for_owner on a real cluster: a cluster-scoped owner is requested without a namespace."""

from __future__ import annotations

from kube_helpers import CONFIGMAP, configmap, new_namespace, unique

import mcruntime as mcr
from mcruntime.testing import Fleet, running, wait_until

CLUSTERROLE = mcr.Kind("rbac.authorization.k8s.io/v1", "ClusterRole")


async def test_a_cluster_scoped_owner_is_reconciled_as_itself_not_in_its_childs_namespace(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-1"]
    config = mcr.kubeconfig_from_dict(plane.kubeconfig())
    owner_name = unique("owner")
    manager = mcr.Manager(mcr.StaticProvider({"one": config}), handle_signals=False)
    requests: list[mcr.Request] = []
    found: dict[str, bool] = {}

    async def reconcile(request: mcr.Request) -> None:
        requests.append(request)
        cluster = await manager.client.cluster()
        try:
            await cluster.client.get(CLUSTERROLE, request.name, namespace=request.namespace or None)
            found[request.name] = True
        except mcr.NotFound:
            found[request.name] = False  # what the bug looked like: the owner seemed deleted

    (
        mcr.controller_managed_by(manager)
        .named("owner-scope")
        .for_(CLUSTERROLE, predicates=(lambda event: event.object["metadata"]["name"] == owner_name,))
        .owns(CONFIGMAP)
        .complete(reconcile)
    )
    async with mcr.Cluster("writer", config) as writer, running(manager):
        namespace = await new_namespace(writer, "owner-scope")
        role = await writer.client.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": owner_name},
            }
        )
        await wait_until(lambda: found.get(owner_name) is True)  # the for_ event itself
        requests.clear()
        child = configmap("child", namespace)
        child["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "name": owner_name,
                "uid": role["metadata"]["uid"],
                "controller": True,
            }
        ]
        found.pop(owner_name)
        await writer.client.create(child)
        await wait_until(lambda: owner_name in found)
        assert found[owner_name] is True, "the owner looked deleted"
        assert {request for request in requests if request.name == owner_name} == {
            mcr.Request("one", "", owner_name)
        }
        await writer.client.delete(CLUSTERROLE, owner_name)


def test_an_explicit_scope_needs_no_cluster() -> None:
    child = configmap("child", "ns")
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "name": "r", "controller": True}
    ]
    event = mcr.ObjectEvent("create", "c", child)
    scoped = mcr.enqueue_for_owner(CLUSTERROLE, namespaced=False)
    assert list(scoped.requests(event)) == [mcr.Request("c", "", "r")]
    # Unknown scope (no cluster bound, nothing said): a namespaced child's namespace, as before.
    unknown = mcr.enqueue_for_owner(CLUSTERROLE)
    assert list(unknown.requests(event)) == [mcr.Request("c", "ns", "r")]
