"""Kubeconfigs turned into one cluster's connection config, safely.

A controller engages clusters from kubeconfigs it did not write: files a
provider found, Secrets on a hub. So loading is strict and explicit: a
``TrustPolicy`` decides whether exec plugins, auth-providers and disabled TLS
verification are acceptable (yes for the user's own kubeconfig, no for what a
provider brings, unless opted in); relative file references resolve against the
kubeconfig's own directory, never the process's working directory; every error
names the file, the context and the field; and nothing secret reaches a
``repr``, a log or an error message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from ._errors import KubeconfigError, TrustPolicyError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Fields that reference files, and the inline field that may stand in for each.
_CLUSTER_FILES = {"certificate-authority": "certificate-authority-data"}
_USER_FILES = {"client-certificate": "client-certificate-data", "client-key": "client-key-data"}

# The userinfo of a URL (``https://user:password@host``), which may hold a credential.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@")


def _redacted(url: str) -> str:
    """The URL with any userinfo masked, for reprs and messages."""
    return _USERINFO.sub(r"\1***@", url)


def _absolute(path: str | os.PathLike[str]) -> Path:
    """An absolute path without resolving symlinks, as kubectl does.

    A kubeconfig mounted from a Secret is a symlink into a timestamped directory
    that the kubelet deletes on every update; paths must stay on the stable side.
    """
    return Path(os.path.abspath(Path(path).expanduser()))


@dataclass(frozen=True)
class TrustPolicy:
    """What a kubeconfig may ask for beyond a server, a CA and static credentials.

    ``TrustPolicy.own()`` allows everything, for kubeconfigs the user pointed at
    themselves; ``TrustPolicy.untrusted()`` (the default for providers) allows
    nothing, so a kubeconfig planted in a Secret cannot make the controller run
    a program or skip certificate checks.
    """

    allow_exec: bool = False
    allow_auth_provider: bool = False
    allow_insecure: bool = False

    @classmethod
    def own(cls) -> TrustPolicy:
        """Everything allowed: the user's own kubeconfig, as kubectl would use it."""
        return cls(allow_exec=True, allow_auth_provider=True, allow_insecure=True)

    @classmethod
    def untrusted(cls) -> TrustPolicy:
        """Nothing beyond static credentials and verified TLS."""
        return cls()


@dataclass(frozen=True)
class _Entry:
    """A named kubeconfig entry and the directory its relative paths resolve against."""

    value: Mapping[str, Any]
    base_dir: Path | None
    origin: str


@dataclass(frozen=True, repr=False, eq=False)
class ClusterConfig:
    """How to reach one cluster: server, trust, identity. Immutable and secret-free in repr.

    Build one with :func:`load_kubeconfig`, :func:`kubeconfig_from_dict`,
    :func:`load_kubeconfig_env` or :func:`in_cluster_config`. File references are
    absolute by now; ``*-data`` fields are still inline (the transport writes
    them to private files for the lifetime of one connection).

    Two configs are equal only if they are the same object: compare
    :meth:`fingerprint` to ask whether they describe the same connection.
    """

    origin: str
    context: str | None
    cluster_name: str
    user_name: str | None
    cluster: Mapping[str, Any] = field(compare=False)
    user: Mapping[str, Any] = field(compare=False)
    trust: TrustPolicy = field(default_factory=TrustPolicy, compare=False)

    def __repr__(self) -> str:
        context = f" context={self.context!r}" if self.context else ""
        return f"<ClusterConfig {self.origin}{context} server={_redacted(self.server)}>"

    __str__ = __repr__

    @property
    def server(self) -> str:
        return str(self.cluster["server"]).rstrip("/")

    @property
    def insecure(self) -> bool:
        """TLS verification is off, or the server speaks plain HTTP."""
        return bool(self.cluster.get("insecure-skip-tls-verify")) or self.server.startswith("http://")

    @property
    def auth_kind(self) -> str:
        """Which credential the user entry carries: exec, auth-provider, token, ... or none."""
        user = self.user
        if "exec" in user:
            return "exec"
        if "auth-provider" in user:
            return "auth-provider"
        if user.get("token") or user.get("tokenFile"):
            return "token"
        if user.get("client-certificate") or user.get("client-certificate-data"):
            return "client-certificate"
        if user.get("username"):
            return "basic"
        return "none"

    def endpoint_fingerprint(self) -> str:
        """Hash of everything that decides where we connect and whom we trust."""
        return _digest(self.cluster, ("certificate-authority",))

    def credential_fingerprint(self) -> str:
        """Hash of the identity alone, so a rotated token can be told apart from a move."""
        return _digest(self.user, ("client-certificate", "client-key"))

    def fingerprint(self) -> str:
        """Hash of the whole connection config; equal hashes mean nothing to re-engage.

        Referenced certificate files are hashed by content, so rewriting a CA
        file in place counts as a change; a ``tokenFile`` counts by path only,
        because the transport re-reads it (that is how mounted tokens rotate).
        """
        return hashlib.sha256(
            f"{self.endpoint_fingerprint()}:{self.credential_fingerprint()}".encode()
        ).hexdigest()


def _digest(entry: Mapping[str, Any], content_fields: Iterable[str]) -> str:
    normalised: dict[str, Any] = {key: entry[key] for key in sorted(entry)}
    for key in content_fields:
        path = normalised.get(key)
        if isinstance(path, str):
            try:
                normalised[key] = {
                    "path": path,
                    "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                }
            except OSError:
                normalised[key] = {"path": path, "sha256": None}
    canonical = json.dumps(normalised, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- parsing ---------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise KubeconfigError(f"cannot read the file: {error.strerror}", origin=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise KubeconfigError(f"not valid YAML{where}", origin=str(path)) from None
    if data is None:
        raise KubeconfigError("the file is empty", origin=str(path))
    if not isinstance(data, dict):
        raise KubeconfigError("not a kubeconfig: the top level is not a mapping", origin=str(path))
    return data


def _named_entries(
    data: Mapping[str, Any], section: str, base_dir: Path | None, origin: str
) -> dict[str, _Entry]:
    raw = data.get(section) or []
    if not isinstance(raw, list):
        raise KubeconfigError(f"{section!r} must be a list", origin=origin)
    entries: dict[str, _Entry] = {}
    inner = section.rstrip("s")  # clusters -> cluster, users -> user, contexts -> context
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise KubeconfigError(f"{section}[{index}] has no name", origin=origin)
        value = item.get(inner) or {}
        if not isinstance(value, dict):
            raise KubeconfigError(
                f"{section}[{index}] ({item['name']!r}): {inner!r} must be a mapping", origin=origin
            )
        # kubectl's merge rule: the first entry with a name wins.
        entries.setdefault(item["name"], _Entry(value, base_dir, origin))
    return entries


@dataclass
class _Kubeconfig:
    """A parsed (possibly merged) kubeconfig with per-entry base directories."""

    origin: str
    clusters: dict[str, _Entry] = field(default_factory=dict)
    users: dict[str, _Entry] = field(default_factory=dict)
    contexts: dict[str, _Entry] = field(default_factory=dict)
    current_context: str | None = None

    def merge(self, data: Mapping[str, Any], base_dir: Path | None, origin: str) -> None:
        for section, target in (
            ("clusters", self.clusters),
            ("users", self.users),
            ("contexts", self.contexts),
        ):
            for name, entry in _named_entries(data, section, base_dir, origin).items():
                target.setdefault(name, entry)
        current = data.get("current-context")
        if self.current_context is None and isinstance(current, str) and current:
            self.current_context = current


def _resolve_path(value: Any, base_dir: Path | None, field_name: str, origin: str, context: str) -> str:
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{field_name} must be a non-empty path", origin=origin, context=context)
    path = Path(value).expanduser()
    if not path.is_absolute():
        if base_dir is None:
            raise KubeconfigError(
                f"{field_name} is a relative path ({value}) but this kubeconfig has no directory "
                "to resolve it against; pass base_dir",
                origin=origin,
                context=context,
            )
        path = base_dir / path
    if not path.is_file():
        raise KubeconfigError(f"{field_name} file {path} does not exist", origin=origin, context=context)
    return str(path)


def _check_data(entry: dict[str, Any], data_field: str, origin: str, context: str) -> None:
    value = entry.get(data_field)
    if value is None:
        return
    try:
        # kubectl's decoder skips line breaks (a wrapped block scalar); the transport's does too.
        base64.b64decode(str(value).replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"{data_field} is not valid base64", origin=origin, context=context) from None


def _build(kubeconfig: _Kubeconfig, context: str | None, trust: TrustPolicy) -> ClusterConfig:
    origin = kubeconfig.origin
    chosen = context or kubeconfig.current_context
    if not chosen:
        available = ", ".join(sorted(kubeconfig.contexts)) or "none"
        raise KubeconfigError(
            f"no context chosen and no current-context set (contexts: {available})", origin=origin
        )
    if chosen not in kubeconfig.contexts:
        available = ", ".join(sorted(kubeconfig.contexts)) or "none"
        raise KubeconfigError(f"context {chosen!r} not found (contexts: {available})", origin=origin)
    context_entry = kubeconfig.contexts[chosen].value
    cluster_name = context_entry.get("cluster")
    if not isinstance(cluster_name, str) or not cluster_name:
        raise KubeconfigError("the context names no cluster", origin=origin, context=chosen)
    if cluster_name not in kubeconfig.clusters:
        raise KubeconfigError(f"cluster entry {cluster_name!r} not found", origin=origin, context=chosen)
    cluster_entry = kubeconfig.clusters[cluster_name]
    cluster = dict(cluster_entry.value)
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeconfigError(f"cluster {cluster_name!r} has no server", origin=origin, context=chosen)
    try:
        scheme = urlsplit(server).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("https", "http"):
        raise KubeconfigError(
            f"cluster {cluster_name!r}: server must be an http(s) URL, not {_redacted(server)!r}",
            origin=origin,
            context=chosen,
        )

    user_name = context_entry.get("user")
    if user_name is not None and not isinstance(user_name, str):
        raise KubeconfigError("the context's user must be a name", origin=origin, context=chosen)
    user: dict[str, Any] = {}
    user_base: Path | None = None
    if user_name:
        if user_name not in kubeconfig.users:
            raise KubeconfigError(f"user entry {user_name!r} not found", origin=origin, context=chosen)
        user = dict(kubeconfig.users[user_name].value)
        user_base = kubeconfig.users[user_name].base_dir

    if (cluster.get("insecure-skip-tls-verify") or scheme == "http") and not trust.allow_insecure:
        what = "plain HTTP" if scheme == "http" else "insecure-skip-tls-verify"
        raise TrustPolicyError(
            f"cluster {cluster_name!r} uses {what}, which this trust policy refuses "
            "(allow it explicitly with TrustPolicy(allow_insecure=True))",
            origin=origin,
            context=chosen,
        )
    if "exec" in user and not trust.allow_exec:
        raise TrustPolicyError(
            f"user {user_name!r} runs an exec plugin, which this trust policy refuses "
            "(allow it explicitly with TrustPolicy(allow_exec=True))",
            origin=origin,
            context=chosen,
        )
    if "auth-provider" in user and not trust.allow_auth_provider:
        raise TrustPolicyError(
            f"user {user_name!r} uses an auth-provider, which this trust policy refuses "
            "(allow it explicitly with TrustPolicy(allow_auth_provider=True))",
            origin=origin,
            context=chosen,
        )
    for plugin in ("exec", "auth-provider"):
        if plugin in user and not isinstance(user[plugin], Mapping):
            raise KubeconfigError(
                f"user {user_name!r}: {plugin} must be a mapping", origin=origin, context=chosen
            )

    for file_field, data_field in _CLUSTER_FILES.items():
        if cluster.get(data_field):
            cluster.pop(file_field, None)  # kubectl: inline data wins over a path
            _check_data(cluster, data_field, origin, chosen)
        elif file_field in cluster:
            cluster[file_field] = _resolve_path(
                cluster[file_field], cluster_entry.base_dir, file_field, origin, chosen
            )
    for file_field, data_field in _USER_FILES.items():
        if user.get(data_field):
            user.pop(file_field, None)
            _check_data(user, data_field, origin, chosen)
        elif file_field in user:
            user[file_field] = _resolve_path(user[file_field], user_base, file_field, origin, chosen)
    if "tokenFile" in user and not user.get("token"):
        user["tokenFile"] = _resolve_path(user["tokenFile"], user_base, "tokenFile", origin, chosen)
    has_cert = bool(user.get("client-certificate") or user.get("client-certificate-data"))
    has_key = bool(user.get("client-key") or user.get("client-key-data"))
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise KubeconfigError(f"user {user_name!r} has no {missing}", origin=origin, context=chosen)
    if "exec" in user and user_base is not None:
        user["exec"] = dict(user["exec"], _base_dir=str(user_base))

    return ClusterConfig(
        origin=origin,
        context=chosen,
        cluster_name=cluster_name,
        user_name=user_name if isinstance(user_name, str) else None,
        cluster=MappingProxyType(cluster),
        user=MappingProxyType(user),
        trust=trust,
    )


# --- public loaders --------------------------------------------------------------


def load_kubeconfig(
    path: str | os.PathLike[str], context: str | None = None, *, trust: TrustPolicy | None = None
) -> ClusterConfig:
    """Load one context (``current-context`` unless named) from a kubeconfig file.

    The default trust is :meth:`TrustPolicy.own`: a path given here is the user's
    own choice. Providers pass :meth:`TrustPolicy.untrusted` or what the user
    opted into.
    """
    file = _absolute(path)
    kubeconfig = _Kubeconfig(str(file))
    kubeconfig.merge(_read_yaml(file), file.parent, str(file))
    return _build(kubeconfig, context, trust or TrustPolicy.own())


def kubeconfig_from_dict(
    data: Mapping[str, Any],
    context: str | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    trust: TrustPolicy | None = None,
    origin: str = "<kubeconfig dict>",
) -> ClusterConfig:
    """Load one context from a kubeconfig already in memory (a Secret's value, say).

    Relative paths resolve against ``base_dir``; without one they are an error
    rather than silently resolving against the working directory. The default
    trust is :meth:`TrustPolicy.untrusted`: in-memory kubeconfigs usually come
    from somewhere else.
    """
    if not isinstance(data, Mapping):
        raise KubeconfigError("not a kubeconfig: the top level is not a mapping", origin=origin)
    directory = _absolute(base_dir) if base_dir is not None else None
    kubeconfig = _Kubeconfig(origin)
    kubeconfig.merge(data, directory, origin)
    return _build(kubeconfig, context, trust or TrustPolicy.untrusted())


def kubeconfig_paths_from_env() -> list[Path]:
    """The files ``KUBECONFIG`` lists (``os.pathsep``-separated), or ``~/.kube/config``."""
    listed = os.environ.get("KUBECONFIG", "")
    paths = [Path(part).expanduser() for part in listed.split(os.pathsep) if part]
    return paths or [Path.home() / ".kube" / "config"]


def load_kubeconfig_env(context: str | None = None, *, trust: TrustPolicy | None = None) -> ClusterConfig:
    """Load like kubectl: the files in ``KUBECONFIG`` merged, first entry of a name wins.

    ``current-context`` comes from the first file that sets one (kubectl's rule;
    kubernetes-asyncio takes the last). Listed files that do not exist are
    skipped, as kubectl does, unless none exists.
    """
    paths = [_absolute(path) for path in kubeconfig_paths_from_env()]
    existing = [path for path in paths if path.is_file()]
    if not existing:
        raise KubeconfigError(f"no kubeconfig file found (looked at {', '.join(map(str, paths))})")
    kubeconfig = _Kubeconfig(os.pathsep.join(map(str, existing)))
    for path in existing:
        kubeconfig.merge(_read_yaml(path), path.parent, str(path))
    return _build(kubeconfig, context, trust or TrustPolicy.own())


def list_contexts(data: Mapping[str, Any]) -> list[str]:
    """The context names of a kubeconfig mapping, in file order."""
    return [
        item["name"]
        for item in (data.get("contexts") or [])
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    ]


def in_cluster_config(service_account_dir: str | os.PathLike[str] | None = None) -> ClusterConfig:
    """The config of a pod's own cluster: the service host, the mounted CA and token.

    The token is referenced as a file so the transport re-reads it: bound
    service-account tokens expire and the kubelet rotates the file.
    """
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError(
            "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set",
            origin="in-cluster",
        )
    directory = Path(service_account_dir) if service_account_dir else SERVICE_ACCOUNT_DIR
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    data = {
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {
                    "server": f"https://{host}:{port}",
                    "certificate-authority": str(directory / "ca.crt"),
                },
            }
        ],
        "users": [{"name": "service-account", "user": {"tokenFile": str(directory / "token")}}],
        "contexts": [{"name": "in-cluster", "context": {"cluster": "in-cluster", "user": "service-account"}}],
        "current-context": "in-cluster",
    }
    return kubeconfig_from_dict(data, origin="in-cluster", trust=TrustPolicy.untrusted())
