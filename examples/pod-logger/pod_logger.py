"""pod-logger: watch Pods in two named clusters and log each one's cluster, namespace and name.

The "hello world" of admiralty's multicluster-controller: clusters are the
contexts of a kubeconfig, named after them, and on every Pod event the
reconciler logs ``cluster / namespace / name``. Only the standard output is
controlled, but the scaffold is all there: named clusters, one controller
watching the same kind in each, and requests that say which cluster they are
about.

    python examples/pod-logger/pod_logger.py --contexts cluster1,cluster2
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import mcruntime as mcr

POD = mcr.Kind("v1", "Pod")

log = logging.getLogger("pod_logger")


def clusters_from_contexts(
    contexts: Sequence[str], kubeconfig: str | None = None
) -> dict[str, mcr.ClusterConfig]:
    """One cluster per context, named after it, from ``kubeconfig`` or ``$KUBECONFIG``."""
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        return {context: mcr.load_kubeconfig(path, context=context) for context in contexts}
    return {context: mcr.load_kubeconfig_env(context=context) for context in contexts}


def build(clusters: dict[str, mcr.ClusterConfig], *, handle_signals: bool = True) -> mcr.Manager:
    """A manager over exactly these clusters, with the Pod-logging controller."""
    manager = mcr.Manager(mcr.StaticProvider(clusters), handle_signals=handle_signals)

    async def reconcile(request: mcr.Request) -> None:
        # admiralty's reconciler reads nothing: every event is reported, deletions too.
        log.info("%s / %s / %s", request.cluster, request.namespace, request.name)

    mcr.controller_managed_by(manager).named("pod-logger").for_(POD).complete(reconcile)
    return manager


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: which contexts, from which kubeconfig."""
    parser = argparse.ArgumentParser(
        prog="pod_logger.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--contexts",
        default="cluster1,cluster2",
        help="comma-separated kubeconfig contexts, one cluster each (default: cluster1,cluster2)",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig file holding the contexts (default: $KUBECONFIG)")
    return parser.parse_args(argv)


async def run(arguments: argparse.Namespace) -> None:
    """Run until SIGINT or SIGTERM."""
    contexts = [context.strip() for context in arguments.contexts.split(",") if context.strip()]
    await build(clusters_from_contexts(contexts, arguments.kubeconfig)).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    arguments = parse_arguments(argv)
    mcr.configure_logging("INFO")
    try:
        asyncio.run(run(arguments))
    except mcr.MCRuntimeError as error:
        print(f"pod-logger: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
