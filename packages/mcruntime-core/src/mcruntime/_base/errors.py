"""Typed errors of the runtime.

Every error that concerns a cluster carries the cluster's name, and every API
error carries the object it was about, so a log line or a traceback tells which
cluster and which object failed without a debugger. No error message ever
includes a credential: messages are built from names, kinds and the server's
reason, never from request headers or kubeconfig contents.
"""

from __future__ import annotations

from typing import Any


class MCRuntimeError(Exception):
    """Base of every error mcruntime raises on purpose."""


class KubeconfigError(MCRuntimeError):
    """A kubeconfig cannot be used; says which file, which context and what is wrong."""

    def __init__(self, message: str, *, origin: str | None = None, context: str | None = None) -> None:
        self.origin = origin
        self.context = context
        where = []
        if origin:
            where.append(origin)
        if context:
            where.append(f"context {context!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)


class TrustPolicyError(KubeconfigError):
    """A kubeconfig asks for something its trust policy does not allow.

    Exec plugins run programs, auth-providers call out to identity services and
    disabled TLS verification invites interception: a kubeconfig that a provider
    brings in from outside must not get any of them without an explicit opt-in.
    """


class ClusterNotFound(MCRuntimeError, LookupError):
    """No engaged cluster has this name (it never existed, or it is gone)."""

    def __init__(self, cluster: str, message: str | None = None) -> None:
        self.cluster = cluster
        super().__init__(message or f"cluster {cluster!r} is not engaged")


class KindNotFound(MCRuntimeError, LookupError):
    """The cluster serves no resource for this apiVersion and kind (yet)."""

    def __init__(self, cluster: str, api_version: str, kind: str) -> None:
        self.cluster = cluster
        self.api_version = api_version
        self.kind = kind
        super().__init__(f"cluster {cluster!r} serves no {kind} in {api_version}")


class APIError(MCRuntimeError):
    """The API server refused or failed a request.

    ``status`` is the HTTP status (0 when no response arrived), ``reason`` the
    Status object's machine-readable reason (``NotFound``, ``Conflict``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        cluster: str,
        status: int = 0,
        reason: str = "",
        kind: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        details: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.cluster = cluster
        self.status = status
        self.reason = reason
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self.details: dict[str, Any] = details or {}
        self.retry_after = retry_after
        self.message = message
        super().__init__(self._describe())

    @property
    def object_key(self) -> str:
        """``namespace/name``, ``name``, or an empty string for collection requests."""
        if self.name and self.namespace:
            return f"{self.namespace}/{self.name}"
        return self.name or ""

    def _describe(self) -> str:
        target = " ".join(part for part in (self.kind, self.object_key) if part)
        status = f"{self.status} {self.reason}".strip() if self.status else self.reason or "no response"
        where = f"cluster {self.cluster!r}" + (f", {target}" if target else "")
        return f"{where}: {status}: {self.message}"


class NotFound(APIError):
    """404: the object (or its namespace) does not exist."""


class AlreadyExists(APIError):
    """409 AlreadyExists: a create named an object that exists."""


class Conflict(APIError):
    """409 Conflict: a stale resourceVersion, or a field owned by another manager."""


class Invalid(APIError):
    """422: the object failed validation; ``details['causes']`` lists the fields."""


class BadRequest(APIError):
    """400: the request itself is malformed (for example an unsupported patch type)."""


class Unauthorized(APIError):
    """401: the credentials were not accepted."""


class Forbidden(APIError):
    """403: authenticated, but RBAC (or an admission plugin) says no."""


class Gone(APIError):
    """410: the resourceVersion was compacted away; a watcher must list again."""


class TooManyRequests(APIError):
    """429: throttled by API priority and fairness; ``retry_after`` says when to retry."""


class ServerTimeout(APIError):
    """504, or a 500 with reason Timeout or ServerTimeout: the server gave up; retry later."""


class ServerError(APIError):
    """Any other 5xx."""


class Unreachable(APIError):
    """No response: connection refused or reset, TLS failure, or a client-side timeout."""


class Fenced(APIError):
    """Not sent: the replica's share of the fleet, or its leadership, lapsed before this write.

    A replica that could not renew its Lease in time must assume another has
    taken its clusters. Stopping its work is a task on the event loop, and a
    late loop may run a reconcile first; the write that reconcile sends gets
    this error instead of racing the new owner. The controller queues the
    request again (a sharded gate drops it if its cluster moved away).
    """


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
    504: ServerTimeout,
}


def error_from_status(
    status: int,
    body: Any,
    *,
    cluster: str,
    kind: str | None = None,
    namespace: str | None = None,
    name: str | None = None,
    retry_after: float | None = None,
) -> APIError:
    """Build the typed error for a non-2xx response from its ``Status`` body.

    Falls back to the HTTP status when the body is not a Status object (proxies
    and load balancers answer with HTML or plain text).
    """
    reason = ""
    message = ""
    details: dict[str, Any] = {}
    if isinstance(body, dict) and body.get("kind") == "Status":
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
        raw_details = body.get("details")
        details = raw_details if isinstance(raw_details, dict) else {}
    elif isinstance(body, bytes | str):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        message = text.strip()[:300]
    if status == 409:
        error_type: type[APIError] = AlreadyExists if reason == "AlreadyExists" else Conflict
    elif status == 500 and reason in ("Timeout", "ServerTimeout"):  # the server sends ServerTimeout with 500
        error_type = ServerTimeout
    elif status in _BY_STATUS:
        error_type = _BY_STATUS[status]
    elif status >= 500:
        error_type = ServerError
    else:
        error_type = APIError
    return error_type(
        message or f"HTTP {status}",
        cluster=cluster,
        status=status,
        reason=reason,
        kind=kind,
        namespace=namespace,
        name=name,
        details=details,
        retry_after=retry_after,
    )
