"""Running one admission handler, and answering when it fails or is cut short.

The handler runs as if reconciling the object (``mgr.client`` addresses the
call's cluster); what it returns is checked so that a mistaken verdict fails
closed; and every failure becomes the answer its ``on_error`` asks for.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

from .._reconcile.context import enter_reconcile, leave_reconcile
from .._reconcile.request import Request
from .exchange import Call, Reply
from .handlers import AdmissionHook
from .review import JSON, AdmissionRequest, admission_response, encode


class HandlerMisuse(TypeError):
    """A handler broke its contract (a verdict returned, not async, no object).

    Its words are about the handler's shape, never the object's data, so the
    API server's caller is told them: "the validator failed: TypeError" alone
    sent an upgraded operator's users to its logs to learn that a validator
    returning ``True`` now refuses.
    """


async def run_handler(hook: AdmissionHook, review: AdmissionRequest, *, mutating: bool) -> JSON | None:
    """The defaulter's object or the validator's ``None``; a verdict that would admit by mistake raises."""
    if mutating:
        assert hook.defaulter is not None
        returned: object = await _awaited("defaulter", hook.defaulter(review))
        if returned is not None and not isinstance(returned, dict):
            raise HandlerMisuse(f"the defaulter returned a {type(returned).__name__}, not the object")
        defaulted = returned if returned is not None else review.object
        metadata = defaulted.get("metadata") if defaulted is not None else None
        if metadata is not None and not isinstance(metadata, dict):
            # The API server would refuse the patch with an unmarshal error the operator never sees.
            raise HandlerMisuse(f"the defaulter's object has a {type(metadata).__name__} as its metadata")
        return defaulted
    assert hook.validator is not None
    validate: Callable[[AdmissionRequest], Awaitable[object]] = hook.validator  # typed None; may not be
    verdict = await _awaited("validator", validate(review))
    if verdict is not None:
        # A validator that returns False or {"allowed": False} would otherwise admit: fail closed.
        raise HandlerMisuse(
            f"the validator returned a {type(verdict).__name__}; "
            "it returns None to admit and raises Denied to refuse"
        )
    return None


def _awaited(what: str, called: object) -> Awaitable[object]:
    """What a handler's call gave, if it can be awaited; the builder refuses plain functions it can tell."""
    if not inspect.isawaitable(called):
        returned = type(called).__name__
        raise HandlerMisuse(f"the {what} is not async: it returned a {returned}, not an awaitable")
    return called


def failed(hook: AdmissionHook, review: AdmissionRequest, message: str) -> JSON | Reply:
    """The answer to a call whose handler failed, per its ``on_error``: a denial, or a 500."""
    if hook.on_error == "error":
        return Reply.text(500, f"{review}: {message}")
    return admission_response(review, allowed=False, message=f"{review}: {message}", code=500)


def resume() -> None:
    """Take back this task's cancellation: the server closing asked for an answer now, not for silence."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


def cancelled_here() -> bool:
    """Whether a CancelledError is this task's own cancellation, to pass on, not a handler's mistake.

    A handler that awaits a future something else cancelled raises
    CancelledError without its task being cancelled: that is its failure,
    answered like any other, or the call would get no answer at all.
    """
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def as_json(answer: JSON) -> Reply:
    """A review's answer as the 200 that carries it."""
    return Reply(200, encode(answer))


async def in_context(review: AdmissionRequest, call: Awaitable[JSON | None]) -> JSON | None:
    """Run ``call`` as if reconciling ``review``'s object: ``mgr.client`` addresses its cluster."""
    token = enter_reconcile("webhook", Request(review.cluster, review.namespace, review.name))
    try:
        return await call
    finally:
        leave_reconcile(token)


async def now(reply: Reply) -> Reply:
    """An answer known at once, as the awaitable that routing hands out."""
    return reply


def not_served(call: Call) -> Reply:
    """The answer for a path no webhook is registered at (the path cut to 200 characters)."""
    shown = call.path if len(call.path) <= 200 else call.path[:200] + "..."
    return Reply.text(404, f"no webhook is served at {shown!r}")


def lane_timeout(what: str, cluster: str, width: int, limit: float, began: float, ran: float | None) -> str:
    """Why a call ran out of time: its handler, or the wait for its cluster's lane (all of it, or part).

    A call's time limit covers the wait for a place in its cluster's lane, so
    a flood from one cluster times out calls whose handler is fast, or never ran.
    """
    where = f"the lane of cluster {cluster or '(local)'!r}"
    if ran is None:
        return (
            f"the {what} never ran: {where} was full ({width} calls at once) for all of the {limit}s "
            "this call had"
        )
    waited = ran - began
    if waited >= 0.1 * limit:  # a wait worth naming: it took the handler's time
        return (
            f"the {what} did not answer within {limit}s, {waited:.1f}s of them spent waiting "
            f"for {where} ({width} calls at once)"
        )
    return f"the {what} did not answer within {limit}s"
