"""A Lease loop the hub refuses is named in /readyz, and a Lease taken behind a leader's back ends its term.

Found by running leader election and sharding against hubs that misbehave:
a Lease namespace that does not exist left a replica that never led (or
owned nothing) passing /readyz with not one warning; a leader whose Lease
was deleted and taken, or edited to another holder, went on writing until
its renew deadline and then blamed the renewal; a sharded replica refused
its peer Lease mid-run stopped all work while /readyz passed; and a 403 on
reading the Lease stayed in /readyz after the grant, because the Lease's
404 did not count as allowed. All against real API servers with RBAC.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
from kube_helpers import readyz, unique
from lease_helpers import FAST, LEASE

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

NAMESPACE = mcr.Kind("v1", "Namespace")
ROLEBINDING = mcr.Kind("rbac.authorization.k8s.io/v1", "RoleBinding")


def config_of(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(), origin=plane.name)


async def _ready(manager: mcr.Manager) -> bool:
    status, _body = await readyz(manager)
    return status == 200


@asynccontextmanager
async def _admin(plane: ControlPlane) -> AsyncIterator[mcr.Cluster]:
    async with mcr.Cluster("admin", config_of(plane)) as admin:
        yield admin


async def _create_namespace(plane: ControlPlane, name: str) -> None:
    async with _admin(plane) as admin:
        await admin.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


async def _delete_namespace(plane: ControlPlane, name: str) -> None:
    async with _admin(plane) as admin:
        with suppress(mcr.NotFound):
            await admin.client.delete(NAMESPACE, name)


def _elected(config: mcr.ClusterConfig, namespace: str, identity: str) -> mcr.Manager:
    election = mcr.LeaderElectionConfig(name="ctl", namespace=namespace, identity=identity, **FAST)
    return mcr.Manager(
        local=config, leader_election=election, health_probe_address="127.0.0.1:0", handle_signals=False
    )


def _sharded(config: mcr.ClusterConfig, namespace: str, identity: str) -> mcr.Manager:
    sharding = mcr.ShardingConfig(name="grp", namespace=namespace, identity=identity, shards=4, **FAST)
    return mcr.Manager(
        local=config,
        coordinator=mcr.ShardedCoordinator(sharding),
        health_probe_address="127.0.0.1:0",
        handle_signals=False,
    )


@pytest.mark.parametrize("build", [_elected, _sharded], ids=["leader election", "sharding"])
async def test_a_lease_namespace_that_does_not_exist_fails_readyz_until_it_is_created(
    fleet: Fleet, build: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mcruntime")
    plane = fleet["cluster-1"]
    namespace = unique("no-such")
    manager = build(config_of(plane), namespace, "only")
    try:
        async with running(manager):
            await wait_until(lambda: _line(manager, "does not exist"), what="the coordination line naming it")
            _status, body = await readyz(manager)
            assert "[-]coordination failed: " in body and namespace in body, body
            warnings = [
                r for r in caplog.records if r.levelno == logging.WARNING and namespace in r.getMessage()
            ]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once, not at every retry
            await _create_namespace(plane, namespace)
            await wait_until(lambda: _ready(manager), timeout=30, what="ready once the namespace exists")
            _status, body = await readyz(manager)
            assert "[+]coordination ok" in body, body
    finally:
        await _delete_namespace(plane, namespace)


async def _limited(plane: ControlPlane, prefix: str, who: str) -> tuple[str, str, Any, mcr.ClusterConfig]:
    """A namespace of the test's own, and a token user with no permission yet (the account, the user, its config)."""
    namespace = unique(prefix)
    await _create_namespace(plane, namespace)
    account = unique(who)
    user = plane.add_token_user(account, cluster_admin=False)
    return namespace, account, user, mcr.kubeconfig_from_dict(plane.kubeconfig(user), origin=f"{who} replica")


def _lease_rights(namespace: str, user: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A Role on the Leases of ``namespace`` and its binding to ``user``."""
    rules = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "leases", "namespace": namespace},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "leases", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "leases"},
        "subjects": [{"kind": "User", "name": user}],
    }
    return role, binding


async def _line(manager: mcr.Manager, line: str) -> bool:
    _status, body = await readyz(manager)
    return line in body


@pytest.mark.parametrize("how", ["edited", "deleted and taken"])
async def test_a_leader_whose_lease_another_holds_steps_down_at_once_and_names_the_holder(
    fleet: Fleet, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mcruntime.leaderelection")
    plane = fleet["cluster-1"]
    lease_name = unique("lease")
    election = mcr.LeaderElectionConfig(name=lease_name, namespace="default", identity="leader", **FAST)
    manager = mcr.Manager(local=config_of(plane), leader_election=election, handle_signals=False)
    elector = manager.elector
    assert elector is not None
    async with running(manager), _admin(plane) as admin:
        await wait_until(lambda: elector.leading.is_set(), what="leading")
        await wait_until(lambda: elector.renewals >= 1, what="renewed from the heartbeat")
        lease = await admin.client.get(LEASE, lease_name, namespace="default")
        if how == "edited":
            lease["spec"]["holderIdentity"] = "intruder"
            await admin.client.update(lease)
        else:
            await admin.client.delete(LEASE, lease_name, namespace="default")
            taken = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": lease_name, "namespace": "default"},
                "spec": {"holderIdentity": "intruder", "leaseDurationSeconds": 3},
            }
            try:
                await admin.client.create(taken)
            except mcr.AlreadyExists:  # the leader made it again first: take it over
                lease = await admin.client.get(LEASE, lease_name, namespace="default")
                lease["spec"]["holderIdentity"] = "intruder"
                await admin.client.update(lease)
        await wait_until(lambda: "lost leadership" in caplog.text, what="the step-down")
        # The reason names the holder; it is not a renewal that "could not" land.
        assert "leader lost leadership: the Lease is now held by 'intruder'" in caplog.text, caplog.text
        assert "could not renew" not in caplog.text
        await admin.client.delete(LEASE, lease_name, namespace="default")  # the intruder is gone: lead again
        await wait_until(lambda: elector.leading.is_set(), what="leading again")


async def test_a_sharded_replica_refused_its_peer_lease_mid_run_fails_readyz_and_recovers_when_granted(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-1"]
    namespace, account, user, config = await _limited(plane, "shards", "sharded")
    role, binding = _lease_rights(namespace, user.name)
    manager = _sharded(config, namespace, "replica")
    try:
        async with _admin(plane) as admin:
            await admin.client.create(role)
            await admin.client.create(binding)
            async with running(manager):
                await wait_until(lambda: _ready(manager), timeout=30, what="ready with its Lease rights")
                await admin.client.delete(ROLEBINDING, "leases", namespace=namespace)
                line = "[-]coordination failed: shard group 'grp': this replica"
                await wait_until(lambda: _line(manager, line), timeout=30, what="named once renewals fail")
                _status, body = await readyz(manager)
                assert "forbidden" in body.lower() and "leases" in body, body
                await admin.client.create(binding)
                await wait_until(lambda: _ready(manager), timeout=30, what="ready again once granted")
    finally:
        await _delete_namespace(plane, namespace)
        plane.revoke_token_user(account)


async def test_a_lease_403_leaves_readyz_once_granted_though_the_lease_did_not_exist_yet(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-1"]
    namespace, account, user, config = await _limited(plane, "granted", "elected")
    manager = _elected(config, namespace, "replica")
    try:
        async with running(manager), _admin(plane) as admin:
            await wait_until(lambda: _line(manager, "forbidden"), timeout=30, what="the 403 named")
            for obj in _lease_rights(namespace, user.name):
                await admin.client.create(obj)
            elector = manager.elector
            assert elector is not None
            await wait_until(lambda: elector.leading.is_set(), timeout=30, what="leading once granted")
            # The first read after the grant answered 404 (no Lease yet): that counts as allowed.
            await wait_until(lambda: _ready(manager), timeout=30, what="no stale 403 in /readyz")
    finally:
        await _delete_namespace(plane, namespace)
        plane.revoke_token_user(account)
