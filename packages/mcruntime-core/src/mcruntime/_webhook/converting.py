"""Answering a ConversionReview: each object through the hub, every failure named and logged once.

An API server converts every object it reads in a version other than the
storage one, and it retries without end: one stored object a function cannot
convert is asked for again ten times a second (the watch cache of that version
re-listing), so its traceback is logged once per object and kind of error and
the repeats go to DEBUG. A plain conversion function runs in a thread, since a
blocking call on the loop would stall every cluster's webhooks and no timeout
could answer; a thread cannot be stopped, so each cluster may hold only as
many as its lane, and a hung one is reported, not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .calling import as_json, cancelled_here, resume
from .exchange import Reply
from .handlers import Conversion, ConversionFailed
from .review import JSON, ConversionRequest, conversion_response, object_names

log = logging.getLogger("mcruntime.webhook")

_REMEMBERED = 1024  # (object, error) pairs whose traceback was logged, the oldest forgotten first


class PlainThreads:
    """One cluster's threads for plain conversion functions, at most ``limit`` at once.

    A function that outlives its call (hung, or past the timeout) keeps its
    slot until it returns: a hang in one cluster cannot take every thread of
    the process, and the cluster's next calls wait for a slot within their own
    timeout. The threads are daemons, so a hung one does not hold up the exit.
    """

    def __init__(self, cluster: str, limit: int) -> None:
        self.cluster = cluster
        self.limit = limit
        self.busy = 0
        self._free = asyncio.Semaphore(limit)

    async def run(self, function: Callable[[JSON], Any], obj: JSON, what: str) -> Any:
        """``function(obj)`` in a thread; a cancelled wait leaves the thread running, and says so."""
        await self._free.acquire()
        self.busy += 1
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Any] = loop.create_future()
        finished = False

        def settle(value: Any, error: BaseException | None) -> None:
            nonlocal finished
            finished = True
            self.busy -= 1
            self._free.release()
            if outcome.done():  # the call gave up on it
                return
            if error is not None:
                outcome.set_exception(error)
            else:
                outcome.set_result(value)

        def work(context: contextvars.Context) -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = context.run(function, obj)
            except Exception as raised:
                error = raised
            except BaseException as raised:  # SystemExit in a thread: a failure of this call only
                error = RuntimeError(f"the function raised {type(raised).__name__}")
            with contextlib.suppress(RuntimeError):  # the loop closed while the function ran
                loop.call_soon_threadsafe(settle, value, error)

        thread = threading.Thread(
            target=work,
            args=(contextvars.copy_context(),),
            name=f"mcruntime-conversion-{self.cluster}",
            daemon=True,
        )
        thread.start()
        try:
            return await outcome
        except asyncio.CancelledError:
            if not finished:
                log.warning(
                    "cluster %r: %s was given up on, but its plain function still runs in a thread "
                    "(a thread cannot be stopped); %d of the cluster's %d threads for plain "
                    "conversion functions are busy",
                    self.cluster,
                    what,
                    self.busy,
                    self.limit,
                )
            raise


class Converting:
    """The conversion answers of one webhook server: its clusters' threads and what was logged."""

    def __init__(self, threads_per_cluster: int) -> None:
        self._threads_per_cluster = threads_per_cluster
        # Keyed by the cluster's lane, which lives as long as its engagement: a cluster
        # engaged again starts afresh, and one that left is forgotten with its lane.
        self._threads: weakref.WeakKeyDictionary[asyncio.Semaphore, PlainThreads] = (
            weakref.WeakKeyDictionary()
        )
        self._logged: OrderedDict[tuple[str, ...], None] = OrderedDict()

    def threads(self, name: str, lane: asyncio.Semaphore) -> PlainThreads:
        """``name``'s threads (made on its first plain function)."""
        found = self._threads.get(lane)
        if found is None:
            found = self._threads[lane] = PlainThreads(name, self._threads_per_cluster)
        return found

    def _first(self, key: tuple[str, ...]) -> bool:
        """Whether ``key`` is new (and remember it, forgetting the oldest past the bound)."""
        if key in self._logged:
            self._logged.move_to_end(key)
            return False
        self._logged[key] = None
        if len(self._logged) > _REMEMBERED:
            self._logged.popitem(last=False)
        return True

    async def answer(
        self,
        name: str,
        review: ConversionRequest,
        conversion: Conversion,
        lane: asyncio.Semaphore,
        *,
        limit: float,
        closing: Callable[[], bool],
    ) -> Reply:
        """The ConversionReview answering ``review``: every object converted, or what failed, named."""
        what = f"{conversion.kind}.{conversion.group}"
        direction = _direction(review)
        threads = self.threads(name, lane)
        converted: list[JSON] = []
        try:
            async with asyncio.timeout(limit), lane:
                for obj in review.objects:
                    converted.append(
                        await conversion.convert(obj, review.desired_api_version, run_plain=threads.run)
                    )
        except ConversionFailed as error:
            self._log_failure(name, review.objects[len(converted)], error)
            return as_json(conversion_response(review.uid, None, str(error)))
        except TimeoutError:
            message = (
                f"converting {len(review.objects)} {what} ({object_names(review.objects)}) {direction} "
                f"took over {limit}s"
            )
            if len(review.objects) > 1 and len(converted) < len(review.objects):
                message += f" (at {object_names([review.objects[len(converted)]])})"
            if threads.busy >= threads.limit:
                message += (
                    f" (all {threads.limit} threads for this cluster's plain conversion functions are busy:"
                    " a function hangs)"
                )
            log.error("cluster %r: %s", name, message)
            return as_json(conversion_response(review.uid, None, message))
        except asyncio.CancelledError as error:
            if cancelled_here():
                if not closing():
                    raise
                resume()
                message = (
                    f"converting {what} ({object_names(review.objects)}) {direction} was cut short: "
                    "the webhook server is shutting down"
                )
                log.warning("cluster %r: %s", name, message)
                return as_json(conversion_response(review.uid, None, message))
            message = f"converting {what} {direction} failed: CancelledError"
            log.error("cluster %r: %s", name, message, exc_info=error)
            return as_json(conversion_response(review.uid, None, message))
        try:
            return as_json(conversion_response(review.uid, converted))
        except TypeError as error:  # a value that is not JSON, or nesting too deep (orjson: 254)
            message = f"converting {what} {direction} gave {_culprit(converted)}: {error}"
            log.error("cluster %r: %s", name, message)
            return as_json(conversion_response(review.uid, None, message))

    def _log_failure(self, name: str, obj: JSON, error: ConversionFailed) -> None:
        """Log a failed object once per kind of error; the API server's retries of it at DEBUG."""
        cause = error.__cause__
        raised = cause is not None and not isinstance(cause, ConversionFailed)
        kind = type(cause).__name__ if raised else str(error)
        first = self._first((name, _identity(obj), kind))
        if raised:
            # A function that raised: its traceback in the log, only its type in the answer.
            level = logging.ERROR if first else logging.DEBUG
            log.log(level, "cluster %r: %s", name, error, exc_info=cause if first else None)
        else:  # a refusal: its message is for the client
            log.log(logging.WARNING if first else logging.DEBUG, "cluster %r: %s", name, error)


def _direction(review: ConversionRequest) -> str:
    """``from <apiVersion> to <apiVersion>``, for a message naming what was being done."""
    sources = sorted({str(obj.get("apiVersion")) for obj in review.objects})
    return f"from {', '.join(sources) or '(no objects)'} to {review.desired_api_version}"


def _identity(obj: JSON) -> str:
    """The object as the API server keeps asking for it: its uid, or its namespace and name."""
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    uid = metadata.get("uid")
    if isinstance(uid, str) and uid:
        return uid
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def _culprit(converted: list[JSON]) -> str:
    """Which converted object cannot be encoded as JSON (looked for only once the whole failed)."""
    for index, obj in enumerate(converted):
        try:
            as_json(obj)
        except TypeError:
            return f"object {index} ({object_names([obj])}) that cannot be encoded as JSON"
    return "objects that cannot be encoded as JSON"
