"""Typed errors: Status responses mapped to error types, and what their messages say."""

from __future__ import annotations

from typing import Any

import pytest

from mcruntime._base.errors import (
    AlreadyExists,
    APIError,
    BadRequest,
    ClusterNotFound,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    KindNotFound,
    KubeconfigError,
    MCRuntimeError,
    NotFound,
    ServerError,
    ServerTimeout,
    TooManyRequests,
    Unauthorized,
    Unreachable,
    error_from_status,
)


def status_body(
    code: int, reason: str, message: str = "", details: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``Status`` object as the API server sends it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or f"made-up message for {reason}",
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


# -- status to type -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason", "expected"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "AlreadyExists", AlreadyExists),
        (409, "Conflict", Conflict),
        (410, "Expired", Gone),
        (410, "Gone", Gone),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", ServerError),
        (500, "Timeout", ServerTimeout),
        (500, "ServerTimeout", ServerTimeout),
        (502, "", ServerError),
        (503, "ServiceUnavailable", ServerError),
        (504, "Timeout", ServerTimeout),
    ],
)
def test_each_status_maps_to_its_error_type(code: int, reason: str, expected: type[APIError]) -> None:
    error = error_from_status(code, status_body(code, reason), cluster="east")

    assert type(error) is expected
    assert error.status == code
    assert error.reason == reason


def test_a_409_is_already_exists_only_when_the_reason_says_so() -> None:
    exists = error_from_status(409, status_body(409, "AlreadyExists"), cluster="east")
    stale = error_from_status(409, status_body(409, "Conflict"), cluster="east")
    unexplained = error_from_status(409, status_body(409, ""), cluster="east")

    assert isinstance(exists, AlreadyExists)
    assert isinstance(stale, Conflict)
    assert isinstance(unexplained, Conflict)
    assert not isinstance(exists, Conflict)
    assert not isinstance(stale, AlreadyExists)


def test_a_500_is_a_server_timeout_only_with_a_timeout_reason() -> None:
    assert isinstance(error_from_status(500, status_body(500, "Timeout"), cluster="east"), ServerTimeout)
    assert isinstance(
        error_from_status(500, status_body(500, "ServerTimeout"), cluster="east"), ServerTimeout
    )
    assert type(error_from_status(500, status_body(500, "InternalError"), cluster="east")) is ServerError


@pytest.mark.parametrize("code", [501, 502, 503, 599])
def test_any_other_5xx_is_a_server_error(code: int) -> None:
    assert type(error_from_status(code, None, cluster="east")) is ServerError


@pytest.mark.parametrize("code", [405, 406, 413, 415])
def test_an_unmapped_4xx_is_a_plain_api_error(code: int) -> None:
    error = error_from_status(code, status_body(code, "MethodNotAllowed"), cluster="east")

    assert type(error) is APIError
    assert error.status == code


def test_every_api_error_type_is_an_mcruntime_error() -> None:
    for error_type in (
        NotFound,
        AlreadyExists,
        Conflict,
        Invalid,
        BadRequest,
        Unauthorized,
        Forbidden,
        Gone,
        TooManyRequests,
        ServerTimeout,
        ServerError,
        Unreachable,
    ):
        assert issubclass(error_type, APIError)
    assert issubclass(APIError, MCRuntimeError)


# -- bodies that are not a Status -----------------------------------------------------


def test_an_html_body_falls_back_on_the_http_status_and_keeps_the_text() -> None:
    body = b"<html><body><h1>502 Bad Gateway</h1></body></html>\n"

    error = error_from_status(502, body, cluster="east")

    assert type(error) is ServerError
    assert error.reason == ""
    assert error.message == "<html><body><h1>502 Bad Gateway</h1></body></html>"


def test_a_plain_text_body_falls_back_on_the_http_status() -> None:
    error = error_from_status(404, "  404 page not found\n", cluster="east", kind="Widget")

    assert type(error) is NotFound
    assert error.message == "404 page not found"


def test_a_409_text_body_is_a_conflict() -> None:
    assert type(error_from_status(409, b"conflict", cluster="east")) is Conflict


def test_a_body_that_is_not_utf8_is_decoded_with_replacements() -> None:
    error = error_from_status(503, b"upstream \xff\xfe down", cluster="east")

    assert type(error) is ServerError
    assert error.message == "upstream \ufffd\ufffd down"


def test_a_long_text_body_is_cut_to_300_characters() -> None:
    error = error_from_status(503, "x" * 5000, cluster="east")

    assert error.message == "x" * 300


@pytest.mark.parametrize(
    "body", [None, b"", "   ", {"kind": "Pod", "message": "not a Status"}, ["a", "list"], 42]
)
def test_an_empty_or_foreign_body_gives_the_http_status_as_the_message(body: Any) -> None:
    error = error_from_status(403, body, cluster="east")

    assert type(error) is Forbidden
    assert error.message == "HTTP 403"
    assert error.reason == ""
    assert error.details == {}


# -- what an error carries and says ---------------------------------------------------


def test_str_names_the_cluster_the_kind_and_the_namespaced_object() -> None:
    error = error_from_status(
        404,
        status_body(404, "NotFound", 'configmaps "settings" not found'),
        cluster="east",
        kind="ConfigMap",
        namespace="team-a",
        name="settings",
    )

    assert (
        str(error)
        == "cluster 'east', ConfigMap team-a/settings: 404 NotFound: configmaps \"settings\" not found"
    )
    assert error.object_key == "team-a/settings"
    assert (error.cluster, error.kind, error.namespace, error.name) == (
        "east",
        "ConfigMap",
        "team-a",
        "settings",
    )


def test_str_names_a_cluster_scoped_object_by_name_alone() -> None:
    error = error_from_status(
        403, status_body(403, "Forbidden", "no"), cluster="west", kind="Namespace", name="prod"
    )

    assert str(error) == "cluster 'west', Namespace prod: 403 Forbidden: no"
    assert error.object_key == "prod"


def test_str_of_a_collection_request_names_the_cluster_and_the_kind() -> None:
    error = error_from_status(
        403, status_body(403, "Forbidden", "no"), cluster="west", kind="Pod", namespace="a"
    )

    assert str(error) == "cluster 'west', Pod: 403 Forbidden: no"
    assert error.object_key == ""


def test_str_without_a_kind_or_a_reason_still_names_cluster_and_status() -> None:
    assert str(error_from_status(502, None, cluster="west")) == "cluster 'west': 502: HTTP 502"


def test_an_error_without_a_response_says_so() -> None:
    error = Unreachable("connection refused", cluster="west")

    assert error.status == 0
    assert str(error) == "cluster 'west': no response: connection refused"


def test_details_are_kept_with_the_causes_of_an_invalid_object() -> None:
    details = {
        "name": "web",
        "kind": "Deployment",
        "causes": [
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.selector"},
            {"reason": "FieldValueInvalid", "message": "must be >= 0", "field": "spec.replicas"},
        ],
    }

    error = error_from_status(
        422, status_body(422, "Invalid", "Deployment is invalid", details), cluster="east"
    )

    assert isinstance(error, Invalid)
    assert error.details == details
    assert [cause["field"] for cause in error.details["causes"]] == ["spec.selector", "spec.replicas"]


def test_details_that_are_not_a_mapping_become_empty() -> None:
    body = status_body(422, "Invalid")
    body["details"] = "nonsense"

    assert error_from_status(422, body, cluster="east").details == {}


def test_retry_after_is_kept() -> None:
    error = error_from_status(429, status_body(429, "TooManyRequests"), cluster="east", retry_after=7.0)

    assert isinstance(error, TooManyRequests)
    assert error.retry_after == 7.0


def test_retry_after_defaults_to_none() -> None:
    assert error_from_status(503, None, cluster="east").retry_after is None


def test_api_errors_can_be_raised_and_caught_by_their_type() -> None:
    with pytest.raises(NotFound, match="cluster 'east', Secret ns/token"):
        raise error_from_status(
            404, status_body(404, "NotFound"), cluster="east", kind="Secret", namespace="ns", name="token"
        )


# -- other errors ---------------------------------------------------------------------


def test_a_kubeconfig_error_names_the_origin_and_the_context() -> None:
    error = KubeconfigError("cluster entry 'x' not found", origin="/home/me/.kube/config", context="dev")

    assert str(error) == "/home/me/.kube/config, context 'dev': cluster entry 'x' not found"
    assert (error.origin, error.context) == ("/home/me/.kube/config", "dev")


def test_a_kubeconfig_error_without_an_origin_is_its_message() -> None:
    assert str(KubeconfigError("no kubeconfig file found")) == "no kubeconfig file found"


def test_cluster_not_found_is_a_lookup_error_naming_the_cluster() -> None:
    error = ClusterNotFound("gone-cluster")

    assert isinstance(error, LookupError)
    assert error.cluster == "gone-cluster"
    assert str(error) == "cluster 'gone-cluster' is not engaged"


def test_kind_not_found_names_the_cluster_the_kind_and_the_api_version() -> None:
    error = KindNotFound("east", "example.com/v1", "Widget")

    assert isinstance(error, LookupError)
    assert str(error) == "cluster 'east' serves no Widget in example.com/v1"
