"""S13's mcruntime peer: a manager whose only work is one validating admission webhook for ConfigMaps.

The rule is the Go peer's (``mcr-go/webhook.go``): the label
``bench.mcruntime.dev/tier`` must be gold, silver or bronze. Unlike the Go peer,
this one registers its own ValidatingWebhookConfiguration (self-made CA, the
cluster's URL), as mcruntime does by default, limited to the benchmark's
namespace and to CREATE; it removes it when it stops. The harness waits until
the API server refuses an object without the label before it measures.

Run by benchmarks/run.py; ``--profile FILE`` writes cProfile statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
from pathlib import Path

from peerio import PeerIO, start_record

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
TIER_LABEL = "bench.mcruntime.dev/tier"
TIERS = frozenset({"gold", "silver", "bronze"})


async def validate(req: mcr.AdmissionRequest) -> None:
    """Admit a ConfigMap whose tier label names a known tier."""
    labels = ((req.object or {}).get("metadata") or {}).get("labels") or {}
    tier = labels.get(TIER_LABEL, "")
    if tier not in TIERS:
        raise mcr.Denied(f"label {TIER_LABEL} must be gold, silver or bronze, not {tier!r}")


async def serve(kubeconfig: Path, namespace: str, configuration: str) -> None:
    """Serve the webhook until stdin closes."""
    options = mcr.WebhookOptions(
        address="127.0.0.1:0", configuration_name=configuration, remove_on_disengage=True
    )
    provider = mcr.StaticProvider({"bench": mcr.load_kubeconfig(kubeconfig)})
    manager = mcr.Manager(provider, handle_signals=False, webhook=options)
    io = PeerIO(lambda: len(manager.clusters()))
    io.emit(start_record())
    mcr.webhook_managed_by(manager).for_(CONFIGMAP, resource="configmaps").with_validator(
        validate
    ).with_options(
        operations=["CREATE"],
        namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": namespace}},
    ).complete()
    runner = asyncio.create_task(manager.start())
    try:
        await io.run()
    finally:
        manager.stop()
        await runner


def main() -> None:
    """Parse the options and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True, help="the only namespace whose ConfigMaps are admitted")
    parser.add_argument("--configuration", required=True, help="ValidatingWebhookConfiguration name")
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.profile is None:
        asyncio.run(serve(args.kubeconfig, args.namespace, args.configuration))
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(serve(args.kubeconfig, args.namespace, args.configuration))
    finally:
        profiler.disable()
        profiler.dump_stats(str(args.profile))


if __name__ == "__main__":
    main()
