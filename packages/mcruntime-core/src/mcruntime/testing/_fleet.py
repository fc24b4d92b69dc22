"""A fleet: one etcd and any number of control planes that come and go.

Starting a cluster costs one kube-apiserver process (a few seconds); clusters
are started one after another because startup is CPU-bound and our machines have
two cores. A cluster that runs workloads adds kube-controller-manager,
kube-scheduler and kwok (see ``_workloads``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from .._base.names import name_problem
from ._assets import Assets, Progress, WorkloadAssets, ensure_assets, ensure_workload_assets
from ._backend import Backend, Process, backend_named
from ._controlplane import ControlPlane
from ._errors import TestbedError
from ._etcd import Etcd
from ._leftovers import OWN_PREFIX, mark_owner, scrub, sweep_abandoned


class Fleet:
    """Local control planes sharing one etcd; usable as a (sync) context manager.

    >>> with Fleet() as fleet:                         # doctest: +SKIP
    ...     fleet.start(["east", "west"])
    ...     fleet["east"].kubeconfig_path()

    ``workloads=True`` gives every cluster real controllers, a scheduler and
    ``nodes`` kwok nodes, so Jobs run and garbage is collected; ``add`` can
    override it per cluster. ``backend`` runs the components as processes
    (``"process"``, the default) or containers (``"container"``); unset, the
    ``MCRUNTIME_TESTBED_BACKEND`` environment variable decides.
    """

    def __init__(
        self,
        *,
        assets: Assets | None = None,
        workdir: Path | str | None = None,
        progress: Progress | None = None,
        etcd: Etcd | None = None,
        workloads: bool = False,
        nodes: int = 1,
        backend: Backend | str | None = None,
    ) -> None:
        """``etcd`` shares another fleet's etcd (this fleet then never stops it), ``backend`` too."""
        self._assets = assets
        self._workload_assets: WorkloadAssets | None = None
        self.workloads = workloads
        self.nodes = nodes
        self._own_backend = backend is None or isinstance(backend, str)
        self.backend: Backend = (
            backend_named(backend) if backend is None or isinstance(backend, str) else backend
        )
        self._progress = progress
        workdir = Path(workdir) if workdir is not None else None
        if workdir is not None and workdir.exists() and not workdir.is_dir():
            raise TestbedError(f"Fleet(workdir={str(workdir)!r}): that path is a file, not a directory")
        self._own_workdir = workdir is None
        self.workdir: Path = workdir or Path(tempfile.mkdtemp(prefix=OWN_PREFIX))
        self._etcd = etcd
        self._own_etcd = etcd is None
        self._clusters: dict[str, ControlPlane] = {}
        self._plane_directories: list[Path] = []  # every one this fleet wrote keys to
        self._counter = 0
        self._stopped = False
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
    def workload_assets(self) -> WorkloadAssets:
        """kube-controller-manager, kube-scheduler and kwok, built on first use."""
        if self._workload_assets is None:
            self._workload_assets = ensure_workload_assets(self._progress)
        return self._workload_assets

    @property
    def etcd(self) -> Etcd:
        """The shared etcd, started on first use."""
        if self._etcd is None:
            self._refuse_if_stopped("start etcd")
            sweep_abandoned()
            mark_owner(self.workdir, plane=False)
            etcd = Etcd(self.assets.etcd, self.workdir, self.backend)
            started = time.monotonic()
            etcd.start()
            self.start_seconds["etcd"] = time.monotonic() - started
            self._etcd = etcd
        return self._etcd

    def start(self, clusters: int | Iterable[str] = 3) -> list[ControlPlane]:
        """Start clusters: a count (named cluster-1, cluster-2, ...) or explicit names."""
        if isinstance(clusters, str):  # a string is an iterable of one-letter names
            raise TestbedError(f"start() takes a count or a list of names, not the string {clusters!r}")
        if isinstance(clusters, int):
            if clusters < 0:
                raise TestbedError(f"start() needs a count of at least 0 clusters, not {clusters}")
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
        self,
        name: str | None = None,
        timeout: float | None = None,
        extra_args: tuple[str, ...] = (),
        *,
        workloads: bool | None = None,
    ) -> ControlPlane:
        """Start one more cluster and wait until it serves requests.

        ``extra_args`` are passed to its kube-apiserver, e.g. ``("--watch-cache=false",)``
        so that watches read etcd directly and :meth:`compact` makes old
        resourceVersions expire (410 Gone) on demand. ``workloads`` overrides
        the fleet's choice for this cluster; with workloads, the cluster is
        returned once its nodes are Ready.
        """
        self._refuse_if_stopped("add a cluster")
        name = name or self.new_name()
        if name in self._clusters:
            raise TestbedError(f"the fleet already has a cluster named {name!r}")
        problem = name_problem(name, subdomain=False)  # it names a directory, a context, a user
        if problem is not None:
            raise TestbedError(f"cluster name {name!r} {problem}")
        run_workloads = self.workloads if workloads is None else workloads
        workload_assets = self.workload_assets if run_workloads else None
        etcd = self.etcd
        directory = self.workdir / name
        mark_owner(directory, plane=True)  # before the keys: a kill from here on is swept
        self._plane_directories.append(directory)
        plane = ControlPlane(
            name,
            etcd=etcd,
            binary=self.assets.kube_apiserver,
            directory=directory,
            extra_args=extra_args,
            backend=self.backend,
        )
        started = time.monotonic()
        try:  # a start cut short (Ctrl-C, a failed workload) leaves no process behind
            plane.start(timeout)
            if workload_assets is not None:
                plane.run_workloads(workload_assets, nodes=self.nodes, timeout=timeout)
        except BaseException:
            plane.remove()
            raise
        self.start_seconds[name] = time.monotonic() - started
        self._clusters[name] = plane
        return plane

    async def add_async(
        self,
        name: str | None = None,
        timeout: float | None = None,
        extra_args: tuple[str, ...] = (),
        *,
        workloads: bool | None = None,
    ) -> ControlPlane:
        """:meth:`add` without blocking the event loop (it takes seconds): for a test whose manager runs.

        The processes are started from a thread; the kernel still kills them
        with this process, since the testbed's processes die with their parent
        process, not with the thread that started them.
        """
        return await asyncio.to_thread(self.add, name, timeout, extra_args, workloads=workloads)

    def _refuse_if_stopped(self, what: str) -> None:
        # A stopped fleet's etcd and directory are gone: starting anew would leave
        # processes and keys that no stop will ever clean up.
        if self._stopped:
            raise TestbedError(f"cannot {what}: this fleet was stopped; make a new Fleet")

    def compact(self) -> int:
        """Compact etcd up to its current revision; returns that revision.

        Every resourceVersion before it is gone for watches served from etcd.
        """
        return self.etcd.compact()

    def remove(self, name: str) -> None:
        """Stop a cluster and delete its data."""
        plane = self._clusters.pop(name, None)
        if plane is None:
            raise KeyError(f"no cluster {name!r} in the fleet; it has {sorted(self._clusters)}")
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

    def processes(self) -> list[Process]:
        """Every process this fleet started that it still tracks."""
        found = [p for plane in self._clusters.values() for p in plane.processes()]
        if self._own_etcd and self._etcd is not None and self._etcd.process is not None:
            found.append(self._etcd.process)
        return found

    def stop(self) -> None:
        """Stop every cluster, then etcd; remove the working directory if we made it.

        In a directory it was given, the fleet deletes the keys, token files,
        kubeconfigs and etcd data it wrote, and keeps the logs. A stopped fleet
        stays stopped: adding to it is a :class:`TestbedError`.
        """
        self._stopped = True
        for plane in list(self._clusters.values()):
            plane.stop()
        self._clusters.clear()
        if self._own_etcd and self._etcd is not None:
            self._etcd.stop()
            self._etcd = None
        if self._own_backend:
            self.backend.close()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            return
        for directory in self._plane_directories:
            scrub(directory, plane=True)
        self._plane_directories.clear()
        if self._own_etcd:
            scrub(self.workdir, plane=False)
