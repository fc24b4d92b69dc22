"""A manager engaged with clusters whose kubeconfigs carry inline client keys, for SIGKILL tests.

Usage: python key_holder_process.py KUBECONFIG_JSON...
Engages one cluster per kubeconfig (each with an inline client key), lists
ConfigMaps through each, asks each for a kubernetes-asyncio Configuration (the
key's path must exist for that), prints "ready" and runs until killed.
"""

from __future__ import annotations

import asyncio
import json
import sys

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def _nothing(_request: mcr.Request) -> None:
    return None


async def main(documents: list[str]) -> None:
    configs = {
        f"c{index}": mcr.kubeconfig_from_dict(json.loads(text)) for index, text in enumerate(documents)
    }
    provider = mcr.StaticProvider(configs)
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("holder").for_(CONFIGMAP).complete(_nothing)
    task = asyncio.create_task(manager.start())
    await manager.wait_started()
    for name in configs:
        cluster = await provider.clusters.wait_engaged(name)
        await cluster.client.list(CONFIGMAP, namespace="default")
        configuration = await cluster.kubernetes_configuration()
        print(f"key {configuration.key_file}", flush=True)
    print("ready", flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
