"""What users write: validators, defaulters and conversion functions, and how each is run.

A validator is ``async def validate(req: AdmissionRequest) -> None``: it returns
to allow and raises :class:`Denied` to refuse. A defaulter is
``async def default(req) -> dict | None``: it returns the object as it should be
stored (or changes ``req.object`` in place and returns ``None``); the runtime
computes the JSON patch. Both may call ``req.warn(...)``.

Conversion goes through a hub, as in controller-runtime: for every other
version ``v`` the user gives ``to_hub[v]`` and ``from_hub[v]``, so n versions
need 2(n-1) functions, not n(n-1). The functions take and return one object;
the runtime sets ``apiVersion`` on the result, so a function only moves fields.
A plain (not ``async``) function runs in a thread of its own: it may block (a
synchronous lookup, say) without stalling every cluster's webhooks, and the
call's timeout still answers on time. An ``async`` function runs on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .._base.errors import MCRuntimeError
from .._base.kind import Kind
from .review import JSON, AdmissionRequest

Validator = Callable[[AdmissionRequest], Awaitable[None]]
"""``async def validate(req) -> None``: return to allow, raise :class:`Denied` to refuse."""

Defaulter = Callable[[AdmissionRequest], Awaitable[JSON | None]]
"""``async def default(req) -> dict | None``: the object to store (``None``: ``req.object`` as changed)."""

ConversionFunction = Callable[[JSON], JSON | Awaitable[JSON]]
"""Converts one object between a version and the hub (plain or ``async`` function)."""

PlainRunner = Callable[[Callable[[JSON], Any], JSON, str], Awaitable[Any]]
"""Runs a plain conversion function off the event loop: ``run(function, obj, what)``.

The server bounds each cluster's threads (see ``converting.PlainThreads``);
``what`` names the object and direction for its log line.
"""

IDENTITY = ("kind", "metadata.name", "metadata.namespace", "metadata.uid")
"""What a conversion must keep: the API server matches each result to its object by them."""

OnError = Literal["deny", "error"]
"""What a handler that raises (anything but :class:`Denied`) answers.

``"deny"`` refuses the request with a message naming the webhook (the object is
not admitted whatever the configuration says); ``"error"`` answers HTTP 500, so
the configuration's ``failurePolicy`` decides (``Ignore`` admits, ``Fail``
refuses).
"""


class ConversionFailed(MCRuntimeError):
    """Raise from a conversion function to refuse an object; the client sees the message."""


@dataclass
class AdmissionHook:
    """The validator and defaulter registered for one kind, and how to install them."""

    kind: Kind
    validator: Validator | None = None
    defaulter: Defaulter | None = None
    on_error: OnError = "deny"
    resource: str | None = None
    operations: tuple[str, ...] = ("CREATE", "UPDATE")
    failure_policy: Literal["Fail", "Ignore"] = "Fail"
    timeout_seconds: int = 10
    namespace_selector: JSON | None = None
    object_selector: JSON | None = None


@dataclass
class Conversion:
    """How the versions of one group and kind convert, through the hub version."""

    group: str
    kind: str
    hub: str
    to_hub: Mapping[str, ConversionFunction] = field(default_factory=dict)
    from_hub: Mapping[str, ConversionFunction] = field(default_factory=dict)
    resource: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with the mapping, for the builder's error."""
        found = []
        if self.hub in self.to_hub or self.hub in self.from_hub:
            found.append(f"the hub version {self.hub!r} needs no conversion function of its own")
        if set(self.to_hub) != set(self.from_hub):
            missing = sorted(set(self.to_hub) ^ set(self.from_hub))
            found.append(f"versions {missing} need both to_hub and from_hub functions")
        if not self.to_hub:
            found.append("give to_hub and from_hub functions for at least one version besides the hub")
        return found

    @property
    def versions(self) -> set[str]:
        """Every version this conversion knows, the hub included."""
        return {self.hub, *self.to_hub, *self.from_hub}

    async def convert(
        self, obj: JSON, desired_api_version: str, *, run_plain: PlainRunner | None = None
    ) -> JSON:
        """``obj`` in ``desired_api_version``; raises :class:`ConversionFailed` naming what failed.

        ``run_plain`` runs a plain function (by default in a thread of the
        default executor; the server passes its cluster's bounded threads).
        """
        api_version = obj.get("apiVersion")
        if not isinstance(api_version, str) or "/" not in api_version:
            raise ConversionFailed(f"{_describe(obj)} has no apiVersion group/version")
        source = api_version.rpartition("/")[2]
        target = desired_api_version.rpartition("/")[2]
        if source == target:
            return obj
        for version in (source, target):
            if version not in self.versions:
                raise ConversionFailed(
                    f"{self.kind}.{self.group}: no conversion for version {version!r} "
                    f"(known: {', '.join(sorted(self.versions))})"
                )
        hub = obj
        if source != self.hub:
            hub = await _call(self.to_hub[source], obj, f"{source} to {self.hub}", run_plain)
            hub["apiVersion"] = f"{self.group}/{self.hub}"
        converted = hub
        if target != self.hub:
            converted = await _call(self.from_hub[target], hub, f"{self.hub} to {target}", run_plain)
        converted["apiVersion"] = desired_api_version
        return converted


def _describe(obj: JSON) -> str:
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    name = metadata.get("name", "") if isinstance(metadata, dict) else ""
    namespace = metadata.get("namespace", "") if isinstance(metadata, dict) else ""
    return f"{obj.get('kind', 'object')} {namespace + '/' if namespace else ''}{name}"


async def _in_thread(function: Callable[[JSON], Any], obj: JSON, what: str) -> Any:
    return await asyncio.to_thread(function, obj)


def _is_async(function: object) -> bool:
    # A callable object's async __call__ counts too; partials of async functions are unwrapped by inspect.
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
        getattr(function, "__call__", None)  # noqa: B004
    )


def _identity(obj: object, part: str) -> object:
    """``obj``'s ``kind`` or one of its ``metadata`` fields (``None`` when absent)."""
    if not isinstance(obj, dict):
        return None
    if part == "kind":
        return obj.get("kind")
    metadata = obj.get("metadata")
    return metadata.get(part.partition(".")[2]) if isinstance(metadata, dict) else None


async def _call(
    function: ConversionFunction, obj: JSON, direction: str, run_plain: PlainRunner | None = None
) -> JSON:
    # Taken first: the function may change obj in place.
    before, described = {part: _identity(obj, part) for part in IDENTITY}, _describe(obj)
    try:
        if _is_async(function):
            result: Any = function(obj)
        else:  # in a thread: a blocking call must not stall every cluster's webhooks
            run = run_plain or _in_thread
            result = await run(function, obj, f"converting {described} from {direction}")
        if inspect.isawaitable(result):
            result = await result
    except ConversionFailed as error:
        raise ConversionFailed(f"converting {described} from {direction}: {error}") from error
    except Exception as error:
        # The type only: an exception's text may hold anything (a field's value, a secret), and
        # this message goes to the client. The server logs the traceback (see converting.py).
        raise ConversionFailed(
            f"converting {described} from {direction} failed: {type(error).__name__}"
        ) from error
    if not isinstance(result, dict):
        raise ConversionFailed(
            f"converting {described} from {direction} returned a {type(result).__name__}, not an object"
        )
    for part in IDENTITY:
        # Checked here, not left to the API server: its error names no object and the operator's
        # log would have nothing.
        after = _identity(result, part)
        if after != before[part]:
            raise ConversionFailed(
                f"converting {described} from {direction} changed {part} from {before[part]!r} "
                f"to {after!r}; a conversion must keep kind, name, namespace and uid"
            )
    return result
