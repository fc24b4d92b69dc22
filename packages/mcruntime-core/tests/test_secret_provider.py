"""KubeconfigSecretProvider: the conformance suite, its own edges, and the guide that quotes it.

The hub is the session fleet's ``cluster-1``; each test writes its Secrets into
a namespace of its own there, pointing at the fleet's clusters.
"""

from __future__ import annotations

import base64
import logging
import re
import textwrap
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from kube_helpers import CONFIGMAP, CREDENTIAL_SHAPES, configmap, quotes_token, readyz, spoiled, unique

import mcruntime as mcr
from mcruntime._fleet.secret_provider import KubeconfigSecretProvider
from mcruntime.provider import SourceStatus
from mcruntime.testing import ControlPlane, Fleet, admin_config, wait_until
from mcruntime.testing._harness import EngagementRecorder, running
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    ProviderConformance,
    ProviderDriver,
    Target,
)

SECRET = mcr.Kind("v1", "Secret")
LABEL = {"mcruntime.dev/kubeconfig": "true"}


def secret_manifest(
    name: str, namespace: str, kubeconfig: Any, *, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A labelled kubeconfig Secret; ``kubeconfig`` is a dict, or raw text written as is."""
    text = kubeconfig if isinstance(kubeconfig, str) else yaml.safe_dump(kubeconfig)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(LABEL),
            "annotations": dict(annotations or {}),
        },
        "type": "Opaque",
        "data": {"kubeconfig": base64.b64encode(text.encode()).decode()},
    }


# --8<-- [start:driver]
NAME_ANNOTATION = "conformance.mcruntime.dev/cluster-name"


def annotated_name(secret: Mapping[str, Any]) -> str | None:
    """The cluster name from an annotation, else the Secret's name: lets two Secrets collide."""
    metadata = secret.get("metadata") or {}
    return (metadata.get("annotations") or {}).get(NAME_ANNOTATION) or metadata.get("name")


class SecretDriver(ProviderDriver):
    """The source is a namespace of the hub; each cluster is one Secret written there."""

    def __init__(self, hub: ControlPlane, writer: mcr.Cluster, namespace: str) -> None:
        self.hub, self.writer, self.namespace = hub, writer, namespace
        self.provider: KubeconfigSecretProvider | None = None
        self.written: dict[str, str | None] = {}  # Secret -> resourceVersion (None: deleted)
        self.touches = 0

    def build(self) -> mcr.Provider:
        self.provider = KubeconfigSecretProvider(
            admin_config(self.hub),
            self.namespace,
            name_from=annotated_name,
            options=CLUSTER_OPTIONS,
            probe_interval=PROBE_INTERVAL,
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def _write(self, secret: str, target: Target, annotations: dict[str, str]) -> None:
        manifest = secret_manifest(secret, self.namespace, target.kubeconfig(), annotations=annotations)
        applied = await self.writer.client.apply(manifest, field_manager="conformance", force=True)
        self.written[secret] = applied["metadata"]["resourceVersion"]

    async def add(self, name: str, target: Target) -> None:
        await self._write(name, target, {})

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1  # new metadata, same kubeconfig
        await self._write(name, target, {"conformance.mcruntime.dev/touched": str(self.touches)})

    async def corrupt(self, name: str) -> None:
        manifest = secret_manifest(name, self.namespace, "clusters: [unclosed\n")  # a bad edit: no YAML
        applied = await self.writer.client.apply(manifest, field_manager="conformance", force=True)
        self.written[name] = applied["metadata"]["resourceVersion"]

    async def remove(self, name: str) -> None:
        await self.writer.client.delete(SECRET, name, namespace=self.namespace)
        self.written[name] = None

    async def add_duplicate(self, name: str, target: Target) -> None:
        await self._write(f"{name}-duplicate", target, {NAME_ANNOTATION: name})

    def duplicate_reported(self, name: str) -> bool:
        assert self.provider is not None
        sources = self.provider.sources().values()
        return any(source.cluster == name and "duplicate_of" in source.detail for source in sources)

    async def settle(self) -> None:
        provider = self.provider
        assert provider is not None

        def caught_up() -> bool:
            seen = provider.sources()
            for secret, version in self.written.items():
                key = f"{self.namespace}/{secret}"
                if (seen[key].version if key in seen else None) != version:
                    return False
            return True

        await wait_until(caught_up, what="the provider processed every Secret written")


class TestKubeconfigSecretProvider(ProviderConformance):
    @pytest_asyncio.fixture
    async def driver(self, fleet: Fleet) -> AsyncIterator[ProviderDriver]:
        hub = fleet["cluster-1"]
        async with mcr.Cluster("secret-writer", admin_config(hub)) as writer:
            namespace = unique("kubeconfigs")
            await writer.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            yield SecretDriver(hub, writer, namespace)


# --8<-- [end:driver]


# --- the provider's own edges ------------------------------------------------------------


class Hub:
    """A namespace of the hub to write Secrets into, and a provider over it."""

    def __init__(self, plane: ControlPlane, writer: mcr.Cluster, namespace: str) -> None:
        self.plane, self.writer, self.namespace = plane, writer, namespace

    async def write(self, name: str, kubeconfig: Any, **annotations: str) -> str:
        manifest = secret_manifest(name, self.namespace, kubeconfig, annotations=annotations)
        applied = await self.writer.client.apply(manifest, field_manager="test", force=True)
        return str(applied["metadata"]["resourceVersion"])

    def provider(self, **kwargs: Any) -> KubeconfigSecretProvider:
        kwargs.setdefault("options", CLUSTER_OPTIONS)
        kwargs.setdefault("probe_interval", PROBE_INTERVAL)
        return KubeconfigSecretProvider(admin_config(self.plane), self.namespace, **kwargs)

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"


@pytest.fixture
async def hub(fleet: Fleet) -> AsyncIterator[Hub]:
    plane = fleet["cluster-1"]
    async with mcr.Cluster("hub-writer", admin_config(plane)) as writer:
        namespace = unique("hub")
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield Hub(plane, writer, namespace)


def manager_for(provider: mcr.Provider) -> tuple[mcr.Manager, EngagementRecorder]:
    manager = mcr.Manager(provider, handle_signals=False)
    recorder = EngagementRecorder()
    manager.add(recorder)
    return manager, recorder


async def processed(provider: KubeconfigSecretProvider, key: str, resource_version: str) -> SourceStatus:
    def caught_up() -> bool:
        status = provider.sources().get(key)
        return status is not None and status.version == resource_version

    await wait_until(caught_up)
    return provider.sources()[key]


async def test_an_unusable_secret_is_reported_by_name_and_quotes_nothing(
    hub: Hub, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mcruntime.providers.secrets")
    plane = fleet["cluster-2"]
    token = plane.token_user.token
    assert token is not None
    leaky = f"clusters: [\n  token: {token}\n"  # not YAML, and it holds a credential
    broken_rv = await hub.write("broken", leaky)
    no_key = secret_manifest("no-key", hub.namespace, {})
    no_key["data"] = {"other": base64.b64encode(token.encode()).decode()}
    no_key_rv = (await hub.writer.client.apply(no_key, field_manager="test"))["metadata"]["resourceVersion"]
    await hub.write("good", Target.of(plane).kubeconfig())
    provider = hub.provider()
    manager = mcr.Manager(provider, handle_signals=False, health_probe_address="127.0.0.1:0")
    recorder = EngagementRecorder()
    manager.add(recorder)
    async with running(manager, recorder):
        await wait_until(lambda: "good" in manager.clusters())
        broken = await processed(provider, hub.key("broken"), broken_rv)
        missing = await processed(provider, hub.key("no-key"), no_key_rv)
        assert not broken.engaged and broken.cluster == "broken"
        assert broken.error == f"Secret {hub.key('broken')} key 'kubeconfig': not valid YAML at line 3"
        assert missing.error == f"Secret {hub.key('no-key')}: has no data key 'kubeconfig'"
        assert set(provider.clusters.names()) == {"good"}  # nothing to keep: never engaged
        for name in ("broken", "no-key"):
            with pytest.raises(mcr.ClusterNotFound):
                await provider.get(name)
        # One status shape: the broken Secret's cluster is FAILED and carries its Secret; the
        # good one carries its own; a kept snapshot does not change under the caller.
        statuses = provider.statuses()
        failed = statuses["broken"]
        assert failed.phase is mcr.ClusterPhase.FAILED and failed.engagements == 0
        assert failed.source == broken and failed.error == broken.error
        await wait_until(lambda: provider.statuses()["good"].phase is mcr.ClusterPhase.READY)
        good = provider.statuses()["good"].source
        assert good is not None and good.kind == "Secret" and good.name == hub.key("good") and good.engaged
        with pytest.raises(TypeError):
            good.detail["duplicate_of"] = "x"  # type: ignore[index]
        assert statuses["broken"].since == provider.statuses()["broken"].since  # first seen, kept
        url = manager.endpoints.url("/readyz") + "?verbose"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            readyz = await response.text()
        # Shown, so an operator sees it, but not counted: nothing was engaged to be ready.
        assert f"[-]cluster:broken failed: never engaged: {broken.error}" in readyz, readyz
        logged = caplog.text
        assert hub.key("broken") in logged and hub.key("no-key") in logged
        exposed = logged + repr(provider) + repr(provider.sources()) + repr(provider.statuses())
        leaked = token in exposed
        assert not leaked, "a token reached a log, a status or a repr"


async def test_a_broken_update_keeps_the_last_good_kubeconfig(hub: Hub, fleet: Fleet) -> None:
    first, second = fleet["cluster-2"], fleet["cluster-3"]
    namespace = unique("lastgood")
    async with mcr.Cluster("seed", admin_config(first)) as seed:
        await seed.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await seed.client.create(configmap("before", namespace, v="1"))
    await hub.write("alpha", Target.of(first).kubeconfig())
    provider = hub.provider()
    manager, recorder = manager_for(provider)
    seen: set[str] = set()

    async def reconcile(request: mcr.Request) -> None:
        seen.add(request.name)

    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=[mcr.in_namespaces(namespace)]).complete(
        reconcile
    )
    async with running(manager, recorder):
        await wait_until(lambda: "before" in seen)
        engaged = manager.clusters()["alpha"]
        bad_rv = await hub.write("alpha", "users: [unclosed\n")
        status = await processed(provider, hub.key("alpha"), bad_rv)
        assert status.stale and status.engaged and status.cluster == "alpha"
        assert status.error is not None and "not valid YAML" in status.error
        assert manager.clusters()["alpha"] is engaged and not engaged.stopped  # unavailable is not gone
        async with mcr.Cluster("seed", admin_config(first)) as seed:
            await seed.client.create(configmap("during", namespace, v="1"))
        await wait_until(lambda: "during" in seen)

        refused = Target.of(second).kubeconfig()
        refused["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
        refused_rv = await hub.write("alpha", refused)
        status = await processed(provider, hub.key("alpha"), refused_rv)
        assert status.stale and status.error is not None and "trust policy refuses" in status.error
        assert manager.clusters()["alpha"] is engaged

        fixed_rv = await hub.write("alpha", Target.of(second).kubeconfig())
        status = await processed(provider, hub.key("alpha"), fixed_rv)
        assert not status.stale and status.error is None and status.engaged
        await wait_until(lambda: manager.clusters()["alpha"].config.server == second.server)
        assert engaged.transport.closed and len(engaged.tasks) == 0 and recorder.count("alpha") == 2


async def test_an_oversized_kubeconfig_is_refused_unparsed_and_the_last_good_one_kept(
    hub: Hub, fleet: Fleet
) -> None:
    plane = fleet["cluster-2"]
    good = yaml.safe_dump(Target.of(plane).kubeconfig())
    await hub.write("big", good)
    provider = hub.provider(max_kubeconfig_bytes=len(good) + 100)
    manager, recorder = manager_for(provider)
    async with running(manager, recorder):
        await wait_until(lambda: "big" in manager.clusters())
        engaged = manager.clusters()["big"]
        padded_rv = await hub.write("big", good + "# padding\n" * 200)  # the same kubeconfig, 2 KB larger
        status = await processed(provider, hub.key("big"), padded_rv)
        assert status.error == (
            f"Secret {hub.key('big')} key 'kubeconfig' is larger than the limit of "
            f"{len(good) + 100} bytes; not parsed"
        )
        assert status.stale and status.engaged
        assert manager.clusters()["big"] is engaged and recorder.count("big") == 1


async def test_deleting_deleting_and_unlabelled_secrets_disengage(hub: Hub, fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    for name in ("deleted", "finalized", "unlabelled", "kept"):
        await hub.write(name, Target.of(plane).kubeconfig())
    provider = hub.provider()
    manager, recorder = manager_for(provider)
    async with running(manager, recorder):
        await wait_until(lambda: set(manager.clusters()) == {"deleted", "finalized", "unlabelled", "kept"})
        clusters = dict(manager.clusters())
        await hub.writer.client.delete(SECRET, "deleted", namespace=hub.namespace)
        await hub.writer.client.patch(
            SECRET,
            "finalized",
            {"metadata": {"finalizers": ["test.mcruntime.dev/hold"]}},
            namespace=hub.namespace,
        )
        await hub.writer.client.delete(SECRET, "finalized", namespace=hub.namespace)
        await hub.writer.client.patch(
            SECRET,
            "unlabelled",
            {"metadata": {"labels": {"mcruntime.dev/kubeconfig": None}}},
            namespace=hub.namespace,
        )
        await wait_until(lambda: set(manager.clusters()) == {"kept"})
        assert all(clusters[name].stopped for name in ("deleted", "finalized", "unlabelled"))
        still_there = await hub.writer.client.get(SECRET, "finalized", namespace=hub.namespace)
        assert still_there["metadata"].get("deletionTimestamp")  # gone by intent, though not yet deleted
        assert manager.clusters()["kept"] is clusters["kept"]
        await hub.writer.client.patch(
            SECRET, "finalized", {"metadata": {"finalizers": None}}, namespace=hub.namespace
        )


async def test_when_the_holder_of_a_name_goes_the_duplicate_takes_over(hub: Hub, fleet: Fleet) -> None:
    first, second = fleet["cluster-2"], fleet["cluster-3"]
    await hub.write("original", Target.of(first).kubeconfig(), **{NAME_ANNOTATION: "shared"})
    provider = hub.provider(name_from=annotated_name)
    manager, recorder = manager_for(provider)
    async with running(manager, recorder):
        await wait_until(lambda: "shared" in manager.clusters())
        copy_rv = await hub.write("copy", Target.of(second).kubeconfig(), **{NAME_ANNOTATION: "shared"})
        copy = await processed(provider, hub.key("copy"), copy_rv)
        assert copy.detail.get("duplicate_of") == hub.key("original") and not copy.engaged
        assert copy.error == (
            f"Secret {hub.key('copy')}: cluster name 'shared' is already provided by Secret {hub.key('original')}"
        )
        assert manager.clusters()["shared"].config.server == first.server
        await hub.writer.client.delete(SECRET, "original", namespace=hub.namespace)
        await wait_until(
            lambda: (
                manager.clusters().get("shared") is not None
                and manager.clusters()["shared"].config.server == second.server
            )
        )
        await wait_until(lambda: provider.sources().get(hub.key("copy"), copy).engaged)
        assert "duplicate_of" not in provider.sources()[hub.key("copy")].detail
        assert recorder.count("shared") == 2


async def test_an_opted_in_trust_policy_allows_what_untrusted_refuses(hub: Hub, fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    insecure = Target.of(plane).kubeconfig()
    cluster_entry = insecure["clusters"][0]["cluster"]
    del cluster_entry["certificate-authority-data"]
    cluster_entry["insecure-skip-tls-verify"] = True
    await hub.write("insecure", insecure)
    provider = hub.provider(trust=mcr.TrustPolicy(allow_insecure=True))
    manager, recorder = manager_for(provider)
    async with running(manager, recorder):
        await wait_until(lambda: "insecure" in manager.clusters())
        await wait_until(lambda: provider.statuses()["insecure"].phase is mcr.ClusterPhase.READY)


async def test_a_hub_cluster_passed_in_is_used_and_left_running(hub: Hub, fleet: Fleet) -> None:
    await hub.write("alpha", Target.of(fleet["cluster-2"]).kubeconfig())
    async with mcr.Cluster("my-hub", admin_config(hub.plane)) as mine:
        provider = KubeconfigSecretProvider(mine, hub.namespace, options=CLUSTER_OPTIONS)
        manager, recorder = manager_for(provider)
        async with running(manager, recorder):
            await wait_until(lambda: "alpha" in manager.clusters())
        assert not mine.stopped and not mine.transport.closed
        await mine.client.get(SECRET, "alpha", namespace=hub.namespace)  # still usable


def test_a_provider_needs_a_namespace(fleet: Fleet) -> None:
    with pytest.raises(ValueError, match="one namespace"):
        KubeconfigSecretProvider(admin_config(fleet["cluster-1"]), "")


# --- the guide ---------------------------------------------------------------------------

CORE = Path(__file__).resolve().parent.parent
GUIDE = CORE.parent.parent / "docs" / "guides" / "writing-a-provider.md"
_INCLUDE = re.compile(
    r"(?P<off><!-- fmt: off -->\n)?<!-- include: (?P<path>\S+)#(?P<region>[\w-]+) -->\n```python\n(?P<body>.*?)```",
    re.S,
)
_REGION = r"[ \t]*# --8<-- \[start:{0}\]\n(?P<body>.*?)[ \t]*# --8<-- \[end:{0}\]\n"


def _region(path: Path, region: str) -> str:
    found = re.search(_REGION.format(re.escape(region)), path.read_text(), re.S)
    assert found is not None, f"{path.name} has no region {region!r}"
    return textwrap.dedent(found["body"]).strip("\n") + "\n"


def test_guide_example_is_the_tested_code() -> None:
    """Every ``include`` code block of the guide is its source region, character for character.

    Regions are compared after removing their common indentation (methods are
    quoted without their class's indent), which is also why each quoted block
    sits under ``<!-- fmt: off -->``: ruff formats Python blocks in Markdown.
    To refresh the guide after changing the source, copy the region over the
    block below its include marker.
    """
    guide = GUIDE.read_text()
    blocks = list(_INCLUDE.finditer(guide))
    assert len(blocks) >= 6, "the guide's worked example is quoted from the source"
    unfenced = [f"{block['path']}#{block['region']}" for block in blocks if not block["off"]]
    assert unfenced == [], "quoted blocks need <!-- fmt: off --> before their include marker"
    mismatched = [
        f"{block['path']}#{block['region']}"
        for block in blocks
        if block["body"] != _region(CORE / block["path"], block["region"])
    ]
    assert mismatched == [], "guide blocks differ from the source; copy the regions over them"
    provider = "src/mcruntime/_fleet/secret_provider.py"
    regions = set(re.findall(r"# --8<-- \[start:([\w-]+)\]", (CORE / provider).read_text()))
    quoted = {block["region"] for block in blocks if block["path"] == provider}
    assert regions == quoted, "every marked region of the provider is in the guide"


@pytest.mark.parametrize("shape", sorted(CREDENTIAL_SHAPES))
async def test_a_token_that_cannot_be_sent_is_refused_naming_the_secret(
    hub: Hub, fleet: Fleet, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plane = fleet["cluster-2"]
    token = plane.token_user.token
    kubeconfig = plane.kubeconfig(plane.token_user)
    kubeconfig["users"][0]["user"]["token"] = spoiled(token, shape)
    version = await hub.write("shaped", kubeconfig)
    provider = hub.provider()
    manager, recorder = manager_for(provider)
    async with running(manager, recorder):
        source = await processed(provider, hub.key("shaped"), version)
        assert source.error is not None and source.error.startswith(f"Secret {hub.key('shaped')}")
        assert CREDENTIAL_SHAPES[shape][1] in source.error
        assert provider.statuses()["shaped"].phase is mcr.ClusterPhase.FAILED
        exposed = caplog.text + repr(provider.sources()) + repr(provider.statuses())
        assert not quotes_token(exposed, token)


async def test_a_hub_that_refuses_the_secrets_fails_readyz_while_nothing_is_engaged_and_is_shown_after(
    hub: Hub, fleet: Fleet
) -> None:
    await hub.write("member", Target.of(fleet["cluster-2"]).kubeconfig())
    account = unique("refused")
    user = hub.plane.add_token_user(account, cluster_admin=False)
    config = mcr.kubeconfig_from_dict(hub.plane.kubeconfig(user), origin="refused hub")
    provider = KubeconfigSecretProvider(
        config, hub.namespace, options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
    )
    manager = mcr.Manager(provider, handle_signals=False, health_probe_address="127.0.0.1:0")
    recorder = EngagementRecorder()
    manager.add(recorder)
    name = f"hub:{provider.owner}"
    rules = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "secrets", "namespace": hub.namespace},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "secrets", "namespace": hub.namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secrets"},
        "subjects": [{"kind": "User", "name": user.name}],
    }
    try:
        async with running(manager, recorder):
            # Refused from the start: nothing engaged, so the hub's line counts.
            await wait_until(lambda: name in provider.statuses(), what="the refused hub reported")
            status = provider.statuses()[name]
            assert status.phase is mcr.ClusterPhase.UNHEALTHY and status.missing_permissions, status
            code, body = await readyz(manager)
            assert code == 500, body
            assert f"[-]cluster:{name} failed: not engaged: the hub cannot be read: forbidden by RBAC" in body
            assert "cannot list Secret (secrets)" in body, body
            await hub.writer.client.create(role)
            await hub.writer.client.create(binding)
            await wait_until(lambda: "member" in manager.clusters(), timeout=60, what="the member engaged")
            await wait_until(lambda: name not in provider.statuses(), timeout=30, what="the hub line gone")
            # Refused again with a member engaged: shown, not counted (the member works on).
            await hub.writer.client.delete(
                mcr.Kind("rbac.authorization.k8s.io/v1", "RoleBinding"), "secrets", namespace=hub.namespace
            )
            hub.plane.revoke_token_user(account)  # and the identity gone: 401 at the next look
            account = ""
            await wait_until(lambda: name in provider.statuses(), timeout=60, what="the hub reported again")
            assert provider.statuses()[name].phase is mcr.ClusterPhase.FAILED
            assert "member" in manager.clusters()
            code, body = await readyz(manager)
            assert f"[-]cluster:{name} failed: never engaged: the hub cannot be read: " in body, body
    finally:
        if account:
            hub.plane.revoke_token_user(account)
