"""Builder wiring is checked when the controller is built, with messages that say what is wrong."""

from __future__ import annotations

import pytest

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
SECRET = mcr.Kind("v1", "Secret")


def _manager(with_provider: bool = True) -> mcr.Manager:
    config = mcr.kubeconfig_from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "contexts": [{"name": "c", "context": {"cluster": "c"}}],
            "current-context": "c",
        }
    )
    return mcr.Manager(mcr.StaticProvider() if with_provider else None, local=config)


async def _noop(_request: mcr.Request) -> None:
    return None


def test_the_name_defaults_to_the_for_kind() -> None:
    controller = mcr.controller_managed_by(_manager()).for_(CONFIGMAP).complete(_noop)
    assert controller.name == "configmap"


def test_names_are_unique_per_manager() -> None:
    manager = _manager()
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    with pytest.raises(mcr.BuilderError, match="already exists"):
        mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)


def test_nothing_to_watch_is_an_error() -> None:
    with pytest.raises(mcr.BuilderError, match=r"nothing to watch"):
        mcr.controller_managed_by(_manager()).named("idle").complete(_noop)


def test_for_twice_is_an_error() -> None:
    with pytest.raises(mcr.BuilderError, match="for_ was called twice"):
        mcr.controller_managed_by(_manager()).for_(CONFIGMAP).for_(SECRET).complete(_noop)


def test_owns_without_for_is_an_error() -> None:
    builder = mcr.controller_managed_by(_manager()).named("x").owns(SECRET)
    builder.watches(CONFIGMAP, mcr.enqueue_for_object())
    with pytest.raises(mcr.BuilderError, match=r"owns\(\.\.\.\) needs for_"):
        builder.complete(_noop)


def test_a_non_reconciler_is_an_error() -> None:
    with pytest.raises(mcr.BuilderError, match="is not a reconciler"):
        mcr.controller_managed_by(_manager()).for_(CONFIGMAP).complete(42)  # type: ignore[arg-type]


def test_bad_options_and_names_are_errors() -> None:
    with pytest.raises(mcr.BuilderError, match="at least 1"):
        mcr.controller_managed_by(_manager()).for_(CONFIGMAP).with_options(
            max_concurrent_reconciles=0
        ).complete(_noop)
    with pytest.raises(mcr.BuilderError, match="lower-case"):
        mcr.controller_managed_by(_manager()).named("Bad Name").for_(CONFIGMAP).complete(_noop)


def test_owned_kinds_follow_the_for_kinds_clusters_and_enqueue_the_owner() -> None:
    controller = (
        mcr.controller_managed_by(_manager())
        .for_(CONFIGMAP, clusters=mcr.EVERY_CLUSTER)
        .owns(SECRET)
        .complete(_noop)
    )
    owned = controller.sources[1]
    assert owned.kind == SECRET
    assert owned.clusters.includes("", has_provider=True)
    event = mcr.ObjectEvent(
        "create",
        "east",
        {
            "metadata": {
                "name": "s",
                "namespace": "ns",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "controller": True}
                ],
            }
        },
    )
    assert list(owned.handler.requests(event)) == [mcr.Request("east", "ns", "owner")]


def test_default_cluster_selection_follows_the_manager() -> None:
    selection = mcr.ClusterSelection()
    assert selection.includes("east", has_provider=True)
    assert not selection.includes(mcr.LOCAL_CLUSTER, has_provider=True)
    assert selection.includes(mcr.LOCAL_CLUSTER, has_provider=False)
    filtered = mcr.ClusterSelection(local=True, provider=True, filter=lambda name: name != "west")
    assert not filtered.includes("west", has_provider=True)
    assert filtered.includes(mcr.LOCAL_CLUSTER, has_provider=True)


def test_a_manager_needs_something_to_run() -> None:
    with pytest.raises(ValueError, match="needs a provider, a local cluster, or both"):
        mcr.Manager()


def test_optional_reaches_each_source_it_is_given_to() -> None:
    controller = (
        mcr.controller_managed_by(_manager())
        .for_(CONFIGMAP, optional=True)
        .owns(SECRET, optional=True)
        .watches(mcr.Kind("v1", "Service"), mcr.enqueue_for_object())
        .complete(_noop)
    )
    assert [(source.kind.kind, source.optional) for source in controller.sources] == [
        ("ConfigMap", True),
        ("Secret", True),
        ("Service", False),
    ]
