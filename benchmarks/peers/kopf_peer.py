"""The kopf peer of the single-cluster scenario (S6): the same work as the others, in kopf.

kopf has no cache: its handlers receive the object from the watch stream. The
closest kopf equivalent of a reconcile that reads the object is therefore a
low-level ``@kopf.on.event`` handler (async, so no thread hop), which also skips kopf's per-object
progress annotations (``on.create``/``on.resume`` would patch every object and
be much slower): the comparison is with kopf at its cheapest. Peering, event
posting and most logging are off, as they would be in a benchmark-minded setup.

Run by benchmarks/run.py.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import kopf
import yaml
from peerio import PeerIO, start_record, written_at


async def serve(kubeconfig: Path, namespace: str) -> None:
    """Run a kopf operator on one cluster until stdin closes."""
    with kubeconfig.open() as stream:
        cluster = yaml.safe_load(stream)["current-context"]
    os.environ["KUBECONFIG"] = str(kubeconfig)  # read by kopf.login_with_kubeconfig
    io = PeerIO(lambda: 1)
    io.emit(start_record())
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.enabled = False
        settings.peering.standalone = True

    @kopf.on.event("v1", "configmaps", registry=registry)
    async def handle(body: kopf.Body, name: str, **_: Any) -> None:
        begun = time.time()
        record: dict[str, object] = {"ev": "r", "c": cluster, "n": name, "t": begun}
        written = written_at(body.get("data"))
        if written is not None:
            record["w"] = written
        io.emit(record)

    stop = asyncio.Event()
    operator = asyncio.create_task(
        kopf.operator(registry=registry, standalone=True, namespaces=[namespace], stop_flag=stop)
    )
    try:
        await io.run()
    finally:
        stop.set()
        await operator


def main() -> None:
    """Parse the kopf peer's options and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kopf").setLevel(logging.WARNING)
    asyncio.run(serve(args.kubeconfig, args.namespace))


if __name__ == "__main__":
    main()
