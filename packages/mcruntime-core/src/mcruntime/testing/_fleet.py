"""A fleet: one etcd and any number of control planes that come and go.

Starting a cluster costs one kube-apiserver process (a few seconds); clusters
are started one after another because startup is CPU-bound and our machines have
two cores.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from ._assets import Assets, Progress, ensure_assets
from ._controlplane import START_TIMEOUT, ControlPlane
from ._errors import TestbedError
from ._etcd import Etcd
from ._process import ManagedProcess


class Fleet:
    """Local control planes sharing one etcd; usable as a (sync) context manager.

    >>> with Fleet() as fleet:                         # doctest: +SKIP
    ...     fleet.start(["east", "west"])
    ...     fleet["east"].kubeconfig_path()
    """

    def __init__(
        self,
        *,
        assets: Assets | None = None,
        workdir: Path | None = None,
        progress: Progress | None = None,
        etcd: Etcd | None = None,
    ) -> None:
        """``etcd`` shares another fleet's etcd (this fleet then never stops it)."""
        self._assets = assets
        self._progress = progress
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="mcruntime-testbed-"))
        self._etcd = etcd
        self._own_etcd = etcd is None
        self._clusters: dict[str, ControlPlane] = {}
        self._counter = 0
        self.start_seconds: dict[str, float] = {}

    def __enter__(self) -> Fleet:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def assets(self) -> Assets:
        if self._assets is None:
            self._assets = ensure_assets(self._progress)
        return self._assets

    @property
    def etcd(self) -> Etcd:
        """The shared etcd, started on first use."""
        if self._etcd is None:
            etcd = Etcd(self.assets.etcd, self.workdir)
            started = time.monotonic()
            etcd.start()
            self.start_seconds["etcd"] = time.monotonic() - started
            self._etcd = etcd
        return self._etcd

    def start(self, clusters: int | Iterable[str] = 3) -> list[ControlPlane]:
        """Start clusters: a count (named cluster-1, cluster-2, ...) or explicit names."""
        if isinstance(clusters, int):
            return [self.add() for _ in range(clusters)]
        return [self.add(name) for name in clusters]

    def new_name(self, prefix: str = "cluster") -> str:
        """A name no cluster of this fleet has used."""
        while True:
            self._counter += 1
            candidate = f"{prefix}-{self._counter}"
            if candidate not in self._clusters and not (self.workdir / candidate).exists():
                return candidate

    def add(
        self, name: str | None = None, timeout: float = START_TIMEOUT, extra_args: tuple[str, ...] = ()
    ) -> ControlPlane:
        """Start one more cluster and wait until it serves requests.

        ``extra_args`` are passed to its kube-apiserver, e.g. ``("--watch-cache=false",)``
        so that watches read etcd directly and :meth:`compact` makes old
        resourceVersions expire (410 Gone) on demand.
        """
        name = name or self.new_name()
        if name in self._clusters:
            raise TestbedError(f"the fleet already has a cluster named {name!r}")
        plane = ControlPlane(
            name,
            etcd=self.etcd,
            binary=self.assets.kube_apiserver,
            directory=self.workdir / name,
            extra_args=extra_args,
        )
        started = time.monotonic()
        plane.start(timeout)
        self.start_seconds[name] = time.monotonic() - started
        self._clusters[name] = plane
        return plane

    def compact(self) -> int:
        """Compact etcd up to its current revision; returns that revision.

        Every resourceVersion before it is gone for watches served from etcd.
        """
        return self.etcd.compact()

    def remove(self, name: str) -> None:
        """Stop a cluster and delete its data."""
        plane = self._clusters.pop(name)
        plane.remove()

    def __getitem__(self, name: str) -> ControlPlane:
        try:
            return self._clusters[name]
        except KeyError:
            raise KeyError(f"no cluster {name!r} in the fleet; it has {sorted(self._clusters)}") from None

    def __iter__(self) -> Iterator[ControlPlane]:
        return iter(list(self._clusters.values()))

    def __len__(self) -> int:
        return len(self._clusters)

    @property
    def names(self) -> list[str]:
        return list(self._clusters)

    def processes(self) -> list[ManagedProcess]:
        """Every process this fleet started that it still tracks."""
        found = [p for plane in self._clusters.values() for p in plane.processes()]
        if self._own_etcd and self._etcd is not None and self._etcd.process is not None:
            found.append(self._etcd.process)
        return found

    def stop(self) -> None:
        """Stop every cluster, then etcd; remove the working directory if we made it."""
        for plane in list(self._clusters.values()):
            plane.stop()
        self._clusters.clear()
        if self._own_etcd and self._etcd is not None:
            self._etcd.stop()
            self._etcd = None
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
