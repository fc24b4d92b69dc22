"""job-fanout: a Test on the main cluster runs a Job in the main cluster and in every sub cluster.

The scenario of the seed article (a multi-cluster operator written with
controller-runtime): a custom resource ``Test`` lives on the main cluster; for
each one, the controller creates a Job in the main cluster and in every sub
cluster, follows the Jobs' status in all of them, and sets the Test's
``status.phase`` to ``finished`` when every Job succeeded or ``error`` as soon
as one failed. The article had to smuggle the cluster name into the request's
namespace and keep a map of clients by hand; here the request carries its
cluster, and the fan-out pattern is ``mcruntime.toolkit``'s: each Job records
its Test (cluster, kind, namespace, name, uid) with ``set_cluster_owner``, Job
events from any cluster reach the Test through ``enqueue_for_cluster_owner``,
and ``ChildCleanup`` deletes the Jobs everywhere before it releases the Test's
finalizer (holding it while a cluster is unreachable). Sub clusters come and
go through a provider while the controller runs (a new cluster gets the Tests'
Jobs too; a removed one drops out of their status). The manager also serves the
Test's admission and conversion webhooks (``job_fanout_webhooks``): validation,
defaults, and ``v1alpha1`` next to the stored ``v1``.

Run it against a main cluster and a directory of sub-cluster kubeconfigs::

    python examples/job-fanout/job_fanout.py --main main.kubeconfig --clusters ./fleet/

or as it runs in a pod (``deploy/``), through the ``mcruntime`` command line and
the environment (``JOB_FANOUT_CLUSTERS``, ``MCRUNTIME_*``)::

    JOB_FANOUT_CLUSTERS=./fleet/ mcruntime run job_fanout:operator

The clusters need what runs a Job: the job controller, a scheduler and nodes.
The testbed's clusters have them when started with workloads
(``Fleet(workloads=True)``): real kube-controller-manager and kube-scheduler,
and kwok nodes that "run" each Pod for a moment and let it exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import mcruntime as mcr
from job_fanout_webhooks import DEFAULT_COMMAND, setup_webhooks
from job_fanout_webhooks import MAIN as MAIN  # re-exported: the demo reads it from here
from mcruntime import toolkit
from mcruntime_file import KubeconfigFileProvider

GROUP = "demo.mcruntime.dev"
TEST = mcr.Kind(f"{GROUP}/v1", "Test")
JOB = mcr.Kind("batch/v1", "Job")
NAMESPACE = mcr.Kind("v1", "Namespace")
CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
TEST_LABEL = f"{GROUP}/test"
"""Label on every child Job, for people: its Test's name (``toolkit.set_cluster_owner`` records the rest)."""
EXIT_CODE_ANNOTATION = "testbed.mcruntime.dev/exit-code"
"""On the Pods of clusters listed in ``spec.failIn``: the exit code a kwok node of the testbed ends
them with (``mcruntime.testing.EXIT_CODE_ANNOTATION``). A real node ignores it and runs the failing
command instead, so the Job fails either way."""
FAILING_COMMAND = ("sh", "-c", "echo 'failing on purpose (spec.failIn)'; exit 1")
FINALIZER = f"{GROUP}/jobs"
FIELD_MANAGER = "job-fanout"
WEBHOOK_CONFIGURATION = "job-fanout"
"""The name of the Validating/MutatingWebhookConfiguration the manager registers on the main cluster."""

log = logging.getLogger("job_fanout")

JSON = dict[str, Any]


def display_name(cluster: str) -> str:
    """The name a person reads: ``main`` for the local cluster, else the provider's name."""
    return cluster or MAIN


def crd_manifest() -> JSON:
    """The ``Test`` CustomResourceDefinition (namespaced, with a status subresource), in two versions.

    ``v1`` is stored; ``v1alpha1`` is still served and differs in one field
    (``failOn``, renamed ``failIn``). The conversion webhook of
    ``job_fanout_webhooks`` translates between them; the manager points the
    CRD's ``spec.conversion`` at it when it registers its webhooks.
    """
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"tests.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "tests", "singular": "test", "kind": "Test", "listKind": "TestList"},
            "versions": [_crd_version("v1", "failIn", storage=True), _crd_version("v1alpha1", "failOn")],
        },
    }


def _crd_version(name: str, fail_field: str, *, storage: bool = False) -> JSON:
    """One served version of the Test CRD; they differ only in the name of the failing-clusters field."""
    string_list = {"type": "array", "items": {"type": "string"}}
    preserve = {"x-kubernetes-preserve-unknown-fields": True}
    return {
        "name": name,
        "served": True,
        "storage": storage,
        "subresources": {"status": {}},
        "additionalPrinterColumns": [
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {
                            "image": {"type": "string"},
                            "command": string_list,
                            fail_field: {**string_list, "description": "clusters whose Job fails on purpose"},
                            "clusters": {
                                **string_list,
                                "description": "clusters to run the Job in (main included); default: all",
                            },
                        },
                    },
                    "status": {
                        "type": "object",
                        "properties": {
                            "phase": {"type": "string"},
                            "clusters": {"type": "object", "additionalProperties": {"type": "string"}},
                            "conditions": {  # the cleanup's ChildrenDeleted, while it waits
                                "type": "array",
                                "items": {"type": "object", **preserve},
                            },
                        },
                    },
                },
            }
        },
    }


async def install_crd(cluster: mcr.Cluster, timeout: float = 30.0) -> None:
    """Create the Test CRD unless it exists, and wait until Tests can be listed.

    Established is not yet servable: for a second or two the API server answers
    429 "storage is (re)initializing" for a new resource; the list below waits
    that out (the client retries 429s) so the controller's informers never see it.
    """
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(crd_manifest(), field_manager=FIELD_MANAGER)
    async with asyncio.timeout(timeout):
        while True:
            crd = await cluster.client.get(CRD, f"tests.{GROUP}")
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                break
            await asyncio.sleep(0.1)
        while True:
            try:
                await cluster.client.list(TEST, page_size=1)
                return
            except (mcr.TooManyRequests, mcr.KindNotFound):
                await asyncio.sleep(0.2)


def make_test(
    name: str,
    namespace: str = "default",
    *,
    image: str = "busybox:1.36",
    command: Sequence[str] = DEFAULT_COMMAND,
    fail_in: Iterable[str] = (),
    clusters: Iterable[str] | None = None,
) -> JSON:
    """A Test object; ``fail_in`` names clusters (``main`` included) whose Job fails on purpose.

    ``clusters`` limits its Jobs to those clusters (default: every engaged one).
    """
    spec: JSON = {"image": image, "command": list(command), "failIn": list(fail_in)}
    if clusters is not None:
        spec["clusters"] = list(clusters)
    return {
        "apiVersion": TEST.api_version,
        "kind": "Test",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def job_for(test: JSON, cluster: str) -> JSON:
    """The child Job of ``test`` in ``cluster``: same name and namespace, owned by the Test.

    In the clusters of ``spec.failIn`` the Pod fails on purpose: its command
    exits 1 on a real node, and its annotation makes a kwok node end it with 1.
    """
    metadata = test["metadata"]
    spec = test.get("spec") or {}
    failing = display_name(cluster) in (spec.get("failIn") or [])
    annotations = {EXIT_CODE_ANNOTATION: "1"} if failing else {}
    container: JSON = {"name": "test", "image": spec.get("image") or "busybox:1.36"}
    if failing:
        container["command"] = list(FAILING_COMMAND)
    elif spec.get("command"):
        container["command"] = list(spec["command"])
    job: JSON = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": {TEST_LABEL: metadata["name"]},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {TEST_LABEL: metadata["name"]}, "annotations": annotations},
                "spec": {"restartPolicy": "Never", "containers": [container]},
            },
        },
    }
    toolkit.set_cluster_owner(job, mcr.LOCAL_CLUSTER, test)
    return job


def job_phase(job: JSON) -> str:
    """``succeeded``, ``failed`` or ``running``, from the Job's terminal conditions."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return "succeeded"
        if condition.get("type") == "Failed":
            return "failed"
    return "running"


def overall_phase(children: Mapping[str, str]) -> str:
    """The article's rule: one failed Job makes the Test ``error``; all succeeded, ``finished``."""
    if any(phase == "failed" for phase in children.values()):
        return "error"
    if children and all(phase == "succeeded" for phase in children.values()):
        return "finished"
    return "running"


class JobFanout:
    """The reconciler of Tests, and an ``Aware`` so it hears clusters come and go.

    Tests are reconciled when they change, when one of their Jobs changes in
    any cluster, and when a cluster is engaged or stops: a new sub cluster gets
    the Jobs of every Test (and loses the Jobs of Tests deleted while it was
    away), and a removed one drops out of their status.
    """

    def __init__(self, manager: mcr.Manager, *, namespace: str | None = None) -> None:
        """``namespace`` limits the controller to the Tests of one namespace (``None``: all)."""
        self.manager = manager
        self.namespace = namespace
        self.triggers: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
        self._tests: set[mcr.Request] = set()
        # Its Background deletion matters: the API server's default for batch/v1 Jobs is
        # to orphan their Pods through a finalizer that only the garbage collector removes.
        self.cleanup = toolkit.ChildCleanup(manager.clusters, FINALIZER, [JOB])

    def setup(self, *, max_concurrent_reconciles: int = 4) -> mcr.Controller:
        """Wire the controller into the manager and return it."""
        controller = (
            mcr.controller_managed_by(self.manager)
            .named("job-fanout")
            .for_(TEST, clusters=mcr.LOCAL_ONLY, namespace=self.namespace)
            .watches(
                JOB,
                toolkit.enqueue_for_cluster_owner(TEST),
                clusters=mcr.EVERY_CLUSTER,
                namespace=self.namespace,
                label_selector=toolkit.owned_by_kind_selector(TEST),
            )
            .watches_channel(self.triggers)
            # For the generated RBAC (`mcruntime rbac`): what _child and the cleanup write.
            .writes(JOB, "create", "delete", clusters=mcr.EVERY_CLUSTER)
            .writes(NAMESPACE, "create", clusters=mcr.EVERY_CLUSTER)
            .with_options(max_concurrent_reconciles=max_concurrent_reconciles)
            .complete(self)
        )
        self.manager.add(self)
        return controller

    async def engage(self, name: str, cluster: mcr.Cluster) -> None:
        """A cluster joined: every known Test again, and again when it leaves."""
        log.info("cluster %s engaged", display_name(name))

        def left() -> None:
            log.info("cluster %s left", display_name(name))
            self._retrigger()

        cluster.on_stop(left)
        cluster.tasks.spawn(self._sweep(name), "job-fanout-orphans")
        self._retrigger()

    async def _sweep(self, name: str) -> None:
        """Delete the Jobs of Tests deleted while this cluster was out of the fleet."""
        try:
            await self.cleanup.delete_orphans(name, TEST, namespace=self.namespace)
        except mcr.MCRuntimeError as error:  # best effort: it runs again when the cluster rejoins
            log.warning("cluster %s: orphaned Jobs not swept: %s", display_name(name), error)

    def _retrigger(self) -> None:
        for request in list(self._tests):
            self.triggers.put_nowait(request)

    async def reconcile(self, request: mcr.Request) -> mcr.Result | None:
        """Fan the Test's Job out to every engaged cluster and sum their status up."""
        main = await self.manager.get_cluster(mcr.LOCAL_CLUSTER)
        test = await main.cache.get_or_none(TEST, request.name, namespace=request.namespace)
        if test is None or test["metadata"].get("deletionTimestamp"):
            self._tests.discard(request)  # deleting: the Jobs go everywhere, then the finalizer
            return (await self.cleanup.finalize(mcr.LOCAL_CLUSTER, test)).result() if test else None
        self._tests.add(request)
        test = await toolkit.add_finalizer(main.client, test, FINALIZER)

        clusters = self.manager.clusters()
        if (wanted := (test.get("spec") or {}).get("clusters")) is not None:
            clusters = {name: cluster for name, cluster in clusters.items() if display_name(name) in wanted}
        results = await asyncio.gather(
            *(self._child(name, cluster, test) for name, cluster in clusters.items()), return_exceptions=True
        )
        children: dict[str, str] = {}
        retry = False
        for name, result in zip(clusters, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                where = f"{request.namespace}/{request.name}"
                log.warning("Test %s: cluster %s: %s", where, display_name(name), result)
                children[display_name(name)] = "unknown"
                retry = True
            else:
                children[display_name(name)] = result
        before = test.get("status") or {}
        status: JSON = {"phase": overall_phase(children), "clusters": dict(sorted(children.items()))}
        if patch := toolkit.merge_patch(before, {**before, **status}):  # a cluster gone: its key null
            await main.client.patch(
                TEST, request.name, {"status": patch}, namespace=request.namespace, subresource="status"
            )
            if before.get("phase") != status["phase"]:
                details = ", ".join(f"{cluster}: {phase}" for cluster, phase in status["clusters"].items())
                log.info("Test %s/%s is %s (%s)", request.namespace, request.name, status["phase"], details)
        return mcr.Result(requeue_after=5.0) if retry else None

    async def _child(self, name: str, cluster: mcr.Cluster, test: JSON) -> str:
        """The phase of the Test's Job in one cluster, creating the Job (and namespace) if missing."""
        metadata = test["metadata"]
        job = await cluster.cache.get_or_none(JOB, metadata["name"], namespace=metadata["namespace"])
        if job is not None:
            return job_phase(job)
        manifest = job_for(test, name)
        try:
            await cluster.client.create(manifest)
        except mcr.AlreadyExists:
            return "running"  # created by an earlier pass; the cache has not seen it yet
        except mcr.NotFound:  # the namespace does not exist in this cluster yet
            with contextlib.suppress(mcr.AlreadyExists):
                await cluster.client.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": metadata["namespace"]}}
                )
            with contextlib.suppress(mcr.AlreadyExists):
                await cluster.client.create(manifest)
        log.info(
            "created Job %s/%s in cluster %s", metadata["namespace"], metadata["name"], display_name(name)
        )
        return "running"


def build(
    main: mcr.ClusterConfig,
    provider: mcr.Provider | None,
    *,
    namespace: str | None = None,
    metrics_address: str | None = None,
    handle_signals: bool = True,
    webhook: mcr.WebhookOptions | None = None,
) -> tuple[mcr.Manager, JobFanout]:
    """The manager with the job-fanout controller, and the Test's webhooks when ``webhook`` is given.

    With ``webhook``, the manager serves the Test's validating, defaulting and
    conversion webhooks (``job_fanout_webhooks``) and, with its own
    certificates, registers them in the clusters it engages.
    """
    manager = mcr.Manager(
        provider,
        local=main,
        metrics_address=metrics_address,
        handle_signals=handle_signals,
        graceful_shutdown_timeout=10.0,
        field_manager=FIELD_MANAGER,
        webhook=webhook,
    )
    fanout = JobFanout(manager, namespace=namespace)
    fanout.setup()
    if webhook is not None:
        setup_webhooks(manager, TEST)
    return manager, fanout


CLUSTERS_VARIABLE = "JOB_FANOUT_CLUSTERS"
"""Where :func:`operator` finds sub-cluster kubeconfigs: files or directories, ``os.pathsep``-separated."""
NAMESPACE_VARIABLE = "JOB_FANOUT_NAMESPACE"
"""Set: :func:`operator` reconciles only the Tests of this namespace."""


def hub_config() -> mcr.ClusterConfig:
    """The main cluster: in a pod, its own (its ServiceAccount token); else ``KUBECONFIG``, as kubectl."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return mcr.in_cluster_config()
    return mcr.load_kubeconfig_env()


def operator(settings: mcr.ManagerSettings, *, local: mcr.ClusterConfig | None = None) -> mcr.Manager:
    """The factory behind ``mcruntime run job_fanout:operator`` (the deployment's entry point).

    Everything comes from the environment, as in a Deployment: the main
    cluster (:func:`hub_config`), the sub clusters' kubeconfigs
    (:data:`CLUSTERS_VARIABLE`: a Secret volume, each key one kubeconfig whose
    context names the cluster; keys added later are engaged while running),
    and the manager's settings (``MCRUNTIME_*`` and the command line's flags,
    validated by ``mcruntime run``: leader election, probes, metrics, the
    drain). Unlike :func:`run`, it does not install the CRD: a deployment
    applies ``deploy/hub/crd.yaml`` once, so the controller's identity needs no
    right to create CRDs. ``local`` replaces :func:`hub_config` (a test passing
    ``mcr.in_cluster_config(directory)``, say); ``mcruntime run`` leaves it out.
    """
    paths = [path for path in os.environ.get(CLUSTERS_VARIABLE, "").split(os.pathsep) if path]
    provider = KubeconfigFileProvider(paths, naming="context") if paths else None
    manager = mcr.Manager.from_settings(provider, local=local or hub_config(), settings=settings)
    manager.field_manager = FIELD_MANAGER
    JobFanout(manager, namespace=os.environ.get(NAMESPACE_VARIABLE) or None).setup()
    return manager


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: main cluster, sub clusters, namespace, metrics."""
    parser = argparse.ArgumentParser(
        prog="job_fanout.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--main", help="kubeconfig of the main cluster (default: $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--main-context", help="context of --main to use (default: its current context)")
    parser.add_argument(
        "--clusters",
        nargs="*",
        default=[],
        metavar="PATH",
        help="kubeconfig files or directories of sub clusters, watched while running; every context is one",
    )
    parser.add_argument(
        "--naming",
        choices=["context", "file/context"],
        default="context",
        help="sub clusters are named by their context (default) or by file path and context",
    )
    parser.add_argument("--namespace", help="only the Tests of this namespace (default: every namespace)")
    parser.add_argument(
        "--metrics-address", default="127.0.0.1:8080", help="host:port of /metrics ('' disables)"
    )
    parser.add_argument(
        "--no-install-crd", action="store_true", help="do not create the Test CRD on the main cluster"
    )
    parser.add_argument(
        "--webhook-address",
        default="127.0.0.1:9443",
        help="host:port of the Test's admission and conversion webhooks ('' disables them)",
    )
    parser.add_argument(
        "--webhook-url-host",
        help="host the API servers call the webhooks at (default: the --webhook-address host)",
    )
    parser.add_argument(
        "--remove-webhooks-on-exit",
        action="store_true",
        help="delete the webhook configurations from the clusters when the controller stops",
    )
    return parser.parse_args(argv)


def webhook_options(arguments: argparse.Namespace) -> mcr.WebhookOptions | None:
    """The webhook server's options from the command line; ``None`` when ``--webhook-address ''``."""
    if not arguments.webhook_address:
        return None
    try:
        return mcr.WebhookOptions(
            address=arguments.webhook_address,
            url_host=arguments.webhook_url_host,
            configuration_name=WEBHOOK_CONFIGURATION,
            remove_on_disengage=arguments.remove_webhooks_on_exit,
        )
    except ValueError as error:
        raise mcr.MCRuntimeError(f"--webhook-address: {error}") from None


def main_config(arguments: argparse.Namespace) -> mcr.ClusterConfig:
    """The main cluster's config from ``--main`` (and ``--main-context``), else ``KUBECONFIG``."""
    if arguments.main:
        return mcr.load_kubeconfig(Path(arguments.main).expanduser(), context=arguments.main_context)
    return mcr.load_kubeconfig_env(context=arguments.main_context)


async def run(arguments: argparse.Namespace) -> None:
    """Install the CRD, then run the manager until SIGINT or SIGTERM."""
    config = main_config(arguments)
    webhook = webhook_options(arguments)
    if not arguments.no_install_crd:
        async with mcr.Cluster(mcr.LOCAL_CLUSTER, config) as cluster:
            await install_crd(cluster)
    provider = (
        KubeconfigFileProvider(arguments.clusters, naming=arguments.naming) if arguments.clusters else None
    )
    manager, _ = build(
        config,
        provider,
        namespace=arguments.namespace,
        metrics_address=arguments.metrics_address or None,
        webhook=webhook,
    )
    await manager.start()


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    arguments = parse_arguments(argv)
    mcr.configure_logging("INFO")
    try:
        asyncio.run(run(arguments))
    except mcr.MCRuntimeError as error:
        print(f"job-fanout: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
