"""The last value that worked, per source: a broken new version never takes a working cluster down.

Every provider that reads configs from things it does not control (Secrets,
Cluster objects, registrations, a CLI's output) has the same rule: a version
that cannot be used is reported, logged once, and the cluster keeps running on
the last version that worked; only the source's removal lets the cluster go.
:class:`LastGood` keeps that rule for any value (a config, a config and the
name it goes by, an access read from a profile); :class:`LastGoodConfigs` adds
the report it implies for the common case of one config per source.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from .._config.kubeconfig import ClusterConfig
from .status import SourceStatus

log = logging.getLogger("mcruntime.provider")

T = TypeVar("T")


class LastGood(Generic[T]):
    """Per source key, the last usable value: kept through broken versions, dropped with the source.

    Call :meth:`keep` with what each version gives (``None`` when it gives
    nothing usable) and use what it returns; call :meth:`retain` with the
    live keys on each pass (or :meth:`forget` one key), so a removed source's
    value is forgotten and never resurrected by a later version.
    """

    def __init__(self) -> None:
        self._good: dict[str, T] = {}

    def keep(self, key: str, value: T | None) -> T | None:
        """Record ``value`` as ``key``'s last good one unless it is ``None``; return the one to use."""
        if value is not None:
            self._good[key] = value
            return value
        return self._good.get(key)

    def get(self, key: str) -> T | None:
        """The last good value of ``key``, or ``None`` if it never had one (or its source went)."""
        return self._good.get(key)

    def forget(self, key: str) -> None:
        """Drop ``key``'s value: its source is gone (a no-op if it had none)."""
        self._good.pop(key, None)

    def retain(self, live: Iterable[str]) -> None:
        """Forget every key not in ``live``: its source is gone, and so is its cluster."""
        keep = set(live)
        for key in [key for key in self._good if key not in keep]:
            del self._good[key]

    def keeping(self, key: str, what: str = "config") -> str:
        """How a log line ends for a broken version of ``key``: whether a last good ``what`` serves on."""
        return f"keeping its last good {what}" if key in self._good else "not engaged"

    def __contains__(self, key: object) -> bool:
        return key in self._good

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._good))

    def __len__(self) -> int:
        return len(self._good)


class LastGoodConfigs(LastGood[ClusterConfig]):
    """Per source key: the config last usable, and the :class:`SourceStatus` that says so.

    ``owner`` names the provider in log lines. Call :meth:`judge` for every
    live source on each pass, then :meth:`retain` with the live keys, so a
    removed source's config is forgotten and never resurrected.
    """

    def __init__(self, owner: str, logger: logging.Logger | None = None) -> None:
        super().__init__()
        self.owner = owner
        self._log = logger or log

    def judge(
        self,
        kind: str,
        key: str,
        config: ClusterConfig | None,
        error: str | None,
        *,
        previous: SourceStatus | None,
        version: str | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> tuple[ClusterConfig | None, SourceStatus]:
        """The config to engage for ``key`` (this version's, else the last good one) and its source.

        ``config`` is what this version gives (``None`` if it gives nothing
        usable, with ``error`` saying why, or ``None`` too while it waits);
        ``previous`` is the source as last reported, so a new error is logged
        once, not on every pass. The source names the cluster ``key``.
        """
        if config is None and error is not None and (previous is None or previous.error != error):
            self._log.warning("%s: %s %s: %s (%s)", self.owner, kind, key, error, self.keeping(key))
        chosen = self.keep(key, config)
        source = SourceStatus(
            kind,
            key,
            cluster=key,
            engaged=chosen is not None,
            version=version,
            error=error,
            stale=config is None and chosen is not None,
            detail=detail or {},
        )
        return chosen, source
