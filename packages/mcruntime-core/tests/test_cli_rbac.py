"""``mcruntime rbac``: the RBAC of a target's manager, printed without starting or connecting anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from test_cli_run import mcruntime

FACTORY = """
import mcruntime as mcr

WIDGET = mcr.Kind("example.com/v1", "Widget")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")


def factory(settings: mcr.ManagerSettings) -> mcr.Manager:
    manager = mcr.Manager.from_settings(mcr.StaticProvider({}), local=mcr.load_kubeconfig_env(), settings=settings)

    async def reconcile(request: mcr.Request) -> None:
        return None

    (
        mcr.controller_managed_by(manager)
        .for_(WIDGET, clusters=mcr.LOCAL_ONLY)
        .owns(CONFIGMAP, clusters=mcr.PROVIDER_ONLY)
        .complete(reconcile)
    )
    return manager
"""

UNREACHABLE = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "never-sent"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


def _environment(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "widgets.py").write_text(FACTORY)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(UNREACHABLE))
    kubeconfig.chmod(0o600)
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env["KUBECONFIG"] = str(kubeconfig)
    return env


def _rules(documents: list[dict[str, object]], kind: str, name: str) -> list[object]:
    [found] = [doc for doc in documents if doc["kind"] == kind and doc["metadata"]["name"] == name]  # type: ignore[index]
    rules = found["rules"]
    assert isinstance(rules, list)
    return rules


async def test_rbac_prints_both_roles_with_the_leases_a_flag_asks_for(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    target = f"{tmp_path / 'widgets.py'}:factory"
    code, out, err = await mcruntime(
        "rbac", target, "--name", "widgets", "--namespace", "ops", "--leader-election", env=env
    )
    assert (code, err) == (0, ""), err
    documents = [doc for doc in yaml.safe_load_all(out) if doc]
    hub = _rules(documents, "ClusterRole", "widgets-hub")
    assert {
        "apiGroups": ["example.com"],
        "resources": ["widgets"],
        "verbs": ["get", "list", "patch", "update", "watch"],
    } in hub
    member = _rules(documents, "ClusterRole", "widgets-member")
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
    } in member
    leases = _rules(documents, "Role", "widgets-hub")
    assert leases == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create", "get", "update"]}
    ]


async def test_rbac_for_one_role_prints_only_its_objects(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    target = f"{tmp_path / 'widgets.py'}:factory"
    code, out, err = await mcruntime(
        "rbac", target, "--name", "w", "--namespace", "ops", "--role", "member", env=env
    )
    assert (code, err) == (0, ""), err
    names = {doc["metadata"]["name"] for doc in yaml.safe_load_all(out) if doc}
    assert "w-hub" not in names
    assert "w-member" in names


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--name", "Not_A_Name", "--namespace", "ops"], "--name 'Not_A_Name' is not a DNS subdomain"),
        (["--name", "w", "--namespace", "n" * 64], f"--namespace '{'n' * 64}' is not a DNS label: 1 to 63"),
        (
            ["--name", "w", "--namespace", "ops", "--service-account", "a..b"],
            "--service-account 'a..b' is not",
        ),
    ],
)
async def test_rbac_with_a_bad_name_exits_2_naming_the_flag(
    tmp_path: Path, flags: list[str], named: str
) -> None:
    env = _environment(tmp_path)
    target = f"{tmp_path / 'widgets.py'}:factory"
    code, out, err = await mcruntime("rbac", target, *flags, env=env)
    assert code == 2, (out, err)
    [line] = err.splitlines()
    assert line.startswith(f"mcruntime rbac: error: {named}"), line


async def test_rbac_explain_for_one_role_lists_only_its_permissions(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    target = f"{tmp_path / 'widgets.py'}:factory"
    for role in ("hub", "member"):
        code, out, err = await mcruntime(
            "rbac", target, "--name", "w", "--namespace", "ops", "--explain", "--role", role, env=env
        )
        assert (code, err) == (0, ""), err
        lines = out.splitlines()
        assert lines and all(line.startswith(f"{role} ") for line in lines), out


async def test_rbac_refuses_flags_a_factory_ignores(tmp_path: Path) -> None:
    env = _environment(tmp_path)
    (tmp_path / "fixed.py").write_text(
        "import mcruntime as mcr\n\n\ndef factory() -> mcr.Manager:\n"
        "    return mcr.Manager(mcr.StaticProvider({}), local=mcr.load_kubeconfig_env())\n"
    )
    target = f"{tmp_path / 'fixed.py'}:factory"
    code, out, err = await mcruntime(
        "rbac", target, "--name", "w", "--namespace", "ops", "--leader-election", env=env
    )
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "mcruntime rbac: error: --leader-election given, but the factory built its Manager without "
        "settings: have it build Manager.from_settings(provider, settings=settings), taking the parsed settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    ]
