"""Kubeconfigs turned into one cluster's connection config, safely.

A controller engages clusters from kubeconfigs it did not write: files a
provider found, Secrets on a hub. So loading is strict and explicit: a
``TrustPolicy`` decides whether exec plugins, auth-providers and disabled TLS
verification are acceptable (yes for the user's own kubeconfig, no for what a
provider brings, unless opted in); relative file references resolve against the
kubeconfig's own directory, never the process's working directory; every error
names the file, the context and the field; and nothing secret reaches a
``repr``, a log or an error message.

The cost of a kubeconfig is bounded before anything else looks at it: at most
``max_bytes`` (1 MiB by default) per file, Secret value or in-memory document,
at most ``MAX_DEPTH`` levels of nesting, and no YAML aliases at all (an alias
is how a 1.4 KB "billion laughs" document expands to gigabytes; kubectl never
writes one). Everything a fingerprint needs, referenced certificate files
included, is read once when the config is built: loaders do their I/O in the
caller's thread (providers call them off the event loop, see
:func:`load_kubeconfig_async`), and :meth:`ClusterConfig.fingerprint` is then
pure computation, safe on the event loop.
"""

from __future__ import annotations

import asyncio
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

from .._base.errors import KubeconfigError, TrustPolicyError
from .bounded_yaml import DEFAULT_MAX_BYTES, check_bounded, read_yaml
from .bounded_yaml import parse_kubeconfig as parse_kubeconfig  # the loaders' parser, importable here too
from .fields import (
    CLUSTER_BOOLS,
    CLUSTER_STRINGS,
    USER_STRINGS,
    check_data,
    check_exec,
    check_types,
    is_regular_file,
    read_regular,
    resolve_own_path,
    resolve_path,
)
from .tokens import token_problem

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Fields that reference files, and the inline field that may stand in for each.
_CLUSTER_FILES = {"certificate-authority": "certificate-authority-data"}
_USER_FILES = {"client-certificate": "client-certificate-data", "client-key": "client-key-data"}

# The userinfo of a URL (``https://user:password@host``), which may hold a credential.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@")


def redacted_url(url: str) -> str:
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
    a program, skip certificate checks, or read the controller's own files:
    with ``allow_local_files`` off, a file reference (a CA, a client key, a
    ``tokenFile``) must lie in the kubeconfig's own directory, so a
    ``tokenFile`` naming the controller's ServiceAccount token cannot send that
    token to a server the kubeconfig chose.
    """

    allow_exec: bool = False
    allow_auth_provider: bool = False
    allow_insecure: bool = False
    allow_local_files: bool = False

    @classmethod
    def own(cls) -> TrustPolicy:
        """Everything allowed: the user's own kubeconfig, as kubectl would use it."""
        return cls(allow_exec=True, allow_auth_provider=True, allow_insecure=True, allow_local_files=True)

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
    them to in-memory files for the lifetime of one connection).

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
    _endpoint_digest: str = field(init=False, compare=False)
    _credential_digest: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        # Read referenced certificate files now, in the loader's thread, so that
        # fingerprint() never touches the disk (ClusterSet.set calls it on the loop).
        object.__setattr__(self, "_endpoint_digest", _digest(self.cluster, ("certificate-authority",)))
        object.__setattr__(
            self, "_credential_digest", _digest(self.user, ("client-certificate", "client-key"))
        )

    def __repr__(self) -> str:
        context = f" context={self.context!r}" if self.context else ""
        return f"<ClusterConfig {self.origin}{context} server={redacted_url(self.server)}>"

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
        return self._endpoint_digest

    def credential_fingerprint(self) -> str:
        """Hash of the identity alone, so a rotated token can be told apart from a move."""
        return self._credential_digest

    def fingerprint(self) -> str:
        """Hash of the whole connection config; equal hashes mean nothing to re-engage.

        Referenced certificate files are hashed by content as they were when
        the config was built (never here: this runs on the event loop), so a
        CA file rewritten in place counts as a change once the provider loads
        the kubeconfig again; a ``tokenFile`` counts by path only, because the
        transport re-reads it (that is how mounted tokens rotate).
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
                normalised[key] = {"path": path, "sha256": hashlib.sha256(read_regular(path)).hexdigest()}
            except OSError:
                normalised[key] = {"path": path, "sha256": None}
    canonical = json.dumps(normalised, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _named_entries(
    data: Mapping[str, Any], section: str, base_dir: Path | None, origin: str
) -> dict[str, _Entry]:
    raw = data.get(section)
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise KubeconfigError(f"{section!r} must be a list", origin=origin)
    entries: dict[str, _Entry] = {}
    inner = section.rstrip("s")  # clusters -> cluster, users -> user, contexts -> context
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise KubeconfigError(f"{section}[{index}] has no name", origin=origin)
        value = item.get(inner)
        if value is None:
            value = {}
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


def _usable_proxy(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        return False
    return parts.scheme.lower() in ("http", "https") and bool(parts.hostname)


def _available(names: Iterable[str], shown: int = 10) -> str:
    """A file's context names for an error: quoted (they may hold any character), the first few only."""
    ordered = sorted(names)
    listed = ", ".join(repr(name if len(name) <= 100 else name[:100] + "...") for name in ordered[:shown])
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return (listed + more) or "none"


def _build(kubeconfig: _Kubeconfig, context: str | None, trust: TrustPolicy) -> ClusterConfig:
    origin = kubeconfig.origin
    chosen = context or kubeconfig.current_context
    if not chosen:
        available = _available(kubeconfig.contexts)
        raise KubeconfigError(
            f"no context chosen and no current-context set (contexts: {available})", origin=origin
        )
    if chosen not in kubeconfig.contexts:
        raise KubeconfigError(
            f"context {chosen!r} not found (contexts: {_available(kubeconfig.contexts)})", origin=origin
        )
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
    check_types(cluster, CLUSTER_STRINGS, CLUSTER_BOOLS, f"cluster {cluster_name!r}", origin, chosen)
    try:
        parts = urlsplit(server)
        scheme, netloc = parts.scheme, parts.netloc
        parts.port  # noqa: B018 - raises ValueError for a port that is no number
    except ValueError:
        scheme, netloc = "", ""
    if "@" in netloc:
        # Never echoed: the userinfo may be a password, and aiohttp would put the
        # whole URL into every connection error (statuses, /readyz, logs).
        raise KubeconfigError(
            f"cluster {cluster_name!r}: the server URL carries a user name or password, which is refused "
            "(put credentials in the user entry)",
            origin=origin,
            context=chosen,
        )
    if scheme not in ("https", "http"):
        raise KubeconfigError(
            f"cluster {cluster_name!r}: server must be an http(s) URL, not {redacted_url(server)!r}",
            origin=origin,
            context=chosen,
        )
    proxy = cluster.get("proxy-url")
    if proxy and not _usable_proxy(proxy):
        # Checked here, not by the first request: "InvalidURL" would name neither file nor field.
        raise KubeconfigError(
            f"cluster {cluster_name!r}: proxy-url must be an http(s) URL with a host, "
            f"not {redacted_url(proxy)!r}",
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
        check_types(user, USER_STRINGS, (), f"user {user_name!r}", origin, chosen)
        problem = token_problem(user["token"]) if user.get("token") else None
        if problem:
            raise KubeconfigError(f"user {user_name!r}: the token {problem}", origin=origin, context=chosen)

    insecure = "plain HTTP" if scheme == "http" else "insecure-skip-tls-verify"
    refusals = (  # (asked for and not allowed, what it is, the TrustPolicy field that allows it)
        (
            bool(cluster.get("insecure-skip-tls-verify") or scheme == "http") and not trust.allow_insecure,
            f"cluster {cluster_name!r} uses {insecure}",
            "allow_insecure",
        ),
        ("exec" in user and not trust.allow_exec, f"user {user_name!r} runs an exec plugin", "allow_exec"),
        (
            "auth-provider" in user and not trust.allow_auth_provider,
            f"user {user_name!r} uses an auth-provider",
            "allow_auth_provider",
        ),
    )
    for refused, what, allow in refusals:
        if refused:
            raise TrustPolicyError(
                f"{what}, which this trust policy refuses "
                f"(allow it explicitly with TrustPolicy({allow}=True))",
                origin=origin,
                context=chosen,
            )
    for plugin in ("exec", "auth-provider"):
        if plugin in user and not isinstance(user[plugin], Mapping):
            raise KubeconfigError(
                f"user {user_name!r}: {plugin} must be a mapping", origin=origin, context=chosen
            )
    if "exec" in user:
        check_exec(user["exec"], f"user {user_name!r}", origin, chosen)

    def local(value: Any, base_dir: Path | None, file_field: str) -> str:
        if trust.allow_local_files:
            return resolve_path(value, base_dir, file_field, origin, chosen)
        return resolve_own_path(value, base_dir, file_field, origin, chosen)  # refused before looked up

    for file_field, data_field in _CLUSTER_FILES.items():
        if cluster.get(data_field):
            cluster.pop(file_field, None)  # kubectl: inline data wins over a path
            check_data(cluster, data_field, origin, chosen)
        elif file_field in cluster:
            cluster[file_field] = local(cluster[file_field], cluster_entry.base_dir, file_field)
    for file_field, data_field in _USER_FILES.items():
        if user.get(data_field):
            user.pop(file_field, None)
            check_data(user, data_field, origin, chosen)
        elif file_field in user:
            user[file_field] = local(user[file_field], user_base, file_field)
    if "tokenFile" in user and not user.get("token"):
        user["tokenFile"] = local(user["tokenFile"], user_base, "tokenFile")
        if not trust.allow_local_files and user_base is not None:
            user["_token_root"] = os.path.realpath(user_base)  # checked again at each read
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
    path: str | os.PathLike[str],
    context: str | None = None,
    *,
    trust: TrustPolicy | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ClusterConfig:
    """Load one context (``current-context`` unless named) from a kubeconfig file.

    The default trust is :meth:`TrustPolicy.own`: a path given here is the user's
    own choice. Providers pass :meth:`TrustPolicy.untrusted` or what the user
    opted into. Reads the disk: on an event loop, use :func:`load_kubeconfig_async`.
    """
    file = _absolute(path)
    kubeconfig = _Kubeconfig(str(file))
    kubeconfig.merge(read_yaml(file, max_bytes), file.parent, str(file))
    return _build(kubeconfig, context, trust or TrustPolicy.own())


async def load_kubeconfig_async(
    path: str | os.PathLike[str],
    context: str | None = None,
    *,
    trust: TrustPolicy | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ClusterConfig:
    """:func:`load_kubeconfig` in a worker thread, so the event loop keeps running meanwhile."""
    return await asyncio.to_thread(load_kubeconfig, path, context, trust=trust, max_bytes=max_bytes)


def kubeconfig_from_yaml(
    text: str | bytes,
    context: str | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    trust: TrustPolicy | None = None,
    origin: str = "<kubeconfig>",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ClusterConfig:
    """Load one context from kubeconfig text (a Secret's value, say) with bounded cost.

    :func:`parse_kubeconfig` then :func:`kubeconfig_from_dict`; the default
    trust is :meth:`TrustPolicy.untrusted`. CPU-bound for large input: call it
    off the event loop (``asyncio.to_thread``).
    """
    data = parse_kubeconfig(text, origin=origin, max_bytes=max_bytes)
    return kubeconfig_from_dict(
        data, context, base_dir=base_dir, trust=trust, origin=origin, max_bytes=max_bytes
    )


def kubeconfig_from_dict(
    data: Mapping[str, Any],
    context: str | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    trust: TrustPolicy | None = None,
    origin: str = "<kubeconfig dict>",
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ClusterConfig:
    """Load one context from a kubeconfig already in memory (a Secret's value, say).

    Relative paths resolve against ``base_dir``; without one they are an error
    rather than silently resolving against the working directory. The default
    trust is :meth:`TrustPolicy.untrusted`: in-memory kubeconfigs usually come
    from somewhere else. The document is checked against the same limits as a
    parsed one (``max_bytes``, :data:`MAX_DEPTH`, :data:`MAX_NODES`) before use.
    """
    if not isinstance(data, Mapping):
        raise KubeconfigError("not a kubeconfig: the top level is not a mapping", origin=origin)
    check_bounded(data, origin, max_bytes)
    directory = _absolute(base_dir) if base_dir is not None else None
    kubeconfig = _Kubeconfig(origin)
    kubeconfig.merge(data, directory, origin)
    return _build(kubeconfig, context, trust or TrustPolicy.untrusted())


def kubeconfig_paths_from_env() -> list[Path]:
    """The files ``KUBECONFIG`` lists (``os.pathsep``-separated), or ``~/.kube/config``."""
    listed = os.environ.get("KUBECONFIG", "")
    paths = [Path(part).expanduser() for part in listed.split(os.pathsep) if part]
    return paths or [Path.home() / ".kube" / "config"]


def load_kubeconfig_env(
    context: str | None = None, *, trust: TrustPolicy | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> ClusterConfig:
    """Load like kubectl: the files in ``KUBECONFIG`` merged, first entry of a name wins.

    ``current-context`` comes from the first file that sets one (kubectl's rule;
    kubernetes-asyncio takes the last). Listed files that do not exist are
    skipped, as kubectl does, unless none exists.
    """
    paths = [_absolute(path) for path in kubeconfig_paths_from_env()]
    existing = [path for path in paths if _is_file(path)]
    if not existing:
        raise KubeconfigError(f"no kubeconfig file found (looked at {', '.join(map(str, paths))})")
    kubeconfig = _Kubeconfig(os.pathsep.join(map(str, existing)))
    for path in existing:
        kubeconfig.merge(read_yaml(path, max_bytes), path.parent, str(path))
    return _build(kubeconfig, context, trust or TrustPolicy.own())


def _is_file(path: Path) -> bool:
    """Whether a listed kubeconfig is a file; one that cannot even be looked up is an error naming it."""
    try:
        return is_regular_file(path)
    except OSError as error:  # a name too long for the file system, a permission on a directory
        why = error.strerror or str(error)
        shown = str(path)[:200]
        raise KubeconfigError(f"KUBECONFIG lists {shown!r}, which cannot be looked up: {why}") from None


def list_contexts(data: Mapping[str, Any]) -> list[str]:
    """The context names of a kubeconfig mapping, in file order."""
    contexts = data.get("contexts")
    if not isinstance(contexts, list):
        return []
    return [item["name"] for item in contexts if isinstance(item, dict) and isinstance(item.get("name"), str)]


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
    # The pod's own CA and token, where Kubernetes mounts them: local files by design, nothing else allowed.
    return kubeconfig_from_dict(data, origin="in-cluster", trust=TrustPolicy(allow_local_files=True))
