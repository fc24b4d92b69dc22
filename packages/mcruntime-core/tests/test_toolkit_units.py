"""The toolkit's pure logic: merge patches, conditions, owner references, owner records, the handler.

No cluster: these are functions over JSON-shaped objects. What the API server
makes of their output is in test_toolkit_cluster.py and test_toolkit_fleet.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mcruntime as mcr
from mcruntime import toolkit
from mcruntime.toolkit import (
    OWNER_ANNOTATION,
    OWNER_KIND_LABEL,
    OWNER_UID_LABEL,
    ClusterOwner,
)

WIDGET = mcr.Kind("example.dev/v1", "Widget")


def owner(name: str = "w", uid: str = "6c1d0a4e-2f0b-4a53-9a55-000000000001", namespace: str = "ns") -> Any:
    return {
        "apiVersion": "example.dev/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 3},
    }


def child(name: str = "c", namespace: str = "ns") -> Any:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}


# --- merge patch ---------------------------------------------------------------------------


def test_a_merge_patch_sends_changes_deletes_with_null_and_replaces_lists_whole() -> None:
    before = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1, 2], "gone": "x", "same": {"k": "v"}}
    after = {"a": 1, "b": {"c": 5, "d": 3}, "e": [1, 2, 3], "new": {"n": 1}, "same": {"k": "v"}}
    assert toolkit.merge_patch(before, after) == {
        "b": {"c": 5},
        "e": [1, 2, 3],
        "gone": None,
        "new": {"n": 1},
    }
    assert toolkit.merge_patch(after, after) == {}


def test_a_value_turning_into_an_object_or_back_is_sent_whole() -> None:
    assert toolkit.merge_patch({"a": "text"}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert toolkit.merge_patch({"a": {"b": 1}}, {"a": "text"}) == {"a": "text"}
    assert toolkit.merge_patch({"a": 1}, {"a": None}) == {"a": None}  # None can only mean "delete"


def test_applying_a_merge_patch_follows_rfc_7386() -> None:
    # The RFC's own example (section 3), as data.
    target = {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"}, "tags": ["a", "b"]}
    patch = {"title": "Hello!", "phoneNumber": "+01-123", "author": {"familyName": None}, "tags": ["a"]}
    assert toolkit.apply_merge_patch(target, patch) == {
        "title": "Hello!",
        "author": {"givenName": "John"},
        "tags": ["a"],
        "phoneNumber": "+01-123",
    }
    assert target["author"] == {"givenName": "John", "familyName": "Doe"}  # inputs untouched


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=10,
)
# Objects without null values: a null cannot be stored, so it cannot be in an "after".
stored_values = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=10,
)
objects = st.dictionaries(st.text(max_size=3), stored_values, max_size=5)


@given(objects, objects)
def test_the_computed_patch_turns_before_into_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    patch = toolkit.merge_patch(before, after)
    assert toolkit.apply_merge_patch(before, patch) == after
    assert (patch == {}) == (before == after)


# --- conditions ----------------------------------------------------------------------------


def test_a_new_condition_gets_a_transition_time_and_the_objects_generation() -> None:
    obj = owner()
    assert toolkit.set_status_condition(obj, "Ready", False, reason="Waiting", now="2026-01-01T00:00:00Z")
    assert obj["status"]["conditions"] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Waiting",
            "message": "",
            "observedGeneration": 3,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]


def test_the_transition_time_moves_only_when_the_status_changes() -> None:
    obj = owner()
    toolkit.set_status_condition(obj, "Ready", False, reason="Waiting", now="2026-01-01T00:00:00Z")
    # Same status, new reason and message: a change, but no transition.
    assert toolkit.set_status_condition(
        obj, "Ready", False, reason="StillWaiting", message="2 of 3", now="2026-01-01T00:05:00Z"
    )
    found = toolkit.find_status_condition(obj, "Ready")
    assert found is not None
    assert (found["reason"], found["message"], found["lastTransitionTime"]) == (
        "StillWaiting",
        "2 of 3",
        "2026-01-01T00:00:00Z",
    )
    # The very same condition again: no change at all, so no write is needed.
    assert not toolkit.set_status_condition(
        obj, "Ready", False, reason="StillWaiting", message="2 of 3", now="2026-01-01T00:06:00Z"
    )
    # A status change is a transition.
    assert toolkit.set_status_condition(obj, "Ready", True, reason="Done", now="2026-01-01T00:10:00Z")
    found = toolkit.find_status_condition(obj, "Ready")
    assert found is not None and found["lastTransitionTime"] == "2026-01-01T00:10:00Z"
    assert toolkit.is_status_condition_true(obj, "Ready")
    assert len(obj["status"]["conditions"]) == 1


def test_a_newer_generation_is_a_change_without_a_transition() -> None:
    obj = owner()
    toolkit.set_status_condition(obj, "Ready", True, reason="Done", now="2026-01-01T00:00:00Z")
    obj["metadata"]["generation"] = 4
    assert toolkit.set_status_condition(obj, "Ready", True, reason="Done", now="2026-01-02T00:00:00Z")
    found = toolkit.find_status_condition(obj, "Ready")
    assert found is not None
    assert (found["observedGeneration"], found["lastTransitionTime"]) == (4, "2026-01-01T00:00:00Z")


def test_conditions_the_server_would_refuse_are_refused_here_naming_the_field() -> None:
    with pytest.raises(ValueError, match="status must be True, False or Unknown"):
        toolkit.set_status_condition(owner(), "Ready", "yes", reason="Done")
    with pytest.raises(ValueError, match="reason 'not done' is not a CamelCase word"):
        toolkit.set_status_condition(owner(), "Ready", True, reason="not done")


def test_removing_and_reading_conditions() -> None:
    obj = owner()
    assert toolkit.find_status_condition(obj, "Ready") is None
    assert not toolkit.is_status_condition_true(obj, "Ready")
    toolkit.set_status_condition(obj, "Ready", "Unknown", reason="Starting")
    toolkit.set_status_condition(obj, "Synced", True, reason="Synced")
    assert not toolkit.is_status_condition_true(obj, "Ready")
    assert toolkit.remove_status_condition(obj, "Ready")
    assert not toolkit.remove_status_condition(obj, "Ready")
    assert [c["type"] for c in obj["status"]["conditions"]] == ["Synced"]


# --- owner references -----------------------------------------------------------------------


def test_a_controller_reference_is_set_once_and_a_second_controller_is_refused() -> None:
    obj = child()
    assert toolkit.set_controller_reference(owner(), obj)
    assert obj["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "example.dev/v1",
            "kind": "Widget",
            "name": "w",
            "uid": "6c1d0a4e-2f0b-4a53-9a55-000000000001",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert not toolkit.set_controller_reference(owner(), obj)  # the same owner: nothing to change
    with pytest.raises(
        toolkit.AlreadyOwnedError, match="ConfigMap 'ns/c' is already controlled by Widget 'w'"
    ):
        toolkit.set_controller_reference(owner("other", uid="u2"), obj)
    # A plain owner reference to another owner is fine: shared ownership.
    assert toolkit.set_owner_reference(owner("other", uid="u2"), obj)
    assert [(r["name"], r.get("controller")) for r in obj["metadata"]["ownerReferences"]] == [
        ("w", True),
        ("other", None),
    ]


def test_owner_references_never_cross_namespaces_and_need_a_uid() -> None:
    with pytest.raises(ValueError, match="a namespaced owner owns objects of its own namespace only"):
        toolkit.set_controller_reference(owner(namespace="a"), child(namespace="b"))
    cluster_scoped = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}}
    with pytest.raises(ValueError, match="no namespace"):
        toolkit.set_owner_reference(owner(), cluster_scoped)
    without_uid = owner()
    del without_uid["metadata"]["uid"]
    with pytest.raises(ValueError, match=r"has no metadata\.uid"):
        toolkit.set_owner_reference(without_uid, child())
    # A cluster-scoped owner may own a namespaced object.
    namespace_owner = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n", "uid": "u"}}
    assert toolkit.set_controller_reference(namespace_owner, child())


# --- cross-cluster owners -------------------------------------------------------------------


def test_an_owner_record_round_trips_through_the_childs_metadata() -> None:
    obj = child()
    record = toolkit.set_cluster_owner(obj, "hub", owner())
    assert record == ClusterOwner("hub", "example.dev/v1", "Widget", "ns", "w", owner()["metadata"]["uid"])
    assert toolkit.cluster_owner_of(obj) == record
    assert obj["metadata"]["labels"] == {
        OWNER_UID_LABEL: "6c1d0a4e-2f0b-4a53-9a55-000000000001",
        OWNER_KIND_LABEL: "Widget.example.dev",
    }
    assert record.request() == mcr.Request("hub", "ns", "w")
    assert toolkit.set_cluster_owner(obj, "hub", owner()) == record  # idempotent
    with pytest.raises(
        toolkit.AlreadyOwnedByClusterError, match="already owned by Widget ns/w of cluster 'hub'"
    ):
        toolkit.set_cluster_owner(obj, "other-hub", owner())


def test_any_cluster_name_is_stored_exactly_and_long_label_values_are_hashed() -> None:
    long_group = "a-very-long-api-group-name.for-a-custom-resource.example.dev"
    long_owner = {
        "apiVersion": f"{long_group}/v1",
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": "ns", "uid": "not a uuid/with slashes"},
    }
    obj = child()
    cluster = "fleet/" + "x" * 200  # a provider's file/context name: slashes, and far over 63 characters
    record = toolkit.set_cluster_owner(obj, cluster, long_owner)
    assert toolkit.cluster_owner_of(obj) == record and record.cluster == cluster
    labels = obj["metadata"]["labels"]
    for value in labels.values():
        assert value.startswith("sha256-") and len(value) == 47
    assert labels[OWNER_UID_LABEL] == toolkit.label_value("not a uuid/with slashes")
    assert toolkit.owned_by_kind_selector(mcr.Kind(f"{long_group}/v1", "Widget")) == (
        f"{OWNER_KIND_LABEL}={labels[OWNER_KIND_LABEL]}"
    )
    assert toolkit.label_value("Widget.example.dev") == "Widget.example.dev"
    assert toolkit.label_value("-starts-with-dash") != "-starts-with-dash"


@pytest.mark.parametrize(
    "annotation",
    [
        "not json",
        "[1, 2]",
        '{"cluster": "a"}',
        '{"cluster": 1, "apiVersion": "v1", "kind": "K", "namespace": "", "name": "n", "uid": "u"}',
        "x" * 5000,
    ],
)
def test_a_broken_owner_record_is_no_owner(annotation: str) -> None:
    obj = child()
    obj["metadata"]["annotations"] = {OWNER_ANNOTATION: annotation}
    assert toolkit.cluster_owner_of(obj) is None


def test_the_handler_maps_a_child_in_any_cluster_to_its_owners_request() -> None:
    handler = toolkit.enqueue_for_cluster_owner(WIDGET)
    obj = child()
    toolkit.set_cluster_owner(obj, "hub", owner())
    event = mcr.ObjectEvent("update", "member-7", obj)
    assert list(handler.requests(event)) == [mcr.Request("hub", "ns", "w")]
    # Another owner kind, an unowned object, any version of the same kind.
    assert list(toolkit.enqueue_for_cluster_owner(mcr.Kind("v1", "Widget")).requests(event)) == []
    assert list(handler.requests(mcr.ObjectEvent("create", "member-7", child()))) == []
    assert list(toolkit.enqueue_for_cluster_owner(mcr.Kind("example.dev/v2", "Widget")).requests(event)) == [
        mcr.Request("hub", "ns", "w")
    ]
    # A child taken over by another owner: both hear of it.
    moved = child()
    toolkit.set_cluster_owner(moved, "hub", owner("w2", uid="u2"))
    requests = set(handler.requests(mcr.ObjectEvent("update", "member-7", moved, obj)))
    assert requests == {mcr.Request("hub", "ns", "w"), mcr.Request("hub", "ns", "w2")}
