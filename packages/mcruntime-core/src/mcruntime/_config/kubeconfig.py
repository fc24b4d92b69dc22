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

from .._base.errors import KubeconfigError, TrustPolicyError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# Fields that reference files, and the inline field that may stand in for each.
_CLUSTER_FILES = {"certificate-authority": "certificate-authority-data"}
_USER_FILES = {"client-certificate": "client-certificate-data", "client-key": "client-key-data"}

# The userinfo of a URL (``https://user:password@host``), which may hold a credential.
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@")

DEFAULT_MAX_BYTES = 1024 * 1024
"""The default size limit of one kubeconfig (file, Secret value or in-memory document)."""

MAX_DEPTH = 32
"""Nesting limit of a kubeconfig document; real ones nest about six levels deep."""

MAX_NODES = 100_000
"""Values (scalars, lists, mappings) one kubeconfig may hold; a thousand contexts take ~20,000.

Parsing costs about 20 µs per value, so this bounds one parse to a few seconds
of CPU (off the event loop). An in-memory document may share sub-objects (what
YAML aliases produce), so its check counts every visit and stops here rather
than following an exponential structure."""


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
                normalised[key] = {
                    "path": path,
                    "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest(),
                }
            except OSError:
                normalised[key] = {"path": path, "sha256": None}
    canonical = json.dumps(normalised, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- parsing ---------------------------------------------------------------------


class _Refused(yaml.YAMLError):
    """A YAML alias, or too deep or too many nodes, met while composing."""

    def __init__(self, message: str, mark: Any) -> None:
        super().__init__(message)
        self.message = message
        self.problem_mark = mark


class _BoundedComposer(yaml.composer.Composer):
    """PyYAML's composer without aliases and with a nesting limit.

    Listed before libyaml's parser in the loader's bases, so the (cheap,
    linear) composition is ours while scanning and parsing stay in C.
    """

    _depth = 0
    _nodes = 0
    check_event: Any
    peek_event: Any

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                "YAML aliases are not allowed in a kubeconfig (they can expand without bound)",
                event.start_mark,
            )
        self._depth += 1
        self._nodes += 1
        try:
            if self._nodes > MAX_NODES:
                raise _Refused(f"more than {MAX_NODES} values", self.peek_event().start_mark)
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_CParser: Any = getattr(yaml.cyaml, "CParser", None)

if _CParser is not None:

    class _Loader(_BoundedComposer, _CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):  # type: ignore[misc]
        """libyaml's scanner and parser, our composer, PyYAML's safe constructor."""

        def __init__(self, stream: str | bytes) -> None:
            _CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

else:  # pragma: no cover - PyYAML built without libyaml

    class _Loader(  # type: ignore[no-redef]
        yaml.reader.Reader,
        yaml.scanner.Scanner,
        yaml.parser.Parser,
        _BoundedComposer,
        yaml.constructor.SafeConstructor,
        yaml.resolver.Resolver,
    ):
        def __init__(self, stream: str | bytes) -> None:
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            _BoundedComposer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)


def parse_kubeconfig(
    text: str | bytes, *, origin: str = "<kubeconfig>", max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """Parse kubeconfig YAML (a file's or a Secret value's text) with bounded cost.

    Refuses documents over ``max_bytes``, YAML aliases and nesting deeper than
    :data:`MAX_DEPTH`, each with a :class:`KubeconfigError` naming ``origin``;
    anything that is not a mapping at the top is refused too. Use it instead
    of ``yaml.safe_load`` for any kubeconfig that came from elsewhere.
    """
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > max_bytes:
        raise KubeconfigError(f"larger than the limit of {max_bytes} bytes ({size} bytes)", origin=origin)
    loader = _Loader(text)
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        detail = f": {error.message}" if isinstance(error, _Refused) else ""
        raise KubeconfigError(f"not valid YAML{where}{detail}", origin=origin) from None
    except (ValueError, TypeError, RecursionError, UnicodeError, OverflowError) as error:
        # A scalar PyYAML cannot construct: an integer beyond Python's digit limit,
        # an impossible timestamp, an unhashable key.
        raise KubeconfigError(f"not valid YAML: {type(error).__name__}", origin=origin) from None
    finally:
        loader.dispose()
    if data is None:
        raise KubeconfigError("the document is empty", origin=origin)
    if not isinstance(data, dict):
        raise KubeconfigError("not a kubeconfig: the top level is not a mapping", origin=origin)
    return data


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a file, or an error: never read a huge file whole."""
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise KubeconfigError(f"cannot read the file: {error.strerror}", origin=str(path)) from None
    if len(data) > max_bytes:
        raise KubeconfigError(f"larger than the limit of {max_bytes} bytes", origin=str(path))
    return data


def _read_yaml(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    return parse_kubeconfig(_read_bounded(path, max_bytes), origin=str(path), max_bytes=max_bytes)


def _check_bounded(data: Any, origin: str, max_bytes: int) -> None:
    """Refuse an in-memory document too deep, too large or too shared to handle cheaply.

    Counts every visit (a sub-object shared n times counts n times) and every
    scalar's length, iteratively, so a hostile structure costs at most
    ``MAX_NODES`` steps however it was built.
    """
    budget = MAX_NODES
    size = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            raise KubeconfigError(
                f"more than {MAX_NODES} values (shared sub-structures count each time)", origin=origin
            )
        if depth > MAX_DEPTH:
            raise KubeconfigError(f"nested deeper than {MAX_DEPTH} levels", origin=origin)
        if isinstance(value, Mapping):
            for key, item in value.items():
                stack.append((key, depth + 1))
                stack.append((item, depth + 1))
        elif isinstance(value, list | tuple):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str | bytes):
            size += len(value)
        else:
            size += 8
        if size > max_bytes:
            raise KubeconfigError(f"larger than the limit of {max_bytes} bytes", origin=origin)


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


def _resolve_path(value: Any, base_dir: Path | None, field_name: str, origin: str, context: str) -> str:
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{field_name} must be a non-empty path", origin=origin, context=context)
    try:
        path = Path(value).expanduser()
    except (RuntimeError, ValueError):  # "~nobody/..." for a user that does not exist
        raise KubeconfigError(
            f"{field_name}: cannot expand {value!r}", origin=origin, context=context
        ) from None
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
    if not isinstance(value, str):
        raise KubeconfigError(f"{data_field} must be a base64 string", origin=origin, context=context)
    try:
        # kubectl's decoder skips line breaks (a wrapped block scalar); the transport's does too.
        base64.b64decode(str(value).replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise KubeconfigError(f"{data_field} is not valid base64", origin=origin, context=context) from None


_CLUSTER_STRINGS = ("server", "certificate-authority-data", "tls-server-name", "proxy-url")
_CLUSTER_BOOLS = ("insecure-skip-tls-verify", "disable-compression")
_USER_STRINGS = ("token", "tokenFile", "username", "password", "client-certificate-data", "client-key-data")


def _check_types(
    entry: Mapping[str, Any],
    strings: Iterable[str],
    bools: Iterable[str],
    what: str,
    origin: str,
    context: str,
) -> None:
    for key in strings:
        if key in entry and entry[key] is not None and not isinstance(entry[key], str):
            raise KubeconfigError(f"{what}: {key} must be a string", origin=origin, context=context)
    for key in bools:
        if key in entry and entry[key] is not None and not isinstance(entry[key], bool):
            raise KubeconfigError(f"{what}: {key} must be true or false", origin=origin, context=context)


def _check_exec(spec: Mapping[str, Any], what: str, origin: str, context: str) -> None:
    """The fields our exec runner reads, with the types it expects."""
    if not isinstance(spec.get("command"), str) or not spec["command"]:
        raise KubeconfigError(
            f"{what}: exec.command must be a non-empty string", origin=origin, context=context
        )
    if not isinstance(spec.get("apiVersion"), str):
        raise KubeconfigError(f"{what}: exec.apiVersion must be a string", origin=origin, context=context)
    args = spec.get("args")
    if args is not None and not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        raise KubeconfigError(f"{what}: exec.args must be a list of strings", origin=origin, context=context)
    env = spec.get("env")
    if env is not None and not (
        isinstance(env, list)
        and all(
            isinstance(item, dict)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), str)
            for item in env
        )
    ):
        raise KubeconfigError(
            f"{what}: exec.env must be a list of {{name, value}} strings", origin=origin, context=context
        )
    mode = spec.get("interactiveMode")
    if mode is not None and mode not in ("Never", "IfAvailable", "Always"):
        raise KubeconfigError(
            f"{what}: exec.interactiveMode is not Never, IfAvailable or Always",
            origin=origin,
            context=context,
        )
    if mode == "Always":
        raise KubeconfigError(
            f"{what}: exec.interactiveMode Always needs a terminal, which a controller never has",
            origin=origin,
            context=context,
        )


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
    _check_types(cluster, _CLUSTER_STRINGS, _CLUSTER_BOOLS, f"cluster {cluster_name!r}", origin, chosen)
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
        _check_types(user, _USER_STRINGS, (), f"user {user_name!r}", origin, chosen)

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
    if "exec" in user:
        _check_exec(user["exec"], f"user {user_name!r}", origin, chosen)

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
    kubeconfig.merge(_read_yaml(file, max_bytes), file.parent, str(file))
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
    _check_bounded(data, origin, max_bytes)
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
    existing = [path for path in paths if path.is_file()]
    if not existing:
        raise KubeconfigError(f"no kubeconfig file found (looked at {', '.join(map(str, paths))})")
    kubeconfig = _Kubeconfig(os.pathsep.join(map(str, existing)))
    for path in existing:
        kubeconfig.merge(_read_yaml(path, max_bytes), path.parent, str(path))
    return _build(kubeconfig, context, trust or TrustPolicy.own())


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
    return kubeconfig_from_dict(data, origin="in-cluster", trust=TrustPolicy.untrusted())
