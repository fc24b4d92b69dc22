"""configmap-logger: one uniform reconciler logs every ConfigMap of every cluster, with its cluster.

The code sample of the multicluster-runtime README, in Python: the same
reconciler runs against every cluster a provider engages, and reads from and
acts on the cluster the request names. The clusters come from kubeconfig files
or directories, watched while the program runs: write a kubeconfig into a
watched directory and its cluster is reconciled within a second; delete it and
the cluster is let go.

    python examples/configmap-logger/configmap_logger.py ./fleet/ ~/.kube/config
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

import mcruntime as mcr
from mcruntime_file import KubeconfigFileProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")

log = logging.getLogger("configmap_logger")


def build(
    provider: mcr.Provider, *, namespace: str | None = None, handle_signals: bool = True
) -> mcr.Manager:
    """A manager whose one controller logs each ConfigMap it is asked about, in whichever cluster."""
    manager = mcr.Manager(provider, handle_signals=handle_signals)

    async def reconcile(request: mcr.Request) -> None:
        cluster = await manager.get_cluster(request.cluster)
        configmap = await cluster.cache.get_or_none(CONFIGMAP, request.name, namespace=request.namespace)
        if configmap is None:  # deleted since the event: nothing to report
            return
        log.info("ConfigMap %s/%s in cluster %r", request.namespace, request.name, request.cluster)

    mcr.controller_managed_by(manager).named("multicluster-configmaps").for_(
        CONFIGMAP, namespace=namespace
    ).complete(reconcile)
    return manager


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: which kubeconfigs, how clusters are named, which namespace."""
    parser = argparse.ArgumentParser(
        prog="configmap_logger.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="kubeconfig files or directories, each context a cluster (default: $KUBECONFIG, ~/.kube/config)",
    )
    parser.add_argument(
        "--naming",
        choices=["context", "file/context"],
        default="context",
        help="name clusters by context (default) or by file path and context",
    )
    parser.add_argument("--namespace", help="only ConfigMaps of this namespace (default: all)")
    return parser.parse_args(argv)


def provider_for(arguments: argparse.Namespace) -> KubeconfigFileProvider:
    """The file provider over the given paths (``KUBECONFIG`` or ``~/.kube/config`` when none)."""
    return KubeconfigFileProvider(arguments.paths or None, naming=arguments.naming)


async def run(arguments: argparse.Namespace) -> None:
    """Run until SIGINT or SIGTERM."""
    await build(provider_for(arguments), namespace=arguments.namespace).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    arguments = parse_arguments(argv)
    mcr.configure_logging("INFO")
    try:
        asyncio.run(run(arguments))
    except mcr.MCRuntimeError as error:
        print(f"configmap-logger: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
