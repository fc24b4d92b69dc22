"""The API server's ``Warning`` answers: said once per cluster, in the log.

A write the API server accepts may still come back with a warning: a field it
does not know (``unknown field "spec.sise"``, dropped from the stored object),
a deprecated API version, a value it will refuse in a later release. Ignored,
a typo in a spec field passes in silence; controller-runtime logs them too. Each
distinct text is logged once per cluster at WARNING (a reconcile that repeats
the mistake every time would otherwise repeat the line), later repeats at DEBUG.
Both the texts remembered and their length are bounded: the server is not
trusted to keep them small.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from .http1 import Headers

log = logging.getLogger("mcruntime.client")

MAX_REMEMBERED = 256
"""Distinct warning texts remembered per cluster; past it the memory starts afresh."""
MAX_SHOWN = 512
"""Characters of one warning's text shown in the log."""

_FORMAT = re.compile(r'^\s*\d{3}\s+\S+\s+"((?:[^"\\]|\\.)*)"')  # RFC 7234: code agent "text" [date]


def warning_texts(headers: Mapping[str, str]) -> list[str]:
    """The texts of an answer's ``Warning`` headers (none, most often)."""
    values = headers.values_of(b"warning") if isinstance(headers, Headers) else _joined(headers)
    texts = []
    for value in values:
        match = _FORMAT.match(value)
        text = re.sub(r"\\(.)", r"\1", match.group(1)) if match else value.strip()
        if text:
            texts.append(text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "...")
    return texts


def _joined(headers: Mapping[str, str]) -> list[str]:
    value = headers.get("Warning") or headers.get("warning")
    return [value] if value else []


class ServerWarnings:
    """The warnings one client's API server gave, each logged once."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def note(
        self,
        cluster: str,
        headers: Mapping[str, str],
        method: str,
        kind: str,
        namespace: str | None,
        name: str | None,
        body: object = None,
    ) -> None:
        """Log what an answer's ``headers`` warn about, naming the request it answered.

        ``body``: what was sent, for the name of an object created (a POST names none in its path).
        """
        texts = warning_texts(headers)
        if not texts:
            return
        if name is None and isinstance(body, dict) and isinstance(body.get("metadata"), dict):
            created = body["metadata"].get("name")
            name = created if isinstance(created, str) else None
        target = f"{namespace}/{name}" if namespace and name else name or namespace or ""
        request = f"{method} {kind} {target}".rstrip()
        for text in texts:
            if text in self._seen:
                log.debug("cluster %r: the API server warns again (%s): %s", cluster, request, text)
                continue
            if len(self._seen) >= MAX_REMEMBERED:
                self._seen.clear()
            self._seen.add(text)
            log.warning("cluster %r: the API server warns (%s): %s", cluster, request, text)
