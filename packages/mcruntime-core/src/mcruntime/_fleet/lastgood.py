"""The last config that worked, per source: a broken new version never takes a working cluster down.

Every provider that reads configs from objects it does not control (Secrets,
Cluster objects, registrations) has the same rule: a version that cannot be
used is reported, logged once, and the cluster keeps running on the last
version that worked; only the source's removal lets the cluster go. This
keeps that rule, and the report it implies, in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from .._config.kubeconfig import ClusterConfig
from .status import SourceStatus

log = logging.getLogger("mcruntime.provider")


class LastGoodConfigs:
    """Per source key: the config last usable, and the :class:`SourceStatus` that says so.

    ``owner`` names the provider in log lines. Call :meth:`judge` for every
    live source on each pass, then :meth:`retain` with the live keys, so a
    removed source's config is forgotten and never resurrected.
    """

    def __init__(self, owner: str, logger: logging.Logger | None = None) -> None:
        self.owner = owner
        self._log = logger or log
        self._good: dict[str, ClusterConfig] = {}

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
        if config is not None:
            self._good[key] = config
        elif error is not None and (previous is None or previous.error != error):
            keeping = "keeping its last good config" if key in self._good else "not engaged"
            self._log.warning("%s: %s %s: %s (%s)", self.owner, kind, key, error, keeping)
        chosen = config or self._good.get(key)
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

    def retain(self, live: Iterable[str]) -> None:
        """Forget every key not in ``live``: its source is gone, and so is its cluster."""
        keep = set(live)
        for key in [key for key in self._good if key not in keep]:
            del self._good[key]

    def __contains__(self, key: object) -> bool:
        return key in self._good
