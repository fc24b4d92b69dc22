"""The consumer's provider file: which credential plugin to run for which access provider.

A ClusterProfile says where a cluster is (server, CA, proxy) under one or more
access-provider names; it never holds a credential. The consumer (this
controller) holds a JSON file, the same one the Go tooling reads with
``--clusterprofile-provider-file``, that maps each name it supports to an exec
credential plugin and to two policies saying what a profile may add to that
plugin's command line and environment (KEP-5339). The file is the consumer's
own configuration, so a mistake in it is an error at start, naming the file and
the field; a profile's contribution is untrusted input, bounded and checked per
profile.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import mcruntime as mcr

MAX_PROVIDER_FILE_BYTES = 1024 * 1024
"""Size limit of a provider file; real ones hold a few plugins in a few hundred bytes."""

EXEC_EXTENSION = "client.authentication.k8s.io/exec"
"""The cluster extension whose value a plugin receives as ``ExecCredential.spec.cluster.config``."""

ADDITIONAL_ARGS_EXTENSION = "clusterprofiles.multicluster.x-k8s.io/exec/additional-args"
"""KEP-5339: a profile's list of extra plugin arguments, used only under :attr:`ArgsPolicy.APPEND`."""

ADDITIONAL_ENVS_EXTENSION = "clusterprofiles.multicluster.x-k8s.io/exec/additional-envs"
"""KEP-5339: a profile's map of extra plugin environment variables, used only if the policy allows."""

_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class AccessConfigError(mcr.MCRuntimeError):
    """The provider file cannot be used; the message names the file and the field."""


class ArgsPolicy(enum.Enum):
    """What a profile's ``additional-args`` extension does to the plugin's arguments."""

    IGNORE = "Ignore"
    """The default: a profile cannot change the plugin's command line."""
    APPEND = "Append"
    """The profile's arguments follow the provider file's."""


class EnvPolicy(enum.Enum):
    """What a profile's ``additional-envs`` extension does to the plugin's environment."""

    IGNORE = "Ignore"
    """The default: a profile cannot change the plugin's environment."""
    APPEND_IF_NOT_EXISTS = "AppendIfNotExists"
    """The profile adds variables; the provider file's value wins for a name both set."""
    REPLACE = "Replace"
    """The profile adds variables; the profile's value wins for a name both set."""


@dataclass(frozen=True)
class AccessProvider:
    """One entry of the provider file: an access-provider name and the plugin that serves it.

    ``exec_config`` is a kubeconfig ``exec`` stanza (``apiVersion``,
    ``command``, ``args``, ``env``, ``provideClusterInfo``). It is left out
    of ``repr``: its environment may carry secrets.
    """

    name: str
    exec_config: Mapping[str, Any] = field(repr=False)
    args_policy: ArgsPolicy = ArgsPolicy.IGNORE
    env_policy: EnvPolicy = EnvPolicy.IGNORE


@dataclass(frozen=True)
class AccessConfig:
    """The consumer's provider file: its access providers in order of preference.

    A profile is reached through the first of these providers it lists (the
    Go tooling's rule). A relative plugin ``command`` with a slash
    (``./bin/secretreader-plugin``) is relative to the working directory, as
    the Go tooling runs it (``os/exec``; upstream's examples are run from the
    repository root), so the same file works for both. ``base_dir``, given to
    :meth:`from_dict`, makes such commands relative to that directory instead;
    :meth:`load` leaves it ``None``. Build one with :meth:`load` or
    :meth:`from_dict`.
    """

    providers: tuple[AccessProvider, ...]
    origin: str = "<access config>"
    base_dir: str | None = None

    def names(self) -> list[str]:
        """The access-provider names this consumer supports, in order of preference."""
        return [provider.name for provider in self.providers]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AccessConfig:
        """Read a provider file (JSON, at most :data:`MAX_PROVIDER_FILE_BYTES`); reads the disk."""
        file = Path(os.path.abspath(Path(path).expanduser()))
        try:
            with file.open("rb") as handle:
                raw = handle.read(MAX_PROVIDER_FILE_BYTES + 1)
        except OSError as error:
            raise AccessConfigError(f"{file}: cannot read the provider file: {error.strerror}") from None
        if len(raw) > MAX_PROVIDER_FILE_BYTES:
            raise AccessConfigError(f"{file}: larger than the limit of {MAX_PROVIDER_FILE_BYTES} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as error:
            where = f" at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else ""
            raise AccessConfigError(f"{file}: not valid JSON{where}") from None
        return cls.from_dict(data, origin=str(file))

    @classmethod
    def from_dict(
        cls, data: Any, *, origin: str = "<access config>", base_dir: str | os.PathLike[str] | None = None
    ) -> AccessConfig:
        """Check a provider file already in memory; every error names ``origin`` and the field."""

        def fail(message: str) -> AccessConfigError:
            return AccessConfigError(f"{origin}: {message}")

        if not isinstance(data, Mapping):
            raise fail("the top level is not an object")
        entries = data.get("providers")
        if not isinstance(entries, list) or not entries:
            raise fail("providers must be a non-empty list")
        providers: list[AccessProvider] = []
        seen: set[str] = set()
        for index, entry in enumerate(entries):
            where = f"providers[{index}]"
            if not isinstance(entry, Mapping):
                raise fail(f"{where} is not an object")
            name = entry.get("name")
            if not isinstance(name, str) or not name:
                raise fail(f"{where}.name must be a non-empty string")
            if name in seen:
                raise fail(f"{where}.name {name!r} is listed twice")
            seen.add(name)
            where = f"providers[{index}] ({name!r})"
            exec_config = _checked_exec(entry.get("execConfig"), f"{where}.execConfig", fail)
            args_policy = _policy(ArgsPolicy, entry.get("profileSourcedCLIArgsPolicy"), where, fail)
            env_policy = _policy(EnvPolicy, entry.get("profileSourcedEnvVarsPolicy"), where, fail)
            providers.append(AccessProvider(name, MappingProxyType(exec_config), args_policy, env_policy))
        directory = os.path.abspath(base_dir) if base_dir is not None else None
        return cls(tuple(providers), origin, directory)


_Policy = TypeVar("_Policy", ArgsPolicy, EnvPolicy)


def _policy(kind: type[_Policy], value: Any, where: str, fail: Callable[[str], AccessConfigError]) -> _Policy:
    if value is None or value == "":
        return kind("Ignore")
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        field_name = "profileSourcedCLIArgsPolicy" if kind is ArgsPolicy else "profileSourcedEnvVarsPolicy"
        raise fail(f"{where}.{field_name} {str(value)[:80]!r} is not one of {allowed}") from None


def _checked_exec(spec: Any, where: str, fail: Callable[[str], AccessConfigError]) -> dict[str, Any]:
    """An exec stanza with the types our runner needs; interactive mode is always Never."""
    if not isinstance(spec, Mapping):
        raise fail(f"{where} must be an object (the plugin to run)")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise fail(f"{where}.command must be a non-empty string")
    api_version = spec.get("apiVersion")
    if api_version not in _API_VERSIONS:
        raise fail(f"{where}.apiVersion must be one of {', '.join(_API_VERSIONS)}")
    args = spec.get("args")
    if args is not None and not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        raise fail(f"{where}.args must be a list of strings")
    env = spec.get("env")
    if env is not None and not (
        isinstance(env, list)
        and all(
            isinstance(item, Mapping)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), str)
            for item in env
        )
    ):
        raise fail(f"{where}.env must be a list of {{name, value}} strings")
    provide = spec.get("provideClusterInfo")
    if provide is not None and not isinstance(provide, bool):
        raise fail(f"{where}.provideClusterInfo must be true or false")
    checked: dict[str, Any] = {
        "apiVersion": api_version,
        "command": command,
        "args": list(args or []),
        "env": [{"name": item["name"], "value": item["value"]} for item in env or []],
        "interactiveMode": "Never",  # a controller has no terminal
    }
    if provide:
        checked["provideClusterInfo"] = True
    hint = spec.get("installHint")
    if isinstance(hint, str) and hint:
        checked["installHint"] = hint
    return checked


def exec_for(
    provider: AccessProvider, args: Sequence[str] | None, env: Mapping[str, str] | None
) -> dict[str, Any]:
    """The plugin stanza for one profile: the file's, plus what the profile may add.

    ``args`` and ``env`` are the profile's KEP-5339 extensions (already
    checked); the provider's policies decide whether they count. The result
    is deterministic (file order, then the profile's names sorted), so an
    unchanged profile gives an unchanged config and nothing re-engages.
    """
    spec = {key: value for key, value in provider.exec_config.items() if key not in ("args", "env")}
    spec["args"] = list(provider.exec_config.get("args") or [])
    if args and provider.args_policy is ArgsPolicy.APPEND:
        spec["args"].extend(args)
    own = [(str(item["name"]), str(item["value"])) for item in provider.exec_config.get("env") or []]
    merged = dict(own)
    if env and provider.env_policy is not EnvPolicy.IGNORE:
        for name in sorted(env):
            if name not in merged or provider.env_policy is EnvPolicy.REPLACE:
                merged[name] = env[name]
    order = [name for name, _ in own] + sorted(name for name in merged if name not in dict(own))
    spec["env"] = [{"name": name, "value": merged[name]} for name in dict.fromkeys(order)]
    return spec
