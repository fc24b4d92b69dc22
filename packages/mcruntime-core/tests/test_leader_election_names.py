"""A leader-election Lease the API server would refuse is a bad setting at start, and a refusal at run time fails /readyz.

Found by an outside review: ``mcruntime run --leader-election
--leader-election-id MyOperator`` (or ``a/b``, or the namespace ``..`` or
``""``) passed ``--check``, then campaigned forever without leading while
/readyz said ``[+]coordination ok``; the API server's 422 (a 500 for ``..``)
showed only at DEBUG, every retry. Now the id must be a DNS subdomain and the
namespace a DNS label (``ManagerSettings``, the flags, ``LeaderElectionConfig``),
and a 4xx the next attempt will get too (not a 409 or 429) is named at WARNING
once and in /readyz until the hub takes the Lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import aiohttp
import pytest
from kube_helpers import readyz, unique
from lease_helpers import FAST, LEASE

import mcruntime as mcr
from mcruntime._base.errors import error_from_status
from mcruntime._cli.main import main
from mcruntime.coordination import LeaderElector
from mcruntime.testing import ControlPlane, Fleet, admin_config, running, wait_until

NAMESPACE = mcr.Kind("v1", "Namespace")
POLICY = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy")
BINDING = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding")
WEBHOOKS = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
LOG = "mcruntime.leaderelection"

LONGEST_NAME = ".".join(["a" * 63] * 3 + ["b" * 61])
LONGEST_NAMESPACE = "n" * 63
BAD_NAMES = [
    "MyOperator",
    "a/b",
    "my_operator",
    "-leader",
    "leader-",
    "a..b",
    ".leader",
    "",
    LONGEST_NAME + "c",
]
BAD_NAMESPACES = ["..", "", "Default", "kube.system", "-ns", "ns-", "a/b", LONGEST_NAMESPACE + "n"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MCRUNTIME_"):
            monkeypatch.delenv(name)


# --- at load: the settings, the flags, the constructor ----------------------------------------


def test_the_longest_names_a_lease_may_have_are_accepted() -> None:
    assert len(LONGEST_NAME) == 253
    settings = mcr.ManagerSettings.load(
        leader_election=True, leader_election_id=LONGEST_NAME, leader_election_namespace=LONGEST_NAMESPACE
    )
    config = settings.leader_election_config()
    assert config is not None
    assert (config.name, config.namespace) == (LONGEST_NAME, LONGEST_NAMESPACE)
    for name in ("mcruntime-leader", "my-operator.example.com", "0leader9"):
        assert mcr.LeaderElectionConfig(name=name, namespace="kube-system").name == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_leader_election_id_that_is_no_lease_name_is_refused_at_load_naming_the_variable(name: str) -> None:
    with pytest.raises(mcr.SettingsError) as refused:
        mcr.ManagerSettings.load(leader_election=True, leader_election_id=name)
    message = str(refused.value)
    assert f"MCRUNTIME_LEADER_ELECTION_ID={name!r}: " in message, message
    assert "the Lease's name is not a DNS subdomain" in message, message


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_a_leader_election_namespace_that_is_no_dns_label_is_refused_at_load_naming_the_variable(
    namespace: str,
) -> None:
    with pytest.raises(mcr.SettingsError) as refused:
        mcr.ManagerSettings.load(leader_election=True, leader_election_namespace=namespace)
    message = str(refused.value)
    assert f"MCRUNTIME_LEADER_ELECTION_NAMESPACE={namespace!r}: " in message, message
    assert "the Lease's namespace is not a DNS label" in message, message


def test_the_variables_from_the_environment_are_named_with_what_they_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION", "true")
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION_ID", "MyOperator")
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION_NAMESPACE", "..")
    with pytest.raises(mcr.SettingsError) as refused:
        mcr.ManagerSettings.load()
    message = str(refused.value)
    assert "MCRUNTIME_LEADER_ELECTION_ID='MyOperator': " in message, message
    assert "MCRUNTIME_LEADER_ELECTION_NAMESPACE='..': " in message, message


def test_the_names_are_not_checked_while_leader_election_is_off() -> None:
    # Unused, as the shard group is without sharding: a Deployment that sets the id and
    # leaves leader election off runs as it did.
    settings = mcr.ManagerSettings.load(leader_election_id="MyOperator", leader_election_namespace="..")
    assert settings.leader_election_config() is None


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--leader-election-id", "MyOperator"], "--leader-election-id 'MyOperator': "),
        (["--leader-election-id", "a/b"], "--leader-election-id 'a/b': "),
        (["--leader-election-namespace", ".."], "--leader-election-namespace '..': "),
        (["--leader-election-namespace="], "--leader-election-namespace '': "),
    ],
)
@pytest.mark.parametrize("check", [True, False], ids=["--check", "run"])
def test_mcruntime_run_refuses_the_flag_before_importing_the_target(
    flags: list[str], named: str, check: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    # The target does not exist: the settings are refused before it is imported.
    argv = ["run", "no_such_module_anywhere:build", "--leader-election", *flags]
    assert main([*argv, "--check"] if check else argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mcruntime run: error: invalid settings: {named}"), err
    assert "is not a DNS" in err, err


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_a_shard_namespace_that_is_no_dns_label_is_refused_by_the_settings_the_flag_and_the_config(
    namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Found by a review: the shard Leases' namespace was not checked, so replicas campaigned
    # forever for Leases the API server refused.
    with pytest.raises(mcr.SettingsError) as refused:
        mcr.ManagerSettings.load(sharding=True, shard_namespace=namespace)
    message = str(refused.value)
    assert (
        f"MCRUNTIME_SHARD_NAMESPACE={namespace!r}: the shard Leases' namespace is not a DNS label" in message
    )
    argv = ["run", "no_such_module_anywhere:build", "--sharding", f"--shard-namespace={namespace}", "--check"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mcruntime run: error: invalid settings: --shard-namespace {namespace!r}: "), err
    with pytest.raises(
        ValueError, match=re.escape(f"sharding namespace {namespace!r}: the Leases' namespace")
    ):
        mcr.ShardingConfig(namespace=namespace)


def test_the_shard_namespace_is_not_checked_while_sharding_is_off() -> None:
    assert mcr.ManagerSettings.load(shard_namespace="..").sharded_coordinator() is None
    assert mcr.ShardingConfig(namespace=LONGEST_NAMESPACE).namespace == LONGEST_NAMESPACE


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_config_built_in_code_refuses_a_name_naming_the_parameter(name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"LeaderElectionConfig name={name!r}: the Lease's name")):
        mcr.LeaderElectionConfig(name=name)


@pytest.mark.parametrize("namespace", BAD_NAMESPACES)
def test_a_config_built_in_code_refuses_a_namespace_naming_the_parameter(namespace: str) -> None:
    with pytest.raises(
        ValueError, match=re.escape(f"LeaderElectionConfig namespace={namespace!r}: the Lease's namespace")
    ):
        mcr.LeaderElectionConfig(name="leader", namespace=namespace)


def test_a_config_copied_with_a_bad_name_is_refused_too() -> None:
    config = mcr.LeaderElectionConfig(name="leader")
    with pytest.raises(ValueError, match="LeaderElectionConfig name='Leader'"):
        dataclasses.replace(config, name="Leader")
    with pytest.raises(
        ValueError, match="LeaderElectionConfig namespace=None: the Lease's namespace must be"
    ):
        mcr.LeaderElectionConfig(name="leader", namespace=None)  # type: ignore[arg-type]


# --- at run time, against a hub that answers as told -----------------------------------------

QUICK: Any = {"lease_duration": 0.3, "renew_deadline": 0.2, "retry_period": 0.01}


class _Answers:
    """A hub whose every Lease read fails with the next of ``statuses`` (the last one repeats)."""

    def __init__(self, *statuses: tuple[int, str, str]) -> None:
        self.statuses = list(statuses)
        self.calls = 0
        self.client = self

    async def get(self, _kind: mcr.Kind, name: str, *, namespace: str | None = None) -> Any:
        status, reason, message = self.statuses[min(self.calls, len(self.statuses) - 1)]
        self.calls += 1
        body = {"kind": "Status", "reason": reason, "message": message}
        raise error_from_status(status, body, cluster="hub", kind="Lease", namespace=namespace, name=name)


@asynccontextmanager
async def _campaigning(elector: LeaderElector, hub: _Answers) -> AsyncIterator[None]:
    task = asyncio.create_task(elector.run(hub))  # type: ignore[arg-type]  # the campaign reads .client only
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize(
    ("status", "reason"), [(422, "Invalid"), (400, "BadRequest"), (401, "Unauthorized"), (418, "")]
)
async def test_a_4xx_at_every_attempt_is_named_once_at_warning_and_by_problem(
    status: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOG)
    elector = LeaderElector(mcr.LeaderElectionConfig(name="leader", namespace="ns", **QUICK))
    hub = _Answers((status, reason, "refused by the test"))
    async with _campaigning(elector, hub):
        await wait_until(lambda: hub.calls >= 5, what="five refused attempts")
        problem = elector.problem()
        assert problem is not None
        assert problem.startswith("leader election ns/leader: the hub refuses the Lease: "), problem
        assert f"{status} {reason}".strip() in problem and "refused by the test" in problem, problem
        assert len(_warnings(caplog, "refused by the test")) == 1, _warnings(caplog, "refused by the test")
        assert not elector.leading.is_set()


async def test_another_refusal_is_logged_again_and_passing_errors_are_no_trouble(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOG)
    elector = LeaderElector(mcr.LeaderElectionConfig(name="leader", namespace="ns", **QUICK))
    hub = _Answers(
        (500, "InternalError", "a passing 500"),
        (429, "TooManyRequests", "throttled"),
        (409, "Conflict", "raced"),
        (422, "Invalid", "first refusal"),
        (422, "Invalid", "first refusal"),
        (400, "BadRequest", "second refusal"),
    )
    async with _campaigning(elector, hub):
        await wait_until(lambda: hub.calls >= 3, what="the passing errors")
        for passing in ("a passing 500", "throttled", "raced"):
            assert not _warnings(caplog, passing), passing
        await wait_until(lambda: hub.calls >= 8, what="both refusals, the second repeated")
        assert len(_warnings(caplog, "first refusal")) == 1
        assert len(_warnings(caplog, "second refusal")) == 1
        assert "second refusal" in (elector.problem() or "")


async def test_a_5xx_that_outlasts_a_lease_is_named_once_at_warning_and_by_problem(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Found by a review: a 500 at every attempt (a broken admission webhook on Leases) was
    # logged at DEBUG only, and the standby that would never lead said ready forever.
    caplog.set_level(logging.DEBUG, LOG)
    elector = LeaderElector(mcr.LeaderElectionConfig(name="leader", namespace="ns", **QUICK))
    hub = _Answers((500, "InternalError", "failed calling webhook"))
    async with _campaigning(elector, hub):
        await wait_until(lambda: elector.problem() is not None, what="the lasting 500 named")
        calls = hub.calls
        assert calls > 2, calls  # the first attempts were passing: none of them was named
        await wait_until(lambda: hub.calls >= calls + 5, what="five more attempts")
        problem = elector.problem()
        assert problem is not None
        assert problem.startswith(
            "leader election ns/leader: every attempt for over 0.3s failed; the last: "
        ), problem
        assert "500 InternalError" in problem and "failed calling webhook" in problem, problem
        assert len(_warnings(caplog, "failed calling webhook")) == 1, _warnings(
            caplog, "failed calling webhook"
        )
        assert not elector.leading.is_set()


# --- against a real API server -----------------------------------------------------------------


async def _refusals(plane: ControlPlane, policy: str) -> float:
    """How many requests the API server denied by ``policy``, from its own /metrics."""
    connector = aiohttp.TCPConnector(ssl=plane.admin_ssl_context())
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(plane.server + "/metrics") as response,
    ):
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if (
            line.startswith("apiserver_validating_admission_policy_check_total{")
            and f'policy="{policy}"' in line
            and 'enforcement_action="deny"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _refusals_since(plane: ControlPlane, policy: str, before: float, more: int) -> bool:
    return await _refusals(plane, policy) >= before + more


def _policy(name: str, lease: str) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy that refuses creating or updating the Lease ``lease`` with a 422."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["leases"],
                    }
                ]
            },
            "validations": [
                {
                    "expression": f"object.metadata.name != '{lease}'",
                    "reason": "Invalid",
                    "message": f"the test's admission policy refuses the Lease {lease}",
                }
            ],
        },
    }


def _binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }


async def _refused_with(admin: mcr.Cluster, lease: str, namespace: str, status: int) -> bool:
    """Whether creating the Lease is refused with ``status`` yet (a new admission rule loads shortly after)."""
    probe = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": lease, "namespace": namespace},
    }
    try:
        await admin.client.create(probe)
    except mcr.APIError as error:
        return error.status == status
    await admin.client.delete(LEASE, lease, namespace=namespace)
    return False


@asynccontextmanager
async def _campaign_in_trouble(
    plane: ControlPlane, namespace: str, lease: str, identity: str
) -> AsyncIterator[tuple[mcr.Manager, LeaderElector, str]]:
    """A replica campaigning for ``lease`` on ``plane``, once ``/readyz`` names its trouble: its line."""
    election = mcr.LeaderElectionConfig(name=lease, namespace=namespace, identity=identity, **FAST)
    manager = mcr.Manager(
        local=admin_config(plane),
        leader_election=election,
        health_probe_address="127.0.0.1:0",
        handle_signals=False,
    )
    elector = manager.elector
    assert elector is not None
    async with running(manager):

        async def named() -> bool:
            _status, body = await readyz(manager)
            return "[-]coordination failed: " in body

        await wait_until(named, what="the coordination line failing")
        status, body = await readyz(manager)
        assert status != 200, body
        assert not elector.leading.is_set()
        yield manager, elector, next(line for line in body.splitlines() if line.startswith("[-]coordination"))


async def _leads_and_is_ready(manager: mcr.Manager, elector: LeaderElector, why: str) -> None:
    await wait_until(elector.leading.is_set, what=f"leading once {why}")

    async def ready() -> bool:
        status, _body = await readyz(manager)
        return status == 200

    await wait_until(ready, what="/readyz passing once the Lease is taken")


async def test_a_lease_the_api_server_refuses_fails_readyz_and_is_named_once_at_warning(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A 422 from the API server (an admission policy: the name checks cannot be bypassed) is trouble."""
    caplog.set_level(logging.INFO, "mcruntime")
    plane = fleet["cluster-1"]
    namespace, lease, policy = unique("le-refused"), unique("lease"), unique("refuse-lease")
    async with mcr.Cluster("admin", admin_config(plane)) as admin:
        await admin.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        try:
            await admin.client.create(_policy(policy, lease))
            await admin.client.create(_binding(policy, namespace))
            await wait_until(
                lambda: _refused_with(admin, lease, namespace, 422), what="the admission policy in force"
            )
            async with _campaign_in_trouble(plane, namespace, lease, "refused") as (manager, elector, line):
                refused_before = await _refusals(plane, policy)
                assert f"leader election {namespace}/{lease}: the hub refuses the Lease: " in line, line
                assert "422 Invalid" in line and "the test's admission policy refuses" in line, line
                # Several refused attempts later, still one warning for the one error.
                await wait_until(
                    lambda: _refusals_since(plane, policy, refused_before, 3),
                    what="three more attempts refused by the API server",
                )
                warnings = _warnings(caplog, f"{namespace}/{lease}")
                assert len(warnings) == 1, warnings
                assert "cannot campaign: the hub refuses the Lease" in warnings[0], warnings[0]
                assert "422 Invalid" in warnings[0], warnings[0]

                # The hub takes the Lease again: the replica leads, and /readyz passes.
                await admin.client.delete(BINDING, policy)
                await _leads_and_is_ready(manager, elector, "the policy is unbound")
                assert any(
                    "campaigning again" in r.getMessage() and lease in r.getMessage() for r in caplog.records
                )
                assert len(_warnings(caplog, "refuses the Lease")) == 1
        finally:
            for kind, name in ((BINDING, policy), (POLICY, policy)):
                with suppress(mcr.NotFound):
                    await admin.client.delete(kind, name)
            with suppress(mcr.NotFound):
                await admin.client.delete(NAMESPACE, namespace)


def _unreachable_webhook(name: str, namespace: str) -> dict[str, Any]:
    """A webhook on Leases in ``namespace`` that nobody serves, failing closed: the API server answers 500."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"{name}.mcruntime.test",
                "clientConfig": {"url": "https://127.0.0.1:1/validate"},  # loopback, nothing listens
                "rules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["leases"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 1,
            }
        ],
    }


async def test_a_broken_webhook_on_leases_fails_readyz_once_it_outlasts_a_lease_and_recovers(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """The API server's own 500 ("failed calling webhook") at every attempt: named, not passing forever."""
    caplog.set_level(logging.INFO, "mcruntime")
    plane = fleet["cluster-1"]
    namespace, lease, hook = unique("le-broken"), unique("lease"), unique("broken-hook")
    async with mcr.Cluster("admin", admin_config(plane)) as admin:
        await admin.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        try:
            await admin.client.create(_unreachable_webhook(hook, namespace))
            await wait_until(
                lambda: _refused_with(admin, lease, namespace, 500), what="the broken webhook in force"
            )
            async with _campaign_in_trouble(plane, namespace, lease, "blocked") as (manager, elector, line):
                assert f"leader election {namespace}/{lease}: every attempt for over 3s failed" in line, line
                assert "failed calling webhook" in line, line
                warnings = _warnings(caplog, f"{namespace}/{lease}")
                assert len(warnings) == 1 and "cannot campaign: every attempt" in warnings[0], warnings

                await admin.client.delete(WEBHOOKS, hook)
                await _leads_and_is_ready(manager, elector, "the webhook is gone")
                assert len(_warnings(caplog, "cannot campaign")) == 1
        finally:
            with suppress(mcr.NotFound):
                await admin.client.delete(WEBHOOKS, hook)
            with suppress(mcr.NotFound):
                await admin.client.delete(NAMESPACE, namespace)
