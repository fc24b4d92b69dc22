"""secret-mirror: a multi-cluster-aware controller that mirrors Secrets from a reference cluster.

The "official example" the seed article starts from (controller-runtime's
design note on moving cluster-specific code out of the manager): Secrets of a
reference cluster are copied into a mirror cluster, and the controller watches
both, so a copy that is changed or deleted in the mirror is put back. The
article's complaint was that the reconciler could not tell which cluster an
event came from; here the mirror's events are mapped, explicitly, to the
reference Secret they copy, and the reconciler always reads the reference and
writes the mirror.

Only Secrets labelled ``examples.mcruntime.dev/mirror=true`` are mirrored
(mirroring every Secret, service-account tokens included, is rarely what anyone
wants). Copies carry ``examples.mcruntime.dev/mirrored-from`` and are deleted
when their reference goes. Secret values are never logged.

    python examples/secret-mirror/secret_mirror.py --reference ref.kubeconfig --mirror mirror.kubeconfig
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mcruntime as mcr

SECRET = mcr.Kind("v1", "Secret")
MIRROR_LABEL = "examples.mcruntime.dev/mirror"
MIRRORED_FROM = "examples.mcruntime.dev/mirrored-from"
MIRROR = "mirror"
"""The mirror cluster's name in the manager; the reference cluster is the local one."""
FIELD_MANAGER = "secret-mirror"

log = logging.getLogger("secret_mirror")


def copy_of(reference: dict[str, Any]) -> dict[str, Any]:
    """The mirror's copy: same name, namespace, type and data; labelled as a copy."""
    metadata = reference["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": {MIRRORED_FROM: "reference"},
        },
        "type": reference.get("type", "Opaque"),
        "data": reference.get("data") or {},
    }


def reference_of(_cluster: str, mirrored: dict[str, Any]) -> list[mcr.Request]:
    """A copy's event in the mirror asks to reconcile the reference Secret of the same name."""
    metadata = mirrored.get("metadata") or {}
    if MIRRORED_FROM not in (metadata.get("labels") or {}):
        return []
    return [mcr.Request(mcr.LOCAL_CLUSTER, metadata.get("namespace", ""), metadata.get("name", ""))]


class SecretMirror:
    """Reads Secrets in the reference (local) cluster, writes copies in the mirror cluster."""

    def __init__(self, manager: mcr.Manager) -> None:
        self.manager = manager

    def setup(self, namespace: str | None = None) -> mcr.Controller:
        """Wire the controller: reference Secrets and their copies in the mirror both trigger it."""
        return (
            mcr.controller_managed_by(self.manager)
            .named("secret-mirror")
            # Watch Secrets in the reference cluster...
            .for_(SECRET, clusters=mcr.LOCAL_ONLY, namespace=namespace, label_selector=f"{MIRROR_LABEL}=true")
            # ...and their copies in the mirror cluster.
            .watches(
                SECRET,
                mcr.enqueue_mapped(reference_of),
                clusters=mcr.PROVIDER_ONLY,
                namespace=namespace,
                label_selector=MIRRORED_FROM,
            )
            .complete(self)
        )

    async def reconcile(self, request: mcr.Request) -> None:
        """Make the mirror's copy match the reference Secret, or delete it if the reference is gone."""
        reference_cluster = await self.manager.get_cluster(mcr.LOCAL_CLUSTER)
        mirror = await self.manager.get_cluster(MIRROR)
        reference = await reference_cluster.cache.get_or_none(
            SECRET, request.name, namespace=request.namespace
        )
        current = await mirror.cache.get_or_none(SECRET, request.name, namespace=request.namespace)
        wanted_labels = ((reference or {}).get("metadata") or {}).get("labels") or {}
        if reference is None or wanted_labels.get(MIRROR_LABEL) != "true":
            if current is not None and MIRRORED_FROM in (current["metadata"].get("labels") or {}):
                with contextlib.suppress(mcr.NotFound):
                    await mirror.client.delete(SECRET, request.name, namespace=request.namespace)
                log.info(
                    "deleted the copy of Secret %s/%s: its reference is gone", request.namespace, request.name
                )
            return
        wanted = copy_of(reference)
        if current is None:
            try:
                await mirror.client.create(wanted, field_manager=FIELD_MANAGER)
            except mcr.NotFound:  # its namespace does not exist in the mirror yet
                with contextlib.suppress(mcr.AlreadyExists):
                    await mirror.client.create(
                        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": request.namespace}},
                        field_manager=FIELD_MANAGER,
                    )
                await mirror.client.create(wanted, field_manager=FIELD_MANAGER)
            log.info("mirrored Secret %s/%s", request.namespace, request.name)
            return
        if MIRRORED_FROM not in (current["metadata"].get("labels") or {}):
            # A Secret of the mirror's own, not a copy: never overwrite it.
            log.warning(
                "Secret %s/%s exists in the mirror and is not a copy; left alone",
                request.namespace,
                request.name,
            )
            return
        if current.get("data") != wanted["data"] or current.get("type") != wanted["type"]:
            current["data"], current["type"] = wanted["data"], wanted["type"]
            await mirror.client.update(current, field_manager=FIELD_MANAGER)
            log.info("updated the copy of Secret %s/%s", request.namespace, request.name)


def build(
    reference: mcr.ClusterConfig, mirror: mcr.ClusterConfig, *, namespace: str | None = None
) -> mcr.Manager:
    """The reference cluster is the manager's own; the mirror is its one provider cluster."""
    manager = mcr.Manager(mcr.SingleProvider(MIRROR, mirror), local=reference)
    SecretMirror(manager).setup(namespace)
    return manager


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: the two clusters and, optionally, one namespace."""
    parser = argparse.ArgumentParser(
        prog="secret_mirror.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", required=True, help="kubeconfig of the reference cluster")
    parser.add_argument("--reference-context", help="its context (default: the current one)")
    parser.add_argument("--mirror", required=True, help="kubeconfig of the mirror cluster")
    parser.add_argument("--mirror-context", help="its context (default: the current one)")
    parser.add_argument("--namespace", help="only Secrets of this namespace (default: all)")
    return parser.parse_args(argv)


def configs(arguments: argparse.Namespace) -> tuple[mcr.ClusterConfig, mcr.ClusterConfig]:
    """The reference and mirror clusters' configs, from their kubeconfigs and contexts."""
    reference = mcr.load_kubeconfig(
        Path(arguments.reference).expanduser(), context=arguments.reference_context
    )
    mirror = mcr.load_kubeconfig(Path(arguments.mirror).expanduser(), context=arguments.mirror_context)
    return reference, mirror


async def run(arguments: argparse.Namespace) -> None:
    """Run until SIGINT or SIGTERM."""
    reference, mirror = configs(arguments)
    await build(reference, mirror, namespace=arguments.namespace).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    arguments = parse_arguments(argv)
    mcr.configure_logging("INFO")
    try:
        asyncio.run(run(arguments))
    except mcr.MCRuntimeError as error:
        print(f"secret-mirror: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
