"""AdmissionReview and ConversionReview: what the API server sends, and what it gets back.

Parsing is strict and cheap: a body that is not the review it claims to be is a
:class:`ReviewError` naming the field that is wrong, which the server turns into
a 400 with that message, so a misconfigured webhook is diagnosed from the API
server's own error. Only the ``v1`` reviews are served (``admission.k8s.io/v1``
and ``apiextensions.k8s.io/v1``); configurations this runtime installs ask for
nothing else.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from .._base.errors import MCRuntimeError
from .._base.kind import Kind
from .patch import json_patch

JSON = dict[str, Any]
ADMISSION_API_VERSION = "admission.k8s.io/v1"
CONVERSION_API_VERSION = "apiextensions.k8s.io/v1"

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class ReviewError(MCRuntimeError, ValueError):
    """A request body is not a review this server understands; the message says which field."""


class Denied(MCRuntimeError):
    """Raise from a validator or defaulter to refuse the request; the client sees ``message``.

    ``code`` is the HTTP status the API server reports to the client (403 by
    default, like a policy refusal; 422 reads as "invalid"), ``reason`` its
    machine-readable reason.
    """

    def __init__(self, message: str, *, code: int = 403, reason: str = "Forbidden") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


@dataclass
class AdmissionRequest:
    """One admission call: which cluster asked, about what, on whose behalf.

    ``object`` is the object as it would be stored (``None`` for DELETE);
    ``old_object`` the stored one (UPDATE and DELETE). A defaulter may change
    ``object`` in place. :meth:`warn` adds a warning the client prints
    (``kubectl`` shows them as ``Warning: ...``) whatever the answer.
    """

    cluster: str
    uid: str
    kind: Kind
    operation: Operation
    namespace: str
    name: str
    # Out of the repr: an admitted Secret's data or a user's extra attributes must not reach a log line.
    object: JSON | None = field(repr=False)
    old_object: JSON | None = field(repr=False)
    user_info: JSON = field(repr=False)
    dry_run: bool
    sub_resource: str = ""
    options: JSON | None = field(default=None, repr=False)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """Send ``message`` back to the client as a warning, whatever the outcome."""
        self.warnings.append(message)

    @property
    def username(self) -> str:
        """Who made the request (``userInfo.username``)."""
        name = self.user_info.get("username")
        return name if isinstance(name, str) else ""

    def __str__(self) -> str:
        cluster = self.cluster or "(local)"
        key = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.operation} {self.kind.kind} {cluster}:{key or '(unnamed)'}"


@dataclass(frozen=True)
class ConversionRequest:
    """One conversion call: the cluster, the objects, and the apiVersion they must come back in."""

    cluster: str
    uid: str
    desired_api_version: str
    objects: list[JSON]


def decode(body: bytes) -> JSON:
    """The body as a JSON object, or a :class:`ReviewError` saying why not."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise ReviewError(f"the body is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise ReviewError(f"the body is a JSON {type(data).__name__}, not an object")
    return data


def _check_review(data: JSON, kind: str, api_version: str) -> JSON:
    if data.get("kind") != kind:
        raise ReviewError(f"kind is {data.get('kind')!r}; this endpoint takes a {kind}")
    if data.get("apiVersion") != api_version:
        raise ReviewError(
            f"{kind} apiVersion {data.get('apiVersion')!r} is not served; use {api_version!r} "
            "(list it first in the configuration's review versions)"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError(f"{kind} has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError(f"{kind} request.uid is missing")
    return request


def _optional_object(request: JSON, key: str) -> JSON | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ReviewError(f"AdmissionReview request.{key} is a {type(value).__name__}, not an object")
    return value


def _string(request: JSON, key: str) -> str:
    value = request.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReviewError(f"AdmissionReview request.{key} is not a string")
    return value


def parse_admission(cluster: str, data: JSON) -> AdmissionRequest:
    """The admission request in ``data`` (an AdmissionReview), for ``cluster``."""
    request = _check_review(data, "AdmissionReview", ADMISSION_API_VERSION)
    operation = request.get("operation")
    if operation not in _OPERATIONS:
        raise ReviewError(
            f"AdmissionReview request.operation {operation!r} is not one of {', '.join(_OPERATIONS)}"
        )
    kind = request.get("kind")
    if (
        not isinstance(kind, dict)
        or not isinstance(kind.get("kind"), str)
        or not isinstance(kind.get("version"), str)
    ):
        raise ReviewError("AdmissionReview request.kind needs group, version and kind")
    group = kind.get("group") or ""
    api_version = f"{group}/{kind['version']}" if group else kind["version"]
    user_info = request.get("userInfo") or {}
    if not isinstance(user_info, dict):
        raise ReviewError("AdmissionReview request.userInfo is not an object")
    obj = _optional_object(request, "object")
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise ReviewError(f"AdmissionReview request.object is missing for {operation}")
    return AdmissionRequest(
        cluster=cluster,
        uid=request["uid"],
        kind=Kind(api_version, kind["kind"]),
        operation=operation,
        namespace=_string(request, "namespace"),
        name=_string(request, "name") or _name_of(obj),
        object=obj,
        old_object=_optional_object(request, "oldObject"),
        user_info=user_info,
        dry_run=bool(request.get("dryRun")),
        sub_resource=_string(request, "subResource"),
        options=_optional_object(request, "options"),
    )


def _name_of(obj: JSON | None) -> str:
    # On CREATE with generateName the request carries no name yet.
    metadata = (obj or {}).get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def admission_response(
    request: AdmissionRequest,
    *,
    allowed: bool,
    message: str | None = None,
    code: int | None = None,
    reason: str | None = None,
    original: JSON | None = None,
    defaulted: JSON | None = None,
) -> JSON:
    """The AdmissionReview answering ``request``, with a JSON patch when ``defaulted`` differs."""
    response: JSON = {"uid": request.uid, "allowed": allowed}
    if not allowed or message:
        status: JSON = {"code": code or (200 if allowed else 403)}
        if message:
            status["message"] = message
        if reason:
            status["reason"] = reason
        response["status"] = status
    if allowed and original is not None and defaulted is not None:
        operations = json_patch(original, defaulted)
        if operations:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(operations)).decode("ascii")
    if request.warnings:
        response["warnings"] = list(request.warnings)
    return {"apiVersion": ADMISSION_API_VERSION, "kind": "AdmissionReview", "response": response}


def parse_conversion(cluster: str, data: JSON) -> ConversionRequest:
    """The conversion request in ``data`` (a ConversionReview), for ``cluster``."""
    request = _check_review(data, "ConversionReview", CONVERSION_API_VERSION)
    desired = request.get("desiredAPIVersion")
    if not isinstance(desired, str) or "/" not in desired:
        raise ReviewError("ConversionReview request.desiredAPIVersion must be group/version")
    objects = request.get("objects")
    if not isinstance(objects, list) or not all(isinstance(obj, dict) for obj in objects):
        raise ReviewError("ConversionReview request.objects must be a list of objects")
    return ConversionRequest(cluster, request["uid"], desired, objects)


def conversion_response(uid: str, converted: list[JSON] | None, failure: str | None = None) -> JSON:
    """The ConversionReview answering ``uid``: every object converted, or a failure with its message."""
    result: JSON = {"status": "Success"} if failure is None else {"status": "Failure", "message": failure}
    response: JSON = {"uid": uid, "result": result}
    response["convertedObjects"] = converted if failure is None and converted is not None else []
    return {"apiVersion": CONVERSION_API_VERSION, "kind": "ConversionReview", "response": response}


def snapshot(obj: JSON | None) -> JSON | None:
    """A deep copy, taken before a defaulter runs, to diff its result against.

    A JSON round trip through orjson: several times faster than ``copy.deepcopy``
    on a large object, and the object is JSON by construction.
    """
    return orjson.loads(orjson.dumps(obj)) if obj is not None else None


def encode(review: JSON) -> bytes:
    """A review as JSON, with orjson (the standard library is several times slower)."""
    return orjson.dumps(review)


def object_names(objects: list[JSON], shown: int = 3) -> str:
    """``ns/name`` of the first few objects of a conversion, for its log line."""
    names = []
    for obj in objects[:shown]:
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        namespace, name = metadata.get("namespace"), metadata.get("name", "?")
        names.append(f"{namespace}/{name}" if namespace else str(name))
    more = f" and {len(objects) - shown} more" if len(objects) > shown else ""
    return ", ".join(names) + more
