"""Webhook logic without a cluster: JSON patches, review parsing, conversion through the hub."""

from __future__ import annotations

import asyncio
import base64
import copy
from typing import Any

import orjson
import pytest

import mcruntime as mcr
from mcruntime._webhook.handlers import Conversion
from mcruntime._webhook.patch import json_patch
from mcruntime._webhook.review import (
    ReviewError,
    admission_response,
    conversion_response,
    decode,
    parse_admission,
    parse_conversion,
)


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    """A minimal RFC 6902 applier (add/remove/replace), to check patches round-trip."""
    document = copy.deepcopy(document)
    for operation in operations:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]]
        if not parts:
            document = operation["value"]
            continue
        parent = document
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        if operation["op"] == "remove":
            del parent[parts[-1]]
        else:
            parent[parts[-1]] = operation["value"]
    return document


def test_equal_documents_need_no_patch() -> None:
    assert json_patch({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}) == []


def test_a_defaulted_field_is_one_add() -> None:
    original = {"spec": {"image": "x"}}
    assert json_patch(original, {"spec": {"image": "x", "replicas": 1}}) == [
        {"op": "add", "path": "/spec/replicas", "value": 1}
    ]


def test_keys_with_slashes_and_tildes_are_escaped() -> None:
    operations = json_patch({"metadata": {}}, {"metadata": {"labels": {"a/b~c": "1"}}})
    assert operations == [{"op": "add", "path": "/metadata/labels", "value": {"a/b~c": "1"}}]
    operations = json_patch({"l": {"a/b~c": "0"}}, {"l": {"a/b~c": "1"}})
    assert operations == [{"op": "replace", "path": "/l/a~1b~0c", "value": "1"}]


def test_a_changed_list_is_replaced_whole_and_removals_are_removes() -> None:
    original = {"ports": [1, 2], "gone": True, "same": "s"}
    changed = {"ports": [0, 1, 2], "same": "s"}
    operations = json_patch(original, changed)
    assert {"op": "remove", "path": "/gone"} in operations
    assert {"op": "replace", "path": "/ports", "value": [0, 1, 2]} in operations
    assert apply_patch(original, operations) == changed


def test_a_type_change_is_a_change() -> None:
    assert json_patch({"a": True}, {"a": 1}) == [{"op": "replace", "path": "/a", "value": 1}]


def test_patches_round_trip_on_nested_documents() -> None:
    original = {"metadata": {"labels": {"a": "1"}}, "spec": {"x": {"y": [1]}, "z": None}}
    changed = {"metadata": {"labels": {"a": "2", "b": "3"}}, "spec": {"x": {"y": [1], "w": {}}}}
    assert apply_patch(original, json_patch(original, changed)) == changed


def admission_review(**request: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "uid": "u-1",
        "kind": {"group": "example.com", "version": "v1", "kind": "Test"},
        "operation": "CREATE",
        "namespace": "ns",
        "object": {"apiVersion": "example.com/v1", "kind": "Test", "metadata": {"name": "t"}},
        "userInfo": {"username": "alice"},
    }
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def test_an_admission_review_parses_with_its_cluster() -> None:
    request = parse_admission("east", admission_review(dryRun=True))
    assert request.cluster == "east"
    assert request.kind == mcr.Kind("example.com/v1", "Test")
    assert (request.operation, request.namespace, request.name) == ("CREATE", "ns", "t")
    assert request.username == "alice" and request.dry_run
    assert str(request) == "CREATE Test east:ns/t"


def test_the_object_and_user_stay_out_of_the_repr() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"token": "c2VjcmV0"}}
    request = parse_admission("east", admission_review(object=secret, userInfo={"extra": {"k": ["hidden"]}}))
    assert "c2VjcmV0" not in repr(request) and "hidden" not in repr(request)


@pytest.mark.parametrize(
    ("review", "complaint"),
    [
        (
            {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"},
            "'admission.k8s.io/v1beta1' is not served",
        ),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "ConversionReview"},
            "this endpoint takes a AdmissionReview",
        ),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "no request object"),
        (admission_review(uid=""), "request.uid is missing"),
        (admission_review(operation="PATCH"), "request.operation 'PATCH'"),
        (admission_review(kind="Test"), "request.kind needs group, version and kind"),
        (admission_review(object=None), "request.object is missing for CREATE"),
        (admission_review(oldObject=[1]), "request.oldObject is a list"),
        (admission_review(namespace=3), "request.namespace is not a string"),
    ],
)
def test_a_malformed_admission_review_names_what_is_wrong(review: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ReviewError, match="AdmissionReview") as raised:
        parse_admission("east", review)
    assert complaint in str(raised.value)


def test_garbage_is_not_a_review() -> None:
    with pytest.raises(ReviewError, match="not JSON"):
        decode(b"{nope")
    with pytest.raises(ReviewError, match="JSON list, not an object"):
        decode(b"[]")


def test_a_defaulting_answer_carries_the_patch_and_warnings() -> None:
    request = parse_admission("east", admission_review())
    request.warn("image defaulted")
    original = copy.deepcopy(request.object)
    assert request.object is not None
    request.object["spec"] = {"image": "busybox"}
    review = admission_response(request, allowed=True, original=original, defaulted=request.object)
    response = review["response"]
    assert response["uid"] == "u-1" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert orjson.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec", "value": {"image": "busybox"}}
    ]
    assert response["warnings"] == ["image defaulted"]


def test_a_denial_carries_its_message_and_code() -> None:
    request = parse_admission("east", admission_review())
    response = admission_response(request, allowed=False, message="no image", code=422, reason="Invalid")
    assert response["response"]["status"] == {"code": 422, "message": "no image", "reason": "Invalid"}
    assert "patch" not in response["response"]


def conversion_review(objects: list[dict[str, Any]], desired: str = "example.com/v1") -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "c-1", "desiredAPIVersion": desired, "objects": objects},
    }


def test_a_conversion_review_parses_and_answers() -> None:
    request = parse_conversion("west", conversion_review([{"apiVersion": "example.com/v1alpha1"}]))
    assert (request.cluster, request.uid, request.desired_api_version) == ("west", "c-1", "example.com/v1")
    assert conversion_response("c-1", [{"a": 1}]) == {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "response": {"uid": "c-1", "result": {"status": "Success"}, "convertedObjects": [{"a": 1}]},
    }
    failed = conversion_response("c-1", None, "bad")["response"]
    assert failed["result"] == {"status": "Failure", "message": "bad"} and failed["convertedObjects"] == []


def test_a_malformed_conversion_review_names_what_is_wrong() -> None:
    with pytest.raises(ReviewError, match="desiredAPIVersion must be group/version"):
        parse_conversion("west", conversion_review([], desired="v1"))
    with pytest.raises(ReviewError, match="objects must be a list of objects"):
        parse_conversion("west", conversion_review([1]))  # type: ignore[list-item]


def _to_hub(obj: dict[str, Any]) -> dict[str, Any]:
    obj["spec"] = {"image": obj["spec"].pop("img")}
    return obj


async def _from_hub(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["spec"]["image"] == "refuse":
        raise mcr.ConversionFailed("image 'refuse' has no v1alpha1 form")
    obj["spec"] = {"img": obj["spec"].pop("image")}
    return obj


CONVERSION = Conversion("example.com", "Test", "v1", {"v1alpha1": _to_hub}, {"v1alpha1": _from_hub})


async def test_conversion_goes_through_the_hub_both_ways() -> None:
    old = {"apiVersion": "example.com/v1alpha1", "kind": "Test", "spec": {"img": "x"}}
    hub = await CONVERSION.convert(old, "example.com/v1")
    assert hub == {"apiVersion": "example.com/v1", "kind": "Test", "spec": {"image": "x"}}
    back = await CONVERSION.convert(hub, "example.com/v1alpha1")
    assert back == {"apiVersion": "example.com/v1alpha1", "kind": "Test", "spec": {"img": "x"}}


async def test_a_failed_conversion_names_the_object_and_direction() -> None:
    obj = {
        "apiVersion": "example.com/v1",
        "kind": "Test",
        "metadata": {"name": "t"},
        "spec": {"image": "refuse"},
    }
    with pytest.raises(mcr.ConversionFailed, match=r"converting Test t from v1 to v1alpha1: image 'refuse'"):
        await CONVERSION.convert(obj, "example.com/v1alpha1")
    with pytest.raises(mcr.ConversionFailed, match="no conversion for version 'v2'"):
        await CONVERSION.convert(obj, "example.com/v2")


def test_a_conversion_without_both_directions_is_refused() -> None:
    broken = Conversion("example.com", "Test", "v1", {"v1alpha1": _to_hub}, {})
    assert broken.problems() == ["versions ['v1alpha1'] need both to_hub and from_hub functions"]


async def test_self_made_keys_leave_no_file_behind(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    from mcruntime._webhook.certs import SelfSignedCertificates

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    certificates = SelfSignedCertificates(("127.0.0.1", "webhook.example.com"))
    await certificates.load()
    first = certificates.not_after()
    await certificates.rotate()
    assert certificates.ca_bundle() is not None and b"BEGIN CERTIFICATE" in (certificates.ca_bundle() or b"")
    assert first is not None and certificates.not_after() is not None
    assert not certificates.due()
    import datetime

    issued = datetime.datetime.now(datetime.UTC)
    assert not certificates.due(issued + datetime.timedelta(days=4))
    assert certificates.due(issued + datetime.timedelta(days=5))  # two thirds of the 7 days
    assert list(tmp_path.iterdir()) == []
    assert "PRIVATE" not in repr(certificates)


async def _answer(hook: Any, *, mutating: bool, timeout: float = 5.0) -> dict[str, Any]:
    from mcruntime._webhook.server import WebhookServer

    server = WebhookServer(mcr.WebhookOptions(address="127.0.0.1:0", handler_timeout=timeout), clusters=dict)
    request = parse_admission("east", admission_review())
    answer = await server._answer(hook, request, asyncio.Semaphore(1), mutating=mutating)
    assert isinstance(answer, dict), answer
    response: dict[str, Any] = answer["response"]
    return response


async def test_handler_failures_are_answered_by_kind() -> None:
    from mcruntime._webhook.handlers import AdmissionHook

    async def returns_a_list(_req: mcr.AdmissionRequest) -> Any:
        return [1]

    async def own_timeout(_req: mcr.AdmissionRequest) -> None:
        raise TimeoutError("a call of its own timed out")

    never = asyncio.Event()

    async def hangs(_req: mcr.AdmissionRequest) -> None:
        await never.wait()

    kind = mcr.Kind("example.com/v1", "Test")
    response = await _answer(AdmissionHook(kind, defaulter=returns_a_list), mutating=True)
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "CREATE Test east:ns/t: the defaulter failed: TypeError: the defaulter returned a list, not the object"
    )
    response = await _answer(AdmissionHook(kind, validator=own_timeout), mutating=False)
    assert response["status"]["message"].endswith("the validator failed: TimeoutError")
    response = await _answer(AdmissionHook(kind, validator=hangs), mutating=False, timeout=0.05)
    assert response["status"]["message"].endswith("the validator did not answer within 0.05s")
    assert response["status"]["code"] == 500


@pytest.mark.parametrize(
    ("query", "seconds"),
    [
        ("timeout=10s", 10.0),
        ("timeout=1m0s", 60.0),
        ("dryRun=All&timeout=500ms", 0.5),
        ("timeout=2h3m4.5s", 7384.5),
        ("timeout=10", None),  # no unit: not a Go duration
        ("timeout=-1s", None),
        ("timeout=0s", None),
        ("timeout=1e9s", None),
        ("timeout=" + "9" * 40 + "s", None),  # longer than any duration an API server sends
        ("", None),
    ],
)
def test_the_callers_deadline_is_read_from_its_query_only_when_well_formed(
    query: str, seconds: float | None
) -> None:
    from mcruntime._webhook.exchange import caller_timeout

    assert caller_timeout(query) == seconds


async def test_certificate_files_gone_are_warned_about_once_and_their_return_is_said(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A refresh every reload_interval would otherwise repeat the warning, 8,640 times a day."""
    import logging

    from mcruntime._webhook.certs import CertificateFiles
    from mcruntime.testing._pki import CertificateAuthority

    pair = CertificateAuthority("files-ca").issue("webhook", server_hosts=("127.0.0.1",))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pair.cert_pem)
    key.write_bytes(pair.key_pem)
    files = CertificateFiles(cert, key)
    await files.load()
    cert.unlink()
    with caplog.at_level(logging.DEBUG, logger="mcruntime.webhook"):
        for _ in range(3):
            assert await files.refresh() is False
        cert.write_bytes(pair.cert_pem)
        assert await files.refresh() is False  # the same pair: nothing to reload, and the trouble is over
        assert await files.refresh() is False
    said = [
        (record.levelname, record.getMessage()) for record in caplog.records if record.levelno >= logging.INFO
    ]
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert said[0][1].startswith("webhook certificate files unreadable (")
    assert said[1][1] == f"webhook certificate files {cert} and {key} load again"
