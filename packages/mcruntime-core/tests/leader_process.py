"""A manager with leader election in a process of its own, for crash tests.

Usage: python leader_process.py KUBECONFIG NAMESPACE LEASE IDENTITY
It reconciles ConfigMaps in NAMESPACE, stamping its identity on each, and runs
until killed. The same manager runs in-process in the leader election tests.
"""

from __future__ import annotations

import asyncio
import sys

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


def stamping_manager(
    config: mcr.ClusterConfig,
    namespace: str,
    lease: str,
    identity: str,
    *,
    handle_signals: bool = True,
    lease_duration: float = 4,
) -> mcr.Manager:
    """A leader-elected manager that stamps its identity on each ConfigMap it reconciles."""
    election = mcr.LeaderElectionConfig(
        name=lease,
        namespace=namespace,
        identity=identity,
        lease_duration=lease_duration,
        renew_deadline=3,
        retry_period=0.5,
    )
    manager = mcr.Manager(local=config, leader_election=election, handle_signals=handle_signals)

    async def stamp(request: mcr.Request) -> None:
        await manager.client.patch(
            CONFIGMAP,
            request.name,
            {"metadata": {"annotations": {"reconciled-by": identity}}},
            namespace=namespace,
        )

    mcr.controller_managed_by(manager).for_(CONFIGMAP, namespace=namespace).complete(stamp)
    return manager


async def main(kubeconfig: str, namespace: str, lease: str, identity: str) -> None:
    await stamping_manager(mcr.load_kubeconfig(kubeconfig), namespace, lease, identity).start()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
