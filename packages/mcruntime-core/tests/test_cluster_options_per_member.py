"""One member of a mixed fleet with options of its own: a cache scoped to what its identity may read.

``StaticProvider(options=...)`` applied to every cluster. A member whose
identity may read one namespace only needs a namespace-scoped cache, or its
cluster-wide list is refused forever; the only way round was a
``MultiProvider`` with one provider per option set, which prefixes the names.
"""

from __future__ import annotations

from kube_helpers import configmap, configmap_reader, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config, running, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def test_a_member_whose_identity_reads_one_namespace_gets_a_cache_scoped_to_it(fleet: Fleet) -> None:
    wide, narrow = fleet["cluster-1"], fleet["cluster-2"]
    async with running_cluster(wide) as admin_wide, running_cluster(narrow) as admin_narrow:
        there = await new_namespace(admin_wide, "wide")
        mine = await new_namespace(admin_narrow, "mine")
        user = await configmap_reader(admin_narrow, narrow, mine)
        shared = mcr.ClusterOptions(cache_sync_timeout=30)
        provider = mcr.StaticProvider(
            {"wide": admin_config(wide), "narrow": mcr.kubeconfig_from_dict(narrow.kubeconfig(user))},
            options=shared,
            cluster_options={"narrow": mcr.ClusterOptions(cache=mcr.CacheOptions(namespaces=[mine]))},
        )
        manager = mcr.Manager(provider, handle_signals=False)
        seen: set[tuple[str, str]] = set()

        async def reconcile(request: mcr.Request) -> None:
            seen.add((request.cluster, request.name))

        controller = mcr.controller_managed_by(manager).named("cms").for_(CONFIGMAP).complete(reconcile)
        async with running(manager):
            await admin_wide.client.create(configmap("in-wide", there, v="1"))
            await admin_narrow.client.create(configmap("in-narrow", mine, v="1"))
            await wait_until(
                lambda: {("wide", "in-wide"), ("narrow", "in-narrow")} <= seen, what="both members reconciled"
            )
            assert controller.synced("narrow") and controller.synced("wide")
            narrow_cluster = await manager.get_cluster("narrow")
            assert narrow_cluster.health.missing_permissions == ()
            assert (await manager.get_cluster("wide")).options is shared
            assert provider.statuses()["narrow"].phase is mcr.ClusterPhase.READY
