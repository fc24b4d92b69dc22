"""The API server's warnings reach the log, once per cluster and text.

Found by an outside review: a write with a misspelt field (``dat`` for
``data``, ``spec.sise``) came back accepted with ``Warning: 299 - "unknown
field ..."``, the field dropped, and nothing said so, not even at DEBUG.
"""

from __future__ import annotations

import logging

import pytest
from kube_helpers import CONFIGMAP, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime._client.http1 import Headers
from mcruntime._client.server_warnings import MAX_SHOWN, warning_texts
from mcruntime.testing import Fleet

NAMESPACE = mcr.Kind("v1", "Namespace")


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mcruntime.client" and r.levelno == level]


async def test_an_unknown_field_is_named_once_at_warning_with_the_request(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "mcruntime.client")
    async with running_cluster(fleet["cluster-1"], "warned") as cluster:
        namespace = await new_namespace(cluster, "warned")
        for name in ("first", "second"):
            typo = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace},
            }
            typo["dat"] = {"k": "v"}
            created = await cluster.client.create(typo)
            assert "dat" not in created  # the API server dropped it: only its warning tells
        patched = await cluster.client.patch(CONFIGMAP, "first", {"dat": {"k": "w"}}, namespace=namespace)
        assert "dat" not in patched
        await cluster.client.delete(NAMESPACE, namespace)
    warned = _said(caplog, logging.WARNING)
    assert warned == [
        f"cluster 'warned': the API server warns (POST ConfigMap {namespace}/first): unknown field \"dat\""
    ]
    again = _said(caplog, logging.DEBUG)
    assert any(f"warns again (POST ConfigMap {namespace}/second)" in line for line in again), again
    assert any(f"warns again (PATCH ConfigMap {namespace}/first)" in line for line in again), again


def test_warning_headers_are_read_each_on_its_own_unquoted_and_bounded() -> None:
    headers = Headers(
        [
            (b"Content-Type", b"application/json"),
            (b"Warning", b'299 - "unknown field \\"spec.sise\\", and more"'),
            (b"warning", b'299 - "v1beta1 Thing is deprecated in v1.37+"'),
            (b"Warning", b"not in the format at all"),
            (b"Warning", b'299 - "' + b"x" * 2000 + b'"'),
        ]
    )
    texts = warning_texts(headers)
    assert texts[:3] == [
        'unknown field "spec.sise", and more',
        "v1beta1 Thing is deprecated in v1.37+",
        "not in the format at all",
    ]
    assert len(texts[3]) == MAX_SHOWN + 3 and texts[3].endswith("...")
    assert warning_texts(Headers([(b"Content-Length", b"2")])) == []
    assert warning_texts({"Warning": '299 - "from aiohttp"'}) == ["from aiohttp"]
