"""Every cluster has users that authenticate the way provider kubeconfigs will."""

from __future__ import annotations

import asyncio
import copy

import pytest
from kube_helpers import core_api, unique
from kubernetes_asyncio.client.exceptions import ApiException

from mcruntime.testing import ControlPlane, Fleet


async def _whoami(plane: ControlPlane, kubeconfig: dict[str, object]) -> int:
    async with core_api(kubeconfig) as api:
        result = await api.list_namespace()
    return len(result.items)


async def test_certificate_user_authenticates(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    entry = plane.kubeconfig(plane.cert_user)["users"][0]["user"]
    assert set(entry) == {"client-certificate-data", "client-key-data"}
    assert await _whoami(plane, plane.kubeconfig(plane.cert_user)) > 0


async def test_token_user_authenticates(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    assert set(plane.kubeconfig(plane.token_user)["users"][0]["user"]) == {"token"}
    assert await _whoami(plane, plane.kubeconfig(plane.token_user)) > 0


async def test_an_unknown_token_gets_401(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    kubeconfig = copy.deepcopy(plane.kubeconfig(plane.token_user))
    kubeconfig["users"][0]["user"]["token"] = "not-a-token-this-cluster-knows"
    with pytest.raises(ApiException) as raised:
        await _whoami(plane, kubeconfig)
    assert raised.value.status == 401


async def test_another_clusters_credentials_get_401(fleet: Fleet) -> None:
    here, there = fleet["cluster-1"], fleet["cluster-2"]
    kubeconfig = copy.deepcopy(here.kubeconfig(there.token_user))
    with pytest.raises(ApiException) as raised:
        await _whoami(here, kubeconfig)
    assert raised.value.status == 401


async def test_added_token_users_authenticate_and_revoked_ones_do_not(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    name = unique("robot")
    first = plane.add_token_user(name)
    rotated = plane.add_token_user(name)
    assert first.token != rotated.token
    assert await _whoami(plane, plane.kubeconfig(first)) > 0
    assert await _whoami(plane, plane.kubeconfig(rotated)) > 0
    plane.revoke_token_user(name)
    # The apiserver caches successful authentications for a few seconds.
    deadline = asyncio.get_running_loop().time() + 30
    status = None
    while status != 401 and asyncio.get_running_loop().time() < deadline:
        try:
            await _whoami(plane, plane.kubeconfig(rotated))
        except ApiException as error:
            status = error.status
        else:
            await asyncio.sleep(0.5)
    assert status == 401


def test_credentials_stay_out_of_reprs(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    assert plane.token_user.token is not None
    assert plane.token_user.token not in repr(plane.token_user)
    assert plane.admin.client_cert is not None
    assert plane.admin.client_cert.key_pem.decode() not in repr(plane.admin)


def test_kubeconfig_files_are_private(fleet: Fleet) -> None:
    path = fleet["cluster-1"].kubeconfig_path(fleet["cluster-1"].token_user)
    assert path.stat().st_mode & 0o077 == 0
