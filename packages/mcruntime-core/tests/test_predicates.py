"""Predicates judge updates; creates and deletes pass the 'changed' filters."""

from __future__ import annotations

import mcruntime as mcr


def _obj(**metadata: object) -> dict[str, object]:
    return {"metadata": {"name": "x", "namespace": "ns", **metadata}}


def _update(old: dict[str, object], new: dict[str, object], cluster: str = "c") -> mcr.ObjectEvent:
    return mcr.ObjectEvent("update", cluster, new, old)


def test_generation_changed_ignores_status_only_updates() -> None:
    predicate = mcr.generation_changed()
    assert not predicate(
        _update(_obj(generation=1, resourceVersion="1"), _obj(generation=1, resourceVersion="2"))
    )
    assert predicate(_update(_obj(generation=1), _obj(generation=2)))
    assert predicate(mcr.ObjectEvent("create", "c", _obj(generation=1)))
    assert predicate(mcr.ObjectEvent("delete", "c", _obj(generation=1)))


def test_labels_annotations_and_resource_version_changed() -> None:
    assert mcr.labels_changed()(_update(_obj(labels={"a": "1"}), _obj(labels={"a": "2"})))
    assert not mcr.labels_changed()(_update(_obj(labels={"a": "1"}), _obj(labels={"a": "1"})))
    assert mcr.annotations_changed()(_update(_obj(), _obj(annotations={"n": "v"})))
    assert not mcr.resource_version_changed()(_update(_obj(resourceVersion="7"), _obj(resourceVersion="7")))


def test_namespace_label_and_cluster_filters() -> None:
    event = mcr.ObjectEvent("create", "east", _obj(labels={"team": "blue"}))
    assert mcr.in_namespaces("ns", "other")(event)
    assert not mcr.in_namespaces("other")(event)
    assert mcr.has_labels("team in (blue,green)")(event)
    assert not mcr.has_labels({"team": "green"})(event)
    assert mcr.in_clusters("east")(event)
    assert not mcr.in_clusters("west")(event)


def test_combinators() -> None:
    event = mcr.ObjectEvent("create", "east", _obj())
    yes, no = (lambda _e: True), (lambda _e: False)
    assert mcr.all_of(yes, yes)(event)
    assert not mcr.all_of(yes, no)(event)
    assert mcr.any_of(no, yes)(event)
    assert not mcr.any_of(no, no)(event)
    assert mcr.negate(no)(event)
    assert mcr.all_of()(event)


def test_requests_read_well() -> None:
    assert str(mcr.Request("east", "ns", "x")) == "east:ns/x"
    assert str(mcr.Request("", "", "node-1")) == "(local):node-1"
    assert mcr.Request("east", "ns", "x") == mcr.Request("east", "ns", "x")
    assert len({mcr.Request("east", "ns", "x"), mcr.Request("east", "ns", "x")}) == 1
