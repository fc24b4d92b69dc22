"""The provider kit's reporting rules, on their own: no cluster needed, only the bookkeeping.

A status shape every provider shares is only worth having if its rules hold
for every provider: a source that names a cluster it cannot build makes the
cluster FAILED (not missing), a source that is only waiting is not a failure,
and a broken new version never costs a working cluster its config.
"""

from __future__ import annotations

import logging
import types

import pytest

import mcruntime as mcr
from mcruntime.provider import ClusterSetProvider, LastGood, LastGoodConfigs, SourceStatus


def _config(server: str) -> mcr.ClusterConfig:
    document = {
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    return mcr.kubeconfig_from_dict(document, origin="test")


class _Reporting(ClusterSetProvider):
    def __init__(self) -> None:
        super().__init__("test sources")
        self.reported: dict[str, SourceStatus] = {}

    def sources(self) -> dict[str, SourceStatus]:
        return dict(self.reported)


def test_a_source_that_cannot_build_its_cluster_makes_it_failed_until_it_goes() -> None:
    provider = _Reporting()
    broken = SourceStatus(
        "Secret", "ns/east", cluster="east", error="Secret ns/east: not valid YAML at line 3"
    )
    provider.reported = {
        broken.name: broken,
        "ns/west": SourceStatus("Cluster", "ns/west", cluster="west", detail={"waiting": "not initialized"}),
        "crd": SourceStatus("CustomResourceDefinition", "crd", error="not installed"),
    }
    first = provider.statuses()
    assert list(first) == ["east"]  # waiting is not failing; a source naming no cluster is no cluster
    east = first["east"]
    assert east.phase is mcr.ClusterPhase.FAILED and east.engagements == 0
    assert east.error == broken.error and east.source is broken
    assert provider.statuses()["east"].since == east.since  # since it was first seen failed
    provider.reported = {}
    assert provider.statuses() == {}
    provider.reported = {broken.name: broken}
    assert provider.statuses()["east"].since >= east.since  # a new failure, a new since


def test_a_source_status_is_frozen_all_the_way_down() -> None:
    detail = {"duplicate_of": "ns/first"}
    source = SourceStatus("Secret", "ns/copy", cluster="east", detail=detail)
    detail["duplicate_of"] = "changed"  # the caller's dict is copied, not kept
    assert source.detail == {"duplicate_of": "ns/first"}
    assert isinstance(source.detail, types.MappingProxyType)
    with pytest.raises(TypeError):
        source.detail["duplicate_of"] = "x"  # type: ignore[index]
    with pytest.raises(AttributeError):
        source.error = "x"  # type: ignore[misc]


def test_last_good_configs_keep_a_cluster_on_its_last_working_version(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="mcruntime.provider")
    kept = LastGoodConfigs("test objects")
    good = _config("https://127.0.0.1:1")
    chosen, source = kept.judge("Cluster", "ns/a", good, None, previous=None, version="1")
    assert chosen is good and source.engaged and not source.stale and source.cluster == "ns/a"
    # A broken version: the last good config stays, reported stale, logged once.
    chosen, broken = kept.judge("Cluster", "ns/a", None, "bad CA", previous=source, version="2")
    assert chosen is good and broken.stale and broken.engaged and broken.error == "bad CA"
    kept.judge("Cluster", "ns/a", None, "bad CA", previous=broken, version="2")
    assert caplog.text.count("bad CA") == 1 and "keeping its last good config" in caplog.text
    # Waiting (no config, no error) is neither a failure nor a removal.
    chosen, waiting = kept.judge("Cluster", "ns/a", None, None, previous=broken, detail={"ready": "false"})
    assert chosen is good and waiting.error is None and waiting.detail["ready"] == "false"
    # Only the source's removal lets the config go; it never comes back.
    kept.retain([])
    assert "ns/a" not in kept
    chosen, gone = kept.judge("Cluster", "ns/a", None, "bad CA", previous=None)
    assert chosen is None and not gone.engaged and not gone.stale


def test_last_good_holds_any_value_through_broken_versions_until_its_source_goes() -> None:
    """The rule on its own, for what is not one config: a name and a config, an access."""
    kept: LastGood[tuple[str, str]] = LastGood()
    assert kept.keep("ns/a", ("east", "v1")) == ("east", "v1")
    assert kept.keep("ns/a", None) == ("east", "v1")  # a broken version: the last good one serves
    assert kept.keeping("ns/a", "kubeconfig") == "keeping its last good kubeconfig"
    assert kept.keep("ns/b", None) is None and kept.keeping("ns/b") == "not engaged"
    kept.keep("ns/b", ("west", "v1"))
    kept.retain(["ns/b"])  # ns/a's source is gone
    assert "ns/a" not in kept and kept.keep("ns/a", None) is None  # and it never comes back
    kept.forget("ns/b")
    assert len(kept) == 0 and list(kept) == []
