"""The single-cluster toolkit against a real kube-apiserver.

Finalizers under a real 409 Conflict, create-or-update/patch and what they
leave alone, owner references the server accepts, conditions whose
transition times survive the round trip, the default field manager and
dry-run writes.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, install_widget_crd, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime import toolkit
from mcruntime.testing import Fleet, running

FAST = mcr.Backoff(base=0.0, cap=0.0)


def managers_of(obj: dict[str, Any]) -> set[str]:
    return {entry["manager"] for entry in obj["metadata"].get("managedFields") or []}


async def test_a_stale_finalizer_patch_meets_a_real_conflict_and_the_retry_keeps_the_other_finalizer(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "fin")
        stale = await cluster.client.create(configmap("cm", namespace, v="1"))
        # Another controller adds its finalizer after we read: our copy is stale now.
        await toolkit.add_finalizer(cluster.client, stale, "other.example.dev/keep")

        with pytest.raises(mcr.Conflict, match="409"):  # one attempt: the server's 409 surfaces
            await toolkit.add_finalizer(cluster.client, stale, "ours.example.dev/cleanup", attempts=1)

        with caplog.at_level(logging.DEBUG, logger="mcruntime.toolkit"):
            stored = await toolkit.add_finalizer(
                cluster.client, stale, "ours.example.dev/cleanup", backoff=FAST
            )
        assert "changed meanwhile; retrying" in caplog.text  # the retry followed a real conflict
        assert stored["metadata"]["finalizers"] == ["other.example.dev/keep", "ours.example.dev/cleanup"]

        # Removing ours from a copy gone stale keeps a finalizer added meanwhile too.
        await toolkit.add_finalizer(cluster.client, stored, "third.example.dev/keep")
        await toolkit.remove_finalizer(cluster.client, stored, "ours.example.dev/cleanup", backoff=FAST)
        current = await cluster.client.get(CONFIGMAP, "cm", namespace=namespace)
        assert current["metadata"]["finalizers"] == ["other.example.dev/keep", "third.example.dev/keep"]
        # Nothing to do: no request, the object as given.
        assert await toolkit.add_finalizer(cluster.client, current, "other.example.dev/keep") == current


async def test_removing_the_last_finalizer_of_a_deleted_object_lets_it_go(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "fin")
        created = await cluster.client.create(configmap("held", namespace))
        held = await toolkit.add_finalizer(cluster.client, created, "ours.example.dev/cleanup")
        await cluster.client.delete(CONFIGMAP, "held", namespace=namespace)
        deleting = await cluster.client.get(CONFIGMAP, "held", namespace=namespace)
        assert deleting["metadata"]["deletionTimestamp"]
        # No new finalizer on an object being deleted (the server would refuse it).
        assert await toolkit.add_finalizer(cluster.client, deleting, "late.example.dev/x") == deleting
        await toolkit.remove_finalizer(cluster.client, held, "ours.example.dev/cleanup", backoff=FAST)
        assert await cluster.client.get_or_none(CONFIGMAP, "held", namespace=namespace) is None
        # A second remover finds nothing: success, not an error.
        assert await toolkit.remove_finalizer(cluster.client, held, "ours.example.dev/cleanup") is None
        with pytest.raises(mcr.NotFound):
            await toolkit.add_finalizer(cluster.client, held, "new.example.dev/cleanup", backoff=FAST)


async def test_create_or_update_creates_changes_and_leaves_alone(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "cou")
        wanted = {"v": "1"}

        def mutate(obj: dict[str, Any]) -> None:
            obj["data"] = dict(wanted)

        operation, created = await toolkit.create_or_update(cluster.client, configmap("c", namespace), mutate)
        assert operation is toolkit.Operation.CREATED and created["data"] == {"v": "1"}
        operation, same = await toolkit.create_or_update(cluster.client, configmap("c", namespace), mutate)
        assert operation is toolkit.Operation.UNCHANGED
        assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]  # no write
        wanted["v"] = "2"
        operation, updated = await toolkit.create_or_update(cluster.client, configmap("c", namespace), mutate)
        assert operation is toolkit.Operation.UPDATED and updated["data"] == {"v": "2"}
        stored = await cluster.client.get(CONFIGMAP, "c", namespace=namespace)
        assert stored["data"] == {"v": "2"}

        def rename(obj: dict[str, Any]) -> None:
            obj["metadata"]["name"] = "other"

        with pytest.raises(ValueError, match="changed the kind, name or namespace of ConfigMap 'c'"):
            await toolkit.create_or_update(cluster.client, configmap("c", namespace), rename)


async def test_create_or_patch_sends_only_its_change_and_writes_status_through_the_subresource(
    fleet: Fleet,
) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        widget = await install_widget_crd(cluster)
        namespace = await new_namespace(cluster, "cop")
        name = {
            "apiVersion": widget.api_version,
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": namespace},
        }

        async def mutate(obj: dict[str, Any]) -> None:  # async mutate functions are awaited
            obj.setdefault("spec", {})["size"] = 3
            obj["status"] = {"phase": "Ready"}

        operation, _created = await toolkit.create_or_patch(cluster.client, name, mutate)
        assert operation is toolkit.Operation.CREATED
        # Another writer sets a field our mutate function never touches.
        await cluster.client.patch(widget, "w", {"spec": {"color": "blue"}}, namespace=namespace)
        operation, _patched = await toolkit.create_or_patch(cluster.client, name, mutate)
        assert operation is toolkit.Operation.UPDATED  # status was dropped at create: now it is set
        stored = await cluster.client.get(widget, "w", namespace=namespace)
        assert stored["spec"] == {"size": 3, "color": "blue"}  # the other writer's field survived
        assert stored["status"] == {"phase": "Ready"}
        operation, _same = await toolkit.create_or_patch(cluster.client, name, mutate)
        assert operation is toolkit.Operation.UNCHANGED


async def test_owner_references_are_accepted_by_the_server(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "own")
        owner = await cluster.client.create(configmap("owner", namespace))
        other = await cluster.client.create(configmap("other", namespace))
        obj = configmap("child", namespace)
        toolkit.set_controller_reference(owner, obj)
        stored = await cluster.client.create(obj)
        (reference,) = stored["metadata"]["ownerReferences"]
        assert reference["uid"] == owner["metadata"]["uid"] and reference["controller"] is True
        with pytest.raises(toolkit.AlreadyOwnedError):
            toolkit.set_controller_reference(other, stored)


async def test_condition_transition_times_survive_the_round_trip_and_move_only_on_a_status_change(
    fleet: Fleet,
) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        widget = await install_widget_crd(cluster)
        namespace = await new_namespace(cluster, "cond")
        obj = await cluster.client.create(
            {
                "apiVersion": widget.api_version,
                "kind": "Widget",
                "metadata": {"name": "w", "namespace": namespace},
            }
        )
        assert toolkit.set_status_condition(obj, "Ready", False, reason="Waiting", now="2026-01-01T00:00:00Z")
        obj = await cluster.client.update_status(obj)
        # A later pass, same status, new message: stored, but the transition time stays.
        assert toolkit.set_status_condition(
            obj, "Ready", False, reason="Waiting", message="1 of 2", now="2026-01-01T01:00:00Z"
        )
        obj = await cluster.client.update_status(obj)
        stored = await cluster.client.get(widget, "w", namespace=namespace)
        condition = toolkit.find_status_condition(stored, "Ready")
        assert condition is not None
        assert (condition["message"], condition["lastTransitionTime"]) == ("1 of 2", "2026-01-01T00:00:00Z")
        assert condition["observedGeneration"] == stored["metadata"]["generation"]
        # Read back from the server, the same condition is no change: no write needed.
        assert not toolkit.set_status_condition(
            stored, "Ready", False, reason="Waiting", message="1 of 2", now="2026-01-01T02:00:00Z"
        )
        assert toolkit.set_status_condition(stored, "Ready", True, reason="Done", now="2026-01-01T03:00:00Z")
        await cluster.client.update_status(stored)
        final = toolkit.find_status_condition(
            await cluster.client.get(widget, "w", namespace=namespace), "Ready"
        )
        assert final is not None and final["lastTransitionTime"] == "2026-01-01T03:00:00Z"


async def test_writes_carry_the_managers_field_manager_unless_overridden(fleet: Fleet) -> None:
    manager = mcr.Manager(
        local=mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig()),
        field_manager="toolkit-test",
        handle_signals=False,
    )
    async with running(manager):
        local = await manager.get_cluster(mcr.LOCAL_CLUSTER)
        assert local.client.field_manager == "toolkit-test"
        namespace = await new_namespace(local, "fm")
        created = await local.client.create(configmap("a", namespace, k="v"))
        assert managers_of(created) == {"toolkit-test"}
        patched = await local.client.patch(
            CONFIGMAP, "a", {"data": {"other": "v"}}, namespace=namespace, field_manager="someone-else"
        )
        assert managers_of(patched) == {"toolkit-test", "someone-else"}
        applied = await local.client.apply(configmap("b", namespace, k="v"))  # apply takes the default too
        assert managers_of(applied) == {"toolkit-test"}


async def test_dry_run_writes_are_answered_and_not_stored(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "dry")
        answer = await cluster.client.create(configmap("ghost", namespace, v="1"), dry_run=True)
        assert answer["data"] == {"v": "1"}
        assert await cluster.client.get_or_none(CONFIGMAP, "ghost", namespace=namespace) is None
        real = await cluster.client.create(configmap("real", namespace, v="1"))
        real["data"] = {"v": "2"}
        assert (await cluster.client.update(real, dry_run=True))["data"] == {"v": "2"}
        await cluster.client.patch(CONFIGMAP, "real", {"data": {"v": "3"}}, namespace=namespace, dry_run=True)
        await cluster.client.delete(CONFIGMAP, "real", namespace=namespace, dry_run=True)
        operation, _ = await toolkit.create_or_update(
            cluster.client, configmap("other-ghost", namespace), lambda obj: None, dry_run=True
        )
        assert operation is toolkit.Operation.CREATED
        stored = await cluster.client.get(CONFIGMAP, "real", namespace=namespace)
        assert stored["data"] == {"v": "1"}
        assert await cluster.client.get_or_none(CONFIGMAP, "other-ghost", namespace=namespace) is None
        with pytest.raises(ValueError, match="apply needs a field manager"):
            await cluster.client.apply(configmap("real", namespace))


async def test_the_server_turns_before_into_after_with_the_computed_merge_patch(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster, "mp")
        before = await cluster.client.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "m", "namespace": namespace, "labels": {"keep": "1", "drop": "1"}},
                "data": {"changed": "old", "removed": "x", "same": "s"},
            }
        )
        after = toolkit.apply_merge_patch(before, {})  # a deep copy to edit
        del after["metadata"]["labels"]["drop"]
        after["metadata"]["labels"]["added"] = "1"
        after["data"] = {"changed": "new", "same": "s", "added": "y"}
        patch = toolkit.merge_patch(before, after)
        assert patch == {
            "metadata": {"labels": {"drop": None, "added": "1"}},
            "data": {"changed": "new", "removed": None, "added": "y"},
        }
        stored = await cluster.client.patch(CONFIGMAP, "m", patch, namespace=namespace)
        assert stored["metadata"]["labels"] == after["metadata"]["labels"]
        assert stored["data"] == after["data"]
