"""One ClusterProfile, read: is it ready, and how do we connect to its cluster?

A profile is written by a cluster manager we do not control, so reading it is
bounded: its size, how many access providers it lists, how long each string
is, how many plugin arguments and variables it adds. Every refusal is a
:class:`ProfileError` whose message names the profile and the field, and
never quotes a value that may be sensitive (a CA, an argument, a variable).

The connection is assembled as a kubeconfig and handed to the core, so trust,
fingerprints and secret-free reprs work as for every other provider: the
profile's clientcmd ``Cluster`` (server, CA data, TLS server name, proxy URL,
and the one extension a plugin reads) becomes the cluster entry, and the
consumer's plugin, with what the profile may add to it, the user entry.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcruntime as mcr

from ._access import (
    ADDITIONAL_ARGS_EXTENSION,
    ADDITIONAL_ENVS_EXTENSION,
    EXEC_EXTENSION,
    AccessConfig,
    AccessProvider,
    exec_for,
)

CONTROL_PLANE_HEALTHY = "ControlPlaneHealthy"

MAX_PROFILE_BYTES = 256 * 1024
"""Default size limit of one ClusterProfile as read (JSON, without managedFields)."""

MAX_ACCESS_PROVIDERS = 32
"""Default limit of ``status.accessProviders`` plus ``status.credentialProviders`` entries."""

MAX_STRING_CHARS = 4096
"""Default length limit of a name, server, proxy URL, plugin argument or variable from a profile."""

MAX_CA_CHARS = 128 * 1024
"""Length limit of ``certificate-authority-data`` (base64): room for a large bundle."""

MAX_ADDITIONS = 64
"""Limit of the plugin arguments, and of the variables, one profile may add."""

_LOADER_PREFIXES = ("LD_", "DYLD_")
"""Variables a profile may never set, whatever the policy: they inject code into the plugin."""

Readiness = Callable[[Mapping[str, Any]], bool]
"""``ready(profile)``: may a cluster not engaged yet be engaged?"""


class ProfileError(ValueError):
    """A ClusterProfile cannot be used; the message names it and the field, and quotes no value."""


def control_plane_healthy(profile: Mapping[str, Any]) -> bool:
    """The default readiness: the ``ControlPlaneHealthy`` condition is ``True``.

    Any other state, or no such condition yet, is not ready: a cluster is not
    engaged before its manager says its control plane is up. Once engaged, a
    cluster stays engaged whatever this says (not ready is not gone).
    """
    conditions = (profile.get("status") or {}).get("conditions") or []
    return any(
        isinstance(condition, Mapping)
        and condition.get("type") == CONTROL_PLANE_HEALTHY
        and condition.get("status") == "True"
        for condition in conditions
    )


@dataclass(frozen=True)
class Limits:
    """The bounds on what one profile may cost (see the module constants)."""

    max_profile_bytes: int = MAX_PROFILE_BYTES
    max_access_providers: int = MAX_ACCESS_PROVIDERS
    max_string_chars: int = MAX_STRING_CHARS

    def __post_init__(self) -> None:
        for name in ("max_profile_bytes", "max_access_providers", "max_string_chars"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, not {getattr(self, name)}")


@dataclass(frozen=True)
class Access:
    """What a profile offers this consumer: the chosen provider's name and the connection."""

    provider: str
    config: mcr.ClusterConfig


def read_access(
    key: str,
    profile: Mapping[str, Any],
    access: AccessConfig,
    *,
    trust: mcr.TrustPolicy,
    limits: Limits,
) -> Access:
    """The connection to profile ``key``'s cluster, or a :class:`ProfileError` saying why not.

    CPU-bound for a large profile (a size check serialises it once): call it
    off the event loop. Raises only :class:`ProfileError`.
    """
    what = f"ClusterProfile {key}"

    def fail(message: str) -> ProfileError:
        return ProfileError(f"{what}: {message}")

    try:
        size = len(json.dumps(profile, separators=(",", ":"), default=str))
    except (TypeError, ValueError, RecursionError):
        raise fail("cannot be measured (not a JSON document)") from None
    if size > limits.max_profile_bytes:
        raise fail(f"is {size} bytes, more than the limit of {limits.max_profile_bytes}; not read")
    status = profile.get("status") or {}
    if not isinstance(status, Mapping):
        raise fail("status is not an object")
    offered = _offered(status, limits, fail)
    chosen: AccessProvider | None = next((p for p in access.providers if p.name in offered), None)
    if chosen is None:
        names = ", ".join(repr(name) for name in sorted(offered)[:8]) or "none"
        wanted = ", ".join(repr(name) for name in access.names())
        raise fail(f"offers no access provider this consumer supports (offers {names}; supported {wanted})")
    where = f"access provider {chosen.name!r}"
    cluster = offered[chosen.name].get("cluster")
    if not isinstance(cluster, Mapping):
        raise fail(f"{where}: cluster must be an object")
    entry, args, env = _cluster_entry(cluster, where, limits, fail)
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "profile", "cluster": entry}],
        "users": [{"name": chosen.name, "user": {"exec": exec_for(chosen, args, env)}}],
        "contexts": [{"name": "profile", "context": {"cluster": "profile", "user": chosen.name}}],
        "current-context": "profile",
    }
    try:
        config = mcr.kubeconfig_from_dict(
            kubeconfig, base_dir=access.base_dir, trust=trust, origin=f"{what} {where}"
        )
    except mcr.KubeconfigError as error:  # secret-free by construction; names the origin
        raise ProfileError(str(error)) from None
    return Access(chosen.name, config)


def _offered(
    status: Mapping[str, Any], limits: Limits, fail: Callable[[str], ProfileError]
) -> dict[str, Mapping[str, Any]]:
    """Access providers by name: the deprecated list first, so ``accessProviders`` wins a name."""
    offered: dict[str, Mapping[str, Any]] = {}
    total = 0
    for field in ("credentialProviders", "accessProviders"):
        entries = status.get(field) or []
        if not isinstance(entries, list):
            raise fail(f"status.{field} is not a list")
        total += len(entries)
        if total > limits.max_access_providers:
            raise fail(
                f"lists more than {limits.max_access_providers} access providers "
                "(status.accessProviders and credentialProviders together); not read"
            )
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise fail(f"status.{field}[{index}] is not an object")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise fail(f"status.{field}[{index}].name must be a non-empty string")
            if len(name) > limits.max_string_chars:
                raise fail(
                    f"status.{field}[{index}].name is longer than {limits.max_string_chars} characters"
                )
            offered[name] = entry
    return offered


def _cluster_entry(
    cluster: Mapping[str, Any], where: str, limits: Limits, fail: Callable[[str], ProfileError]
) -> tuple[dict[str, Any], list[str] | None, dict[str, str] | None]:
    """The kubeconfig cluster entry, and the plugin arguments and variables the profile adds.

    Only what decides where we connect and whom we trust is kept. File
    references (``certificate-authority``) are refused: a path would name a
    file on the controller's machine, chosen by whoever writes profiles.
    """
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise fail(f"{where}: cluster.server must be a non-empty string")
    entry: dict[str, Any] = {"server": server}
    for key in ("server", "tls-server-name", "proxy-url"):
        value = cluster.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise fail(f"{where}: cluster.{key} must be a string")
        if len(value) > limits.max_string_chars:
            raise fail(f"{where}: cluster.{key} is longer than {limits.max_string_chars} characters")
        entry[key] = value
    ca = cluster.get("certificate-authority-data")
    if ca:
        if not isinstance(ca, str):
            raise fail(f"{where}: cluster.certificate-authority-data must be a base64 string")
        if len(ca) > MAX_CA_CHARS:
            raise fail(
                f"{where}: cluster.certificate-authority-data is longer than {MAX_CA_CHARS} characters"
            )
        try:
            base64.b64decode(ca, validate=True)
        except (binascii.Error, ValueError):
            raise fail(f"{where}: cluster.certificate-authority-data is not valid base64") from None
        entry["certificate-authority-data"] = ca
    if cluster.get("certificate-authority"):
        raise fail(
            f"{where}: cluster.certificate-authority (a file path) is refused; use certificate-authority-data"
        )
    for key in ("insecure-skip-tls-verify", "disable-compression"):
        value = cluster.get(key)
        if value is not None:
            if not isinstance(value, bool):
                raise fail(f"{where}: cluster.{key} must be true or false")
            if value:
                entry[key] = True
    extensions = cluster.get("extensions") or []
    if not isinstance(extensions, list):
        raise fail(f"{where}: cluster.extensions is not a list")
    if len(extensions) > MAX_ADDITIONS:
        raise fail(f"{where}: cluster.extensions has more than {MAX_ADDITIONS} entries")
    args: list[str] | None = None
    env: dict[str, str] | None = None
    for index, extension in enumerate(extensions):
        at = f"{where}: cluster.extensions[{index}]"
        if not isinstance(extension, Mapping) or not isinstance(extension.get("name"), str):
            raise fail(f"{at} must be an object with a name")
        name, value = extension["name"], extension.get("extension")
        if name == ADDITIONAL_ARGS_EXTENSION:
            args = _strings(value, f"{at} ({name})", limits, fail)
        elif name == ADDITIONAL_ENVS_EXTENSION:
            env = _variables(value, f"{at} ({name})", limits, fail)
        elif name == EXEC_EXTENSION:
            # Handed to the plugin as ExecCredential.spec.cluster.config (provideClusterInfo).
            entry["extensions"] = [{"name": EXEC_EXTENSION, "extension": value}]
    return entry, args, env


def _strings(value: Any, at: str, limits: Limits, fail: Callable[[str], ProfileError]) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise fail(f"{at} must be a list of strings")
    if len(value) > MAX_ADDITIONS:
        raise fail(f"{at} has more than {MAX_ADDITIONS} arguments")
    if any(len(item) > limits.max_string_chars or "\0" in item for item in value):
        raise fail(f"{at}: an argument is longer than {limits.max_string_chars} characters or contains NUL")
    return list(value)


def _variables(value: Any, at: str, limits: Limits, fail: Callable[[str], ProfileError]) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(name, str) and isinstance(item, str) for name, item in value.items()
    ):
        raise fail(f"{at} must map names to strings")
    if len(value) > MAX_ADDITIONS:
        raise fail(f"{at} has more than {MAX_ADDITIONS} variables")
    for name, item in value.items():
        if not name or "=" in name or "\0" in name or len(name) > limits.max_string_chars:
            raise fail(f"{at}: a variable name is empty, too long or contains '=' or NUL")
        if name.startswith(_LOADER_PREFIXES):
            raise fail(f"{at}: {name[:80]!r} is refused (it would change how the plugin's program is loaded)")
        if len(item) > limits.max_string_chars or "\0" in item:
            raise fail(f"{at}: the value of {name[:80]!r} is too long or contains NUL")
    return dict(value)
