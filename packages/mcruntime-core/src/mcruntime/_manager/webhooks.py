"""The webhook builder: validators, defaulters and conversion for a kind, wired like a controller.

``webhook_managed_by(mgr).for_(KIND).with_validator(v).with_defaulter(d).complete()``
reads like controller-runtime's ``NewWebhookManagedBy``. The handlers run in
the manager's webhook server for every engaged cluster, and each call names
the cluster that made it. Mistakes (no ``for_``, nothing to serve, a plain
``def`` validator or defaulter, a conversion without a function for some
version) are :class:`BuilderError` errors from
``complete``, not surprises when the first API server calls.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .._base.kind import Kind
from .._webhook.handlers import AdmissionHook, Conversion, ConversionFunction, Defaulter, OnError, Validator
from .builder import BuilderError

if TYPE_CHECKING:
    from .._fleet.protocols import Aware
    from .._webhook.server import WebhookServer
    from .manager import Manager


_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


@dataclass(frozen=True)
class Webhooks:
    """What :meth:`WebhookBuilder.complete` registered for one kind."""

    kind: Kind
    validating: bool
    mutating: bool
    converting: bool


class WebhookBuilder:
    """Collects one kind's webhooks; :meth:`complete` registers them with the manager's server."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._kind: Kind | None = None
        self._validator: Validator | None = None
        self._defaulter: Defaulter | None = None
        self._conversion: (
            tuple[str, Mapping[str, ConversionFunction], Mapping[str, ConversionFunction]] | None
        ) = None
        self._on_error: OnError = "deny"
        self._resource: str | None = None
        self._operations: tuple[str, ...] = ("CREATE", "UPDATE")
        self._failure_policy: Literal["Fail", "Ignore"] = "Fail"
        self._timeout_seconds = 10
        self._namespace_selector: dict[str, object] | None = None
        self._object_selector: dict[str, object] | None = None
        self._problems: list[str] = []

    def for_(self, kind: Kind, *, resource: str | None = None) -> WebhookBuilder:
        """The kind these webhooks admit (and, with conversion, its group and kind).

        ``resource`` is its plural; by default each cluster's discovery finds it.
        """
        if self._kind is not None:
            self._problems.append(
                f"for_ was called twice ({self._kind} and {kind}); a webhook builder has one"
            )
            return self
        self._kind = kind
        self._resource = resource
        return self

    def with_validator(self, validator: Validator) -> WebhookBuilder:
        """``async def validate(req) -> None``: raise :class:`Denied` to refuse; ``req.warn`` warns."""
        self._validator = validator
        return self

    def with_defaulter(self, defaulter: Defaulter) -> WebhookBuilder:
        """``async def default(req) -> dict | None``: the object to store; the runtime computes the patch."""
        self._defaulter = defaulter
        return self

    def with_conversion(
        self,
        *,
        hub: str,
        to_hub: Mapping[str, ConversionFunction],
        from_hub: Mapping[str, ConversionFunction],
    ) -> WebhookBuilder:
        """Serve the CRD's conversion: ``to_hub[v]`` and ``from_hub[v]`` for every version ``v`` but the hub.

        Versions are the bare version names (``"v1alpha1"``); the functions take
        and return one object and need not set ``apiVersion``. Raise
        :class:`ConversionFailed` to refuse an object with a message.
        """
        self._conversion = (hub, dict(to_hub), dict(from_hub))
        return self

    def with_options(
        self,
        *,
        on_error: OnError | None = None,
        operations: tuple[str, ...] | list[str] | None = None,
        failure_policy: Literal["Fail", "Ignore"] | None = None,
        timeout_seconds: int | None = None,
        namespace_selector: dict[str, object] | None = None,
        object_selector: dict[str, object] | None = None,
    ) -> WebhookBuilder:
        """How calls fail and which requests the registered configurations send.

        ``on_error`` is what a handler that raises answers: ``"deny"`` (the
        default) refuses with a message, ``"error"`` answers HTTP 500 so that
        ``failure_policy`` decides. ``operations``, ``failure_policy``,
        ``timeout_seconds`` (1 to 30) and the selectors go into the
        configurations the manager registers.
        """
        if on_error is not None:
            if on_error not in ("deny", "error"):
                self._problems.append(f"on_error must be 'deny' or 'error', not {on_error!r}")
            self._on_error = on_error
        if operations is not None:
            unknown = [op for op in operations if op not in _OPERATIONS]
            if unknown or not operations:
                self._problems.append(
                    f"operations must be some of {', '.join(_OPERATIONS)}, not {list(operations)}"
                )
            self._operations = tuple(operations)
        if failure_policy is not None:
            if failure_policy not in ("Fail", "Ignore"):
                self._problems.append(f"failure_policy must be 'Fail' or 'Ignore', not {failure_policy!r}")
            self._failure_policy = failure_policy
        if timeout_seconds is not None:
            if not 1 <= timeout_seconds <= 30:
                self._problems.append(f"timeout_seconds must be between 1 and 30, not {timeout_seconds}")
            self._timeout_seconds = timeout_seconds
        if namespace_selector is not None:
            self._namespace_selector = namespace_selector
        if object_selector is not None:
            self._object_selector = object_selector
        return self

    def complete(self) -> Webhooks:
        """Register the webhooks with the manager's server (created with defaults if needed)."""
        problems = list(self._problems)
        kind = self._kind
        if kind is None:
            problems.append("call for_(kind) first: a webhook admits one kind")
        if self._validator is None and self._defaulter is None and self._conversion is None:
            problems.append("nothing to serve: call with_validator, with_defaulter or with_conversion")
        for role, handler in (("validator", self._validator), ("defaulter", self._defaulter)):
            if handler is not None and not _asynchronous(handler):
                problems.append(
                    f"the {role} {_named(handler)} is a plain function: a {role} is an `async def`, as it "
                    "runs on the event loop (a plain one would block every cluster's webhooks, then fail)"
                )
        conversion: Conversion | None = None
        if kind is not None and self._conversion is not None:
            hub, to_hub, from_hub = self._conversion
            if not kind.group:
                problems.append(f"{kind}: only custom resources (a named API group) can be converted")
            conversion = Conversion(kind.group, kind.kind, hub, to_hub, from_hub, self._resource)
            problems.extend(f"{kind} conversion: {problem}" for problem in conversion.problems())
        server = self._manager.webhook
        if server.port is None and self._manager.running:
            problems.append(
                "the manager is running without a webhook server; register webhooks before start, "
                "or build the Manager with webhook=WebhookOptions(...) so the server runs from the start"
            )
        if kind is not None:
            if self._validator is not None and kind in server.validators:
                problems.append(f"{kind} already has a validator in this manager")
            if self._defaulter is not None and kind in server.defaulters:
                problems.append(f"{kind} already has a defaulter in this manager")
            if conversion is not None and (kind.group, kind.kind) in server.conversions:
                problems.append(f"{kind.kind}.{kind.group} already has a conversion in this manager")
        if problems or kind is None:
            label = f"webhook for {kind}" if kind is not None else "webhook"
            raise BuilderError(f"{label}: " + "; ".join(problems))
        if self._validator is not None or self._defaulter is not None:
            server.add_admission(
                AdmissionHook(
                    kind,
                    validator=self._validator,
                    defaulter=self._defaulter,
                    on_error=self._on_error,
                    resource=self._resource,
                    operations=self._operations,
                    failure_policy=self._failure_policy,
                    timeout_seconds=self._timeout_seconds,
                    namespace_selector=self._namespace_selector,
                    object_selector=self._object_selector,
                )
            )
        if conversion is not None:
            server.add_conversion(conversion)
        return Webhooks(
            kind, self._validator is not None, self._defaulter is not None, conversion is not None
        )


def _asynchronous(handler: object) -> bool:
    """Whether calling ``handler`` gives an awaitable, as far as can be told without calling it.

    ``async def`` functions, methods and partials of them are; so is an object
    whose ``__call__`` is one. A plain ``def`` is not. A ``lambda`` gets the
    benefit of the doubt: it cannot await, so returning a coroutine
    (``lambda req: check(req)``) is what one is written for; if it returns
    anything else, the call fails naming it.
    """
    if inspect.iscoroutinefunction(handler):
        return True
    if inspect.isfunction(handler) and handler.__name__ == "<lambda>":
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 -- an instance's async __call__, not callable()
    plain = inspect.isfunction(handler) or inspect.ismethod(handler) or isinstance(handler, functools.partial)
    if not plain:
        return inspect.iscoroutinefunction(call)
    return False


def _named(handler: object) -> str:
    return repr(getattr(handler, "__qualname__", None) or type(handler).__name__)


async def close_before_clusters(
    server: WebhookServer, awares: list[Aware], grace: float, began: float
) -> int:
    """Close the webhook server at shutdown, after the reconciles' drain; how many calls were cut short.

    It closes before the clusters stop: a call in flight may use the calling
    cluster's client (it would fail with ``ClusterNotFound``), and one arriving
    meanwhile must hear that the server is shutting down, not that its cluster
    left the fleet. The calls get what is left of ``grace`` (counted from
    ``began``, on ``time.monotonic``), at least a second; each is bounded by its
    own timeout anyway.
    """
    if server in awares:
        awares.remove(server)
    return await server.close(grace=max(1.0, grace - (time.monotonic() - began)))


def webhook_managed_by(manager: Manager) -> WebhookBuilder:
    """Start wiring admission and conversion webhooks for ``manager``."""
    return WebhookBuilder(manager)
