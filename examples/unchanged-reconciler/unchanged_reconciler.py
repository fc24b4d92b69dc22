"""unchanged-reconciler: a reconciler written for one cluster runs unchanged across a fleet.

multi-cluster-cr's promise ("if the reconciler is written for controller-runtime
before, you don't need to change any code"), kept: ``ChecksumReconciler`` below
knows nothing about clusters. It uses "the client" (``manager.client``), which
inside a reconcile reads from the cache of the request's cluster and writes to
that cluster's API server. What it does is ordinary single-cluster work: every
ConfigMap labelled ``examples.mcruntime.dev/checksum=true`` gets an annotation
with the SHA-256 of its data, kept current as the data changes.

The same class runs two ways, chosen on the command line only:

    python examples/unchanged-reconciler/unchanged_reconciler.py --single          # $KUBECONFIG's cluster
    python examples/unchanged-reconciler/unchanged_reconciler.py ./fleet/ a.kubeconfig  # every cluster there
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import mcruntime as mcr
from mcruntime_file import KubeconfigFileProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
ENABLED_LABEL = "examples.mcruntime.dev/checksum"
CHECKSUM_ANNOTATION = "examples.mcruntime.dev/data-sha256"

log = logging.getLogger("unchanged_reconciler")


def checksum(configmap: dict[str, Any]) -> str:
    """SHA-256 of the ConfigMap's data and binaryData, independent of key order."""
    content = {"data": configmap.get("data") or {}, "binaryData": configmap.get("binaryData") or {}}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


# --- the single-cluster reconciler: no cluster anywhere below ------------------------------------


class ChecksumReconciler:
    """Annotates labelled ConfigMaps with the checksum of their data.

    Written as for one cluster: ``client`` is the only way it touches Kubernetes.
    """

    def __init__(self, client: mcr.RoutedClient) -> None:
        self.client = client

    async def reconcile(self, request: mcr.Request) -> None:
        """Annotate the ConfigMap with its data's checksum, if it does not carry it yet."""
        try:
            configmap = await self.client.get(CONFIGMAP, request.name, namespace=request.namespace)
        except mcr.NotFound:
            return
        wanted = checksum(configmap)
        annotations = configmap["metadata"].setdefault("annotations", {})
        if annotations.get(CHECKSUM_ANNOTATION) == wanted:
            return
        annotations[CHECKSUM_ANNOTATION] = wanted
        await self.client.update(configmap, field_manager="checksum")
        log.info("annotated ConfigMap %s/%s with its checksum", request.namespace, request.name)

    def setup(self, manager: mcr.Manager, namespace: str | None = None) -> mcr.Controller:
        """Register the controller with ``manager``: labelled ConfigMaps, optionally in one namespace."""
        return (
            mcr.controller_managed_by(manager)
            .named("checksum")
            .for_(CONFIGMAP, namespace=namespace, label_selector=f"{ENABLED_LABEL}=true")
            .complete(self)
        )


# --- the only multi-cluster part: which manager it runs in ----------------------------------------


def build(
    *,
    single: mcr.ClusterConfig | None = None,
    provider: mcr.Provider | None = None,
    namespace: str | None = None,
) -> mcr.Manager:
    """One cluster (``single``) or a fleet (``provider``): the reconciler is the same object either way."""
    manager = mcr.Manager(provider, local=single)
    ChecksumReconciler(manager.client).setup(manager, namespace)
    return manager


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: a fleet of kubeconfig paths, or ``--single``."""
    parser = argparse.ArgumentParser(
        prog="unchanged_reconciler.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="kubeconfig files or directories of the fleet"
    )
    parser.add_argument(
        "--single", action="store_true", help="run against one cluster: $KUBECONFIG's current context"
    )
    parser.add_argument("--namespace", help="only ConfigMaps of this namespace (default: all)")
    return parser.parse_args(argv)


def manager_for(arguments: argparse.Namespace) -> mcr.Manager:
    """The manager the command line asks for; the reconciler inside is the same either way."""
    if arguments.single:
        return build(single=mcr.load_kubeconfig_env(), namespace=arguments.namespace)
    provider = KubeconfigFileProvider(arguments.paths or None, naming="context")
    return build(provider=provider, namespace=arguments.namespace)


async def run(arguments: argparse.Namespace) -> None:
    """Run until SIGINT or SIGTERM."""
    await manager_for(arguments).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    arguments = parse_arguments(argv)
    mcr.configure_logging("INFO")
    try:
        asyncio.run(run(arguments))
    except mcr.MCRuntimeError as error:
        print(f"unchanged-reconciler: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
