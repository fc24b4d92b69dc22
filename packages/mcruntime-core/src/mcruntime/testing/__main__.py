"""Command line of the testbed.

``python -m mcruntime.testing install``  find or build kube-apiserver and etcd
    ``--workloads``: kube-controller-manager, kube-scheduler and kwok too
``python -m mcruntime.testing fleet``    start local clusters and print their kubeconfigs
    ``--workloads``: clusters that run Pods; ``--backend container``: in containers
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from ._assets import ensure_assets, ensure_workload_assets
from ._backend import BACKENDS
from ._errors import TestbedError
from ._fleet import Fleet


def _install(arguments: argparse.Namespace) -> int:
    assets = ensure_assets()
    print(f"{'kube-apiserver:':<25}{assets.kube_apiserver}  ({assets.kube_apiserver_source})")
    print(f"{'etcd:':<25}{assets.etcd}  ({assets.etcd_source})")
    if arguments.workloads:
        workloads = ensure_workload_assets()
        paths = {
            "kube-controller-manager": workloads.kube_controller_manager,
            "kube-scheduler": workloads.kube_scheduler,
            "kwok": workloads.kwok,
        }
        for name, path in paths.items():
            print(f"{name + ':':<25}{path}  ({workloads.sources[name]})")
    if assets.kube_apiserver.parent == assets.etcd.parent:
        print(f"export KUBEBUILDER_ASSETS={assets.kube_apiserver.parent}")
    return 0


def _positive(text: str) -> int:
    """``--clusters``: a whole number of at least 1 (a fleet of none would only start etcd)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is fewer than 1")
    return value


def _fleet(arguments: argparse.Namespace) -> int:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    output = Path(arguments.kubeconfig_dir).resolve() if arguments.kubeconfig_dir else None
    with Fleet(workloads=arguments.workloads, backend=arguments.backend) as fleet:
        assets = fleet.assets
        print(f"binaries: {assets.kube_apiserver} and {assets.etcd}", flush=True)
        if arguments.workloads:
            extra = fleet.workload_assets
            names = f"{extra.kube_controller_manager}, {extra.kube_scheduler}, {extra.kwok}"
            print(f"workloads: {names}", flush=True)
        started = time.monotonic()
        for index in range(arguments.clusters):
            plane = fleet.add(f"cluster-{index + 1}")
            seconds = fleet.start_seconds[plane.name]
            print(f"  {plane.name}: {plane.server} ready in {seconds:.1f}s", flush=True)
        print(
            f"{len(fleet)} control planes ready in {time.monotonic() - started:.1f}s "
            f"(etcd {fleet.start_seconds['etcd']:.1f}s)"
        )
        for plane in fleet:
            path = plane.kubeconfig_path()
            if output is not None:
                output.mkdir(parents=True, exist_ok=True)
                target = output / f"{plane.name}.kubeconfig"
                target.write_bytes(path.read_bytes())
                target.chmod(0o600)
                path = target
            memory = f"apiserver RSS {plane.rss_bytes() / 2**20:.0f} MiB"
            if plane.workloads is not None:
                added = plane.workloads.rss_bytes() / 2**20
                memory += f", controllers + scheduler + kwok RSS {added:.0f} MiB"
            print(f"KUBECONFIG={path}  # {plane.name}, {memory}")
        if arguments.exit:
            return 0
        print("Running; press Ctrl-C to stop every control plane.", flush=True)
        stop.wait()
        print("Stopping ...", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = argparse.ArgumentParser(
        prog="python -m mcruntime.testing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="find or build kube-apiserver and etcd")
    install.add_argument(
        "--workloads", action="store_true", help="also kube-controller-manager, kube-scheduler and kwok"
    )
    install.set_defaults(run=_install)
    fleet = commands.add_parser("fleet", help="start local control planes and print their kubeconfig paths")
    fleet.add_argument("--clusters", type=_positive, default=3, help="how many, at least 1 (default 3)")
    fleet.add_argument("--kubeconfig-dir", help="also copy each cluster's admin kubeconfig here")
    fleet.add_argument("--exit", action="store_true", help="stop again once all are ready")
    fleet.add_argument(
        "--workloads", action="store_true", help="run controllers, a scheduler and kwok nodes in each"
    )
    fleet.add_argument(
        "--backend",
        choices=BACKENDS,
        help="processes or containers (default: $MCRUNTIME_TESTBED_BACKEND or process)",
    )
    fleet.set_defaults(run=_fleet)
    arguments = parser.parse_args(argv)
    try:
        return int(arguments.run(arguments))
    except TestbedError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
