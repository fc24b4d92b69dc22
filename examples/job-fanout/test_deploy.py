"""``deploy/``: every manifest is accepted by a real API server, and they agree with the code and the CLI.

The image cannot be built here (no registry is reachable), so everything around
it is checked: each manifest by a server-side dry-run on a testbed API server
(schema, defaulting, admission, the namespace's Pod Security level), the CRD
against ``crd_manifest()``, the Deployment's ``MCRUNTIME_*`` against the
settings' validation and its entry point with ``mcruntime run --check``, and
the RBAC files against what ``mcruntime rbac`` derives from the program today.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import mcruntime as mcr
from example_testing import admin_cluster
from job_fanout import crd_manifest
from mcruntime._cli.runner import CANCEL_MARGIN, SHUTDOWN_MARGIN
from mcruntime.testing import Fleet

DEPLOY = Path(__file__).parent / "deploy"
FIELD_MANAGER = "deploy-dry-run"
RBAC_SETTINGS = {
    "MCRUNTIME_LEADER_ELECTION": "true",
    "MCRUNTIME_LEADER_ELECTION_ID": "job-fanout",
    "MCRUNTIME_LEADER_ELECTION_NAMESPACE": "job-fanout",
}
"""The settings that change the RBAC (the Lease), as the Deployment sets them and the RBAC files were generated."""


def manifests() -> list[tuple[str, dict[str, Any]]]:
    """(file, object) for every document of every YAML file under deploy/, in path order."""
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found.append((str(path.relative_to(DEPLOY)), document))
    return found


def deployment() -> dict[str, Any]:
    [found] = [obj for _, obj in manifests() if obj["kind"] == "Deployment"]
    return found


def rbac_command(role: str) -> list[str]:
    return [
        "rbac",
        "job_fanout:operator",
        "--name",
        "job-fanout",
        "--namespace",
        "job-fanout",
        "--role",
        role,
    ]


def test_deploy_has_the_pieces_a_cluster_needs() -> None:
    kinds = sorted({obj["kind"] for _, obj in manifests()})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "Deployment",
        "Namespace",
        "Role",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
    ]


async def test_every_manifest_is_accepted_by_a_server_side_dry_run(fleet: Fleet) -> None:
    async with admin_cluster(fleet["cluster-1"]) as cluster:
        namespace = yaml.safe_load((DEPLOY / "hub" / "namespace.yaml").read_text())
        await cluster.client.apply(namespace, field_manager=FIELD_MANAGER, dry_run=True)
        await cluster.client.apply(namespace, field_manager=FIELD_MANAGER)  # namespaced objects need it
        rejected = []
        for where, obj in manifests():
            try:
                await cluster.client.apply(obj, field_manager=FIELD_MANAGER, force=True, dry_run=True)
            except mcr.APIError as error:
                rejected.append(f"{where}: {obj['kind']} {obj['metadata']['name']}: {error}")
        assert rejected == []


@pytest.mark.parametrize("role", ["hub", "member"])
def test_the_rbac_files_are_what_mcruntime_rbac_generates_and_say_how(role: str, tmp_path: Path) -> None:
    """Below its header, ``deploy/<role>/rbac.yaml`` is byte for byte the command's output: it cannot drift."""
    kubeconfig = tmp_path / "kubeconfig"  # read, never connected to
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "hub", "cluster": {"server": "https://hub.invalid:6443"}}],
                "users": [{"name": "hub", "user": {"token": "unused"}}],
                "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "hub"}}],
                "current-context": "hub",
            }
        )
    )
    (tmp_path / "members").mkdir()
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.update(RBAC_SETTINGS, KUBECONFIG=str(kubeconfig), JOB_FANOUT_CLUSTERS=str(tmp_path / "members"))
    generated = subprocess.run(
        [sys.executable, "-m", "mcruntime", *rbac_command(role)],
        cwd=Path(__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert generated.returncode == 0, generated.stderr
    header, separator, body = (DEPLOY / role / "rbac.yaml").read_text().partition("\n\n")
    assert separator and all(line.startswith("#") for line in header.splitlines())
    assert body == generated.stdout, f"deploy/{role}/rbac.yaml: regenerate it with the command in its header"
    # The header's command is the one run here, with the Deployment's settings.
    words = " ".join(header.replace("#", " ").replace("\\", " ").split())
    assert "python -m mcruntime " + " ".join(rbac_command(role)) in words
    assert all(f"{name}={value}" in words.split() for name, value in RBAC_SETTINGS.items())


def test_the_deployment_sets_what_the_rbac_was_generated_with() -> None:
    namespace = yaml.safe_load((DEPLOY / "hub" / "namespace.yaml").read_text())["metadata"]["name"]
    [container] = deployment()["spec"]["template"]["spec"]["containers"]
    env = {
        item["name"]: item.get("value", namespace)  # the namespace comes from the downward API
        for item in container["env"]
        if item["name"].startswith(("MCRUNTIME_LEADER_ELECTION", "MCRUNTIME_SHARDING"))
    }
    assert env == RBAC_SETTINGS
    assert deployment()["spec"]["template"]["spec"]["serviceAccountName"] == "job-fanout"


def test_the_crd_manifest_is_the_one_the_code_declares() -> None:
    assert yaml.safe_load((DEPLOY / "hub" / "crd.yaml").read_text()) == crd_manifest()


def test_the_deployment_settings_are_valid_and_its_grace_period_covers_the_drain() -> None:
    pod = deployment()["spec"]["template"]["spec"]
    [container] = pod["containers"]
    variables = {
        item["name"]: item.get("value", "job-fanout")  # the namespace comes from the downward API
        for item in container["env"]
        if item["name"].startswith("MCRUNTIME_")
    }
    fields = {name.removeprefix("MCRUNTIME_").lower(): value for name, value in variables.items()}
    settings = mcr.ManagerSettings.load(**fields)
    assert settings.leader_election and deployment()["spec"]["replicas"] == 2
    # The kubelet's countdown starts before the preStop sleep, SIGTERM after it: the sleep,
    # the drain, then the exit.
    held = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert held > 0  # the Service's endpoints drop the pod while its webhooks still listen
    bound = held + settings.graceful_shutdown_timeout + SHUTDOWN_MARGIN + CANCEL_MARGIN
    assert pod["terminationGracePeriodSeconds"] >= bound
    probes = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert settings.health_probe_bind_address == f":{probes['probes']}"
    assert settings.metrics_bind_address == f":{probes['metrics']}"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_dockerfile_runs_the_cli_on_the_examples_factory_as_non_root() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["mcruntime", "run", "job_fanout:operator"]' in dockerfile
    assert "USER 65532:65532" in dockerfile
    assert deployment()["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532


EXAMPLES = Path(__file__).resolve().parent.parent
IMAGE_PYTHON = (
    "import sys; from pathlib import Path; "
    f"sys.path[:] = [p for p in sys.path if not Path(p).resolve().is_relative_to({str(EXAMPLES)!r})]; "
    "sys.argv[0] = 'mcruntime'; from mcruntime._cli.main import entry_point; entry_point()"
)
"""``mcruntime`` as in the image: without the examples this environment puts on ``sys.path``."""


def image_app(directory: Path) -> Path:
    """The image's working directory: what the Dockerfile copies from the example, and nothing else."""
    directory.mkdir()
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1] == "./":
            for source in words[1:-1]:
                if source.startswith("examples/"):
                    path = EXAMPLES.parent / source
                    (directory / path.name).write_bytes(path.read_bytes())
    return directory


async def test_the_entry_point_passes_mcruntime_run_check_with_the_deployments_environment(
    fleet: Fleet, tmp_path: Path
) -> None:
    [container] = deployment()["spec"]["template"]["spec"]["containers"]
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env.update({item["name"]: item.get("value", "job-fanout") for item in container["env"]})
    env.update(KUBECONFIG=str(fleet["cluster-1"].kubeconfig_path()), JOB_FANOUT_CLUSTERS=str(tmp_path))
    app = image_app(tmp_path / "app")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        IMAGE_PYTHON,
        "run",
        "job_fanout:operator",
        *container["args"],
        "--check",
        cwd=app,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert out.decode().splitlines() == [
        "provider: KubeconfigFileProvider",
        "controller job-fanout: watches Test (demo.mcruntime.dev/v1) in the hub, "
        "Job (batch/v1) in every cluster, a channel",
        "metrics: :8080",
        "probes: :8081",
        "leader election: Lease job-fanout/job-fanout",
        "ok: job_fanout:operator",
    ]
