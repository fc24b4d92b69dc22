"""job-fanout, run from its command line against testbed control planes.

cluster-1 is the main cluster; sub clusters are kubeconfig files in a directory
the program watches, added and deleted while it runs. The clusters run
workloads (``workload_fleet``): the real Job controller runs the Jobs on kwok
nodes, and the real garbage collector deletes their Pods. Each test works in a
namespace of its own, and the program watches only that one, so tests never
see each other's Tests.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import mcruntime as mcr
from example_testing import (
    KubeconfigDir,
    admin_cluster,
    create_namespace,
    eventually,
    running,
    write_kubeconfig,
)
from job_fanout import (
    EXIT_CODE_ANNOTATION,
    FAILING_COMMAND,
    GROUP,
    JOB,
    TEST,
    TEST_LABEL,
    install_crd,
    job_for,
    make_test,
    parse_arguments,
    run,
)
from job_fanout_webhooks import DEFAULT_COMMAND
from mcruntime import toolkit
from mcruntime.testing import EXIT_CODE_ANNOTATION as TESTBED_EXIT_CODE_ANNOTATION
from mcruntime.testing import Fleet

POD = mcr.Kind("v1", "Pod")
TEST_V1ALPHA1 = mcr.Kind(f"{GROUP}/v1alpha1", "Test")


def test_the_failure_annotation_is_the_one_the_testbed_reads() -> None:
    assert EXIT_CODE_ANNOTATION == TESTBED_EXIT_CODE_ANNOTATION


@asynccontextmanager
async def fanout(
    fleet: Fleet, tmp_path: Path, subs: list[str], *, webhooks: bool = False
) -> AsyncIterator[tuple[str, KubeconfigDir]]:
    """job-fanout running with cluster-1 as main and ``subs`` as kubeconfig files; yields (namespace, dir).

    ``webhooks`` serves the Test's webhooks on a free port and removes their
    configurations when it stops (so no later test meets a configuration whose
    server is gone); without it they are off, as with ``--webhook-address ''``.
    """
    namespace = f"fanout-{uuid.uuid4().hex[:8]}"
    main_file = write_kubeconfig(tmp_path / "main.kubeconfig", fleet["cluster-1"].kubeconfig())
    fleet_dir = KubeconfigDir(tmp_path / "fleet")
    for name in subs:
        fleet_dir.add(fleet[name])
    async with admin_cluster(fleet["cluster-1"]) as main:
        await install_crd(main)
        await create_namespace(main, namespace)
    arguments = parse_arguments(
        [
            "--main",
            str(main_file),
            "--clusters",
            str(fleet_dir.path),
            "--namespace",
            namespace,
            "--metrics-address",
            "127.0.0.1:0",
            *(["--webhook-address", "127.0.0.1:0", "--remove-webhooks-on-exit"] if webhooks else []),
            *([] if webhooks else ["--webhook-address", ""]),
        ]
    )
    async with running(run(arguments), "job-fanout"):
        yield namespace, fleet_dir


async def phase_of(main: mcr.Cluster, namespace: str, name: str) -> dict[str, Any]:
    test = await main.client.get(TEST, name, namespace=namespace)
    status: dict[str, Any] = test.get("status") or {}
    return status


async def test_a_test_runs_a_job_in_every_cluster_and_finishes(workload_fleet: Fleet, tmp_path: Path) -> None:
    async with (
        fanout(workload_fleet, tmp_path, ["cluster-2", "cluster-3"]) as (namespace, _),
        admin_cluster(workload_fleet["cluster-1"]) as main,
    ):
        await main.client.create(make_test("smoke", namespace))

        async def finished() -> bool:
            return (await phase_of(main, namespace, "smoke")) == {
                "phase": "finished",
                "clusters": {"cluster-2": "succeeded", "cluster-3": "succeeded", "main": "succeeded"},
            }

        await eventually(
            finished, "Test smoke finished with a succeeded Job in main, cluster-2 and cluster-3"
        )
        for plane in (workload_fleet[name] for name in ("cluster-1", "cluster-2", "cluster-3")):
            async with admin_cluster(plane) as cluster:
                job = await cluster.client.get(JOB, "smoke", namespace=namespace)
                assert job["metadata"]["labels"][TEST_LABEL] == "smoke"
                assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "busybox:1.36"
                assert job["status"]["succeeded"] == 1


async def test_one_failed_job_makes_the_test_error(workload_fleet: Fleet, tmp_path: Path) -> None:
    async with (
        fanout(workload_fleet, tmp_path, ["cluster-2"]) as (namespace, _),
        admin_cluster(workload_fleet["cluster-1"]) as main,
    ):
        await main.client.create(make_test("flaky", namespace, fail_in=["cluster-2"]))

        async def errored() -> bool:
            return (await phase_of(main, namespace, "flaky")) == {
                "phase": "error",
                "clusters": {"cluster-2": "failed", "main": "succeeded"},
            }

        await eventually(errored, "Test flaky in error: its Job failed in cluster-2, succeeded in main")
        # The real Job controller saw a real Pod fail: kwok ended it with the annotated exit code.
        async with admin_cluster(workload_fleet["cluster-2"]) as sub:
            (pod,) = (await sub.client.list(POD, namespace=namespace, label_selector="job-name=flaky")).items
            assert pod["metadata"]["annotations"][EXIT_CODE_ANNOTATION] == "1"
            assert pod["spec"]["containers"][0]["command"] == list(FAILING_COMMAND)
            assert pod["status"]["phase"] == "Failed"
            assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
        (main_pod,) = (
            await main.client.list(POD, namespace=namespace, label_selector="job-name=flaky")
        ).items
        assert main_pod["status"]["phase"] == "Succeeded"


async def test_clusters_joining_get_jobs_and_clusters_leaving_drop_out(
    workload_fleet: Fleet, tmp_path: Path
) -> None:
    async with (
        fanout(workload_fleet, tmp_path, ["cluster-2"]) as (namespace, fleet_dir),
        admin_cluster(workload_fleet["cluster-1"]) as main,
    ):
        await main.client.create(make_test("roaming", namespace))

        async def clusters_are(expected: set[str], phase: str) -> bool:
            status = await phase_of(main, namespace, "roaming")
            return set(status.get("clusters") or {}) == expected and status.get("phase") == phase

        await eventually(
            lambda: clusters_are({"main", "cluster-2"}, "finished"), "finished on main and cluster-2"
        )

        fleet_dir.add(
            workload_fleet["cluster-3"]
        )  # a cluster joins: it gets the Test's Job, which runs again
        await eventually(
            lambda: clusters_are({"main", "cluster-2", "cluster-3"}, "finished"), "finished on cluster-3 too"
        )
        async with admin_cluster(workload_fleet["cluster-3"]) as joined:
            assert (await joined.client.get(JOB, "roaming", namespace=namespace))["status"]["succeeded"] == 1

        fleet_dir.remove("cluster-2")  # a cluster leaves: it drops out of the status
        await eventually(lambda: clusters_are({"main", "cluster-3"}, "finished"), "cluster-2 dropped out")


async def test_deleting_a_test_deletes_its_jobs_and_their_pods_in_every_cluster(
    workload_fleet: Fleet, tmp_path: Path
) -> None:
    async with (
        fanout(workload_fleet, tmp_path, ["cluster-2"]) as (namespace, _),
        admin_cluster(workload_fleet["cluster-1"]) as main,
        admin_cluster(workload_fleet["cluster-2"]) as sub,
    ):
        await main.client.create(make_test("doomed", namespace))

        async def jobs_and_pods_exist() -> bool:
            jobs = [await c.client.list(JOB, namespace=namespace) for c in (main, sub)]
            pods = [await c.client.list(POD, namespace=namespace) for c in (main, sub)]
            return all(len(listed.items) == 1 for listed in jobs + pods)

        await eventually(jobs_and_pods_exist, "the Test's Jobs and their Pods exist in main and cluster-2")
        test = await main.client.get(TEST, "doomed", namespace=namespace)
        assert "demo.mcruntime.dev/jobs" in test["metadata"]["finalizers"]

        await main.client.delete(TEST, "doomed", namespace=namespace)

        async def all_gone() -> bool:
            try:
                await main.client.get(TEST, "doomed", namespace=namespace)
                return False
            except mcr.NotFound:
                pass
            found = [
                await c.client.list(kind, namespace=namespace) for c in (main, sub) for kind in (JOB, POD)
            ]
            return all(not listed.items for listed in found)

        # Background propagation: the garbage collector deletes the Pods after their Jobs.
        await eventually(all_gone, "the Test, its Jobs and their Pods in main and cluster-2 deleted")


async def test_a_cluster_joining_loses_the_jobs_of_tests_deleted_while_it_was_away(
    workload_fleet: Fleet, tmp_path: Path
) -> None:
    async with (
        fanout(workload_fleet, tmp_path, ["cluster-2"]) as (namespace, fleet_dir),
        admin_cluster(workload_fleet["cluster-3"]) as away,
    ):
        # cluster-3 still holds the Job of a Test that was deleted while it was out of the fleet.
        gone_test = make_test("gone", namespace)
        gone_test["metadata"]["uid"] = str(uuid.uuid4())
        orphan = job_for(gone_test, "cluster-3")
        orphan["spec"]["suspend"] = True  # no Pod: only its deletion matters here
        await create_namespace(away, namespace)
        await away.client.create(orphan)
        assert toolkit.cluster_owner_of(orphan) is not None

        fleet_dir.add(workload_fleet["cluster-3"])

        async def orphan_gone() -> bool:
            return await away.client.get_or_none(JOB, "gone", namespace=namespace) is None

        await eventually(orphan_gone, "the Job of the deleted Test deleted when cluster-3 joined")


# --- webhooks: on a plain fleet (no Job runs; admission and conversion are the API server's) ----


def bare_test(name: str, namespace: str, kind: mcr.Kind = TEST, **spec: Any) -> dict[str, Any]:
    """A Test with only the fields given (``make_test`` fills in every field)."""
    return {
        "apiVersion": kind.api_version,
        "kind": "Test",
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }


async def webhooks_serving(main: mcr.Cluster, namespace: str) -> None:
    """Wait until main's API server calls this run's validating, mutating and conversion webhooks.

    Dry runs store nothing. A v1alpha1 Test with ``failOn`` and no command comes
    back defaulted, in v1alpha1, with ``failOn`` and no ``failIn`` only when the
    request went v1alpha1 -> v1 (conversion webhook) -> defaulter -> v1alpha1.
    """

    async def answering() -> bool:
        try:
            await main.client.create(bare_test("probe", namespace), dry_run=True)
            return False  # admitted without an image: the validating webhook is not called yet
        except mcr.Invalid as error:
            if "spec.image is required" not in str(error):
                return False
        except mcr.APIError:
            return False  # a configuration of this run's server not yet in effect
        probe = bare_test("probe", namespace, TEST_V1ALPHA1, image="busybox:1.36", failOn=["main"])
        try:
            spec = (await main.client.create(probe, dry_run=True))["spec"]
        except mcr.APIError:
            return False
        return spec.get("failOn") == ["main"] and "failIn" not in spec and spec.get("command") is not None

    await eventually(answering, "the Test's validating, mutating and conversion webhooks answer on main")


async def test_invalid_tests_are_refused_and_valid_ones_defaulted(fleet: Fleet, tmp_path: Path) -> None:
    async with (
        fanout(fleet, tmp_path, ["cluster-2"], webhooks=True) as (namespace, _),
        admin_cluster(fleet["cluster-1"]) as main,
    ):
        await webhooks_serving(main, namespace)
        with pytest.raises(mcr.Invalid, match=f"Test {namespace}/no-image: spec.image is required"):
            await main.client.create(bare_test("no-image", namespace, command=["true"]))

        async def sub_engaged() -> bool:  # the validator reads the manager's engaged clusters
            named = bare_test("probe", namespace, image="busybox:1.36", clusters=["cluster-2"])
            try:
                await main.client.create(named, dry_run=True)
            except mcr.Invalid:
                return False
            return True

        await eventually(sub_engaged, "cluster-2 engaged: a Test may name it")
        with pytest.raises(
            mcr.Invalid,
            match=re.escape(
                "spec.clusters names 'nowhere', which is not engaged; engaged clusters: cluster-2, main"
            ),
        ):
            await main.client.create(
                bare_test("lost", namespace, image="busybox:1.36", clusters=["main", "nowhere"])
            )
        assert await main.client.get_or_none(TEST, "lost", namespace=namespace) is None

        created = await main.client.create(bare_test("minimal", namespace, image="busybox:1.36"))
        assert created["spec"] == {"image": "busybox:1.36", "command": list(DEFAULT_COMMAND), "failIn": []}
        # Defaults fill only what is missing.
        given = await main.client.create(
            bare_test("given", namespace, image="busybox:1.36", command=["true"], clusters=["cluster-2"])
        )
        assert given["spec"] == {
            "image": "busybox:1.36",
            "command": ["true"],
            "failIn": [],
            "clusters": ["cluster-2"],
        }

        async def only_in_cluster_2() -> bool:  # spec.clusters limits the fan-out
            status = await phase_of(main, namespace, "given")
            return set(status.get("clusters") or {}) == {"cluster-2"}

        await eventually(only_in_cluster_2, "Test given has a Job in cluster-2 only")
        assert await main.client.get_or_none(JOB, "given", namespace=namespace) is None


async def test_a_test_written_as_v1alpha1_reads_back_as_v1_and_the_reverse(
    fleet: Fleet, tmp_path: Path
) -> None:
    async with (
        fanout(fleet, tmp_path, [], webhooks=True) as (namespace, _),
        admin_cluster(fleet["cluster-1"]) as main,
    ):
        await webhooks_serving(main, namespace)
        old = bare_test("old", namespace, TEST_V1ALPHA1, image="busybox:1.36", failOn=["main"])
        written = await main.client.create(old)
        assert written["apiVersion"] == TEST_V1ALPHA1.api_version
        assert written["spec"]["failOn"] == ["main"] and "failIn" not in written["spec"]
        read = await main.client.get(TEST, "old", namespace=namespace)
        assert read["apiVersion"] == TEST.api_version
        assert read["spec"] == {"image": "busybox:1.36", "command": list(DEFAULT_COMMAND), "failIn": ["main"]}

        await main.client.create(make_test("new", namespace, fail_in=["main"], clusters=["main"]))
        read_old = await main.client.get(TEST_V1ALPHA1, "new", namespace=namespace)
        assert read_old["apiVersion"] == TEST_V1ALPHA1.api_version
        assert read_old["spec"] == {
            "image": "busybox:1.36",
            "command": list(DEFAULT_COMMAND),
            "failOn": ["main"],
            "clusters": ["main"],
        }
