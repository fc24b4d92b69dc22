"""The fields of a kubeconfig entry checked one by one, each error naming the file, the context and the field.

What the loader in ``kubeconfig.py`` calls before it trusts an entry: file
references resolved against the kubeconfig's directory, inline data that must
be base64, string and boolean fields, and the exec plugin's own fields.
"""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from .._base.errors import KubeconfigError, TrustPolicyError


def is_regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file: False when it is missing, ``OSError`` when it cannot be looked up.

    ``Path.is_file()`` passes some errors on (a name too long, up to Python 3.13)
    and swallows them from 3.14; this answers alike on every Python.
    """
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except ValueError:  # a NUL byte in the name: no such file can exist
        return False


MAX_REFERENCED_BYTES = 4 << 20
"""The most a file a kubeconfig references (a CA bundle, a certificate, a key, a token) may hold."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind_of(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def shown_path(value: str) -> str:
    """A path as an error may quote it: never a credential typed into a path field, nor control characters.

    Errors reach statuses, ``/readyz`` and logs. A PEM key in ``client-key``
    (meant for ``client-key-data``) or a token in ``tokenFile`` would be
    quoted there whole; such a value is described instead.
    """
    name = value.rstrip("/").rsplit("/", 1)[-1]
    if "\n" in value or "-----BEGIN" in value or name.startswith("eyJ"):
        return f"(a value of {len(value)} characters that looks like a credential, not a path)"
    shown = value if len(value) <= 200 else f"{value[:200]}... ({len(value)} characters)"
    return shown if shown.isprintable() else repr(shown)


def resolve_path(value: Any, base_dir: Path | None, field_name: str, origin: str, context: str) -> str:
    """A kubeconfig's file reference, made absolute against the kubeconfig's directory.

    It must be a regular file of at most :data:`MAX_REFERENCED_BYTES`: a FIFO
    or ``/dev/zero`` named as a CA would hang or fill whoever reads it.
    """
    return _regular_file(_absolute(value, base_dir, field_name, origin, context), field_name, origin, context)


def resolve_own_path(value: Any, base_dir: Path | None, field_name: str, origin: str, context: str) -> str:
    """:func:`resolve_path` for an untrusted kubeconfig: only a file in its own directory, links followed.

    The trust policy decides first, from the path alone (and the links of the
    kubeconfig's own directory), and only a path it allows is looked up. A
    refused path is refused in the same words whether or not such a file
    exists on this machine: whoever writes a kubeconfig into a Secret and
    reads its status must not learn which files the controller has (nor which
    users its ``~name`` forms name), nor read "does not exist" as "create it".
    """
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{field_name} must be a non-empty path", origin=origin, context=context)
    if base_dir is None:
        if not value.startswith("~") and not os.path.isabs(value):
            _absolute(value, None, field_name, origin, context)  # raises "pass base_dir": the name alone
        _refuse_outside(value, None, field_name, origin, context)
    try:
        path = Path(value).expanduser()
    except (RuntimeError, ValueError):  # "~nobody/...": wherever that is, it is not this directory
        _refuse_outside(value, base_dir, field_name, origin, context)
    if not path.is_absolute():
        path = base_dir / path
    root = os.path.realpath(base_dir)
    lexical = os.path.normpath(path)
    if not (_under(lexical, os.path.normpath(base_dir)) or _under(lexical, root)):
        _refuse_outside(str(path), base_dir, field_name, origin, context)  # never looked up
    if not within(str(path), root):  # inside by name, outside once its links are followed
        _refuse_outside(str(path), base_dir, field_name, origin, context)
    return _regular_file(path, field_name, origin, context)


def _absolute(value: Any, base_dir: Path | None, field_name: str, origin: str, context: str) -> Path:
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{field_name} must be a non-empty path", origin=origin, context=context)
    try:
        path = Path(value).expanduser()
    except (RuntimeError, ValueError):  # "~nobody/..." for a user that does not exist
        raise KubeconfigError(
            f"{field_name}: cannot expand {shown_path(value)}", origin=origin, context=context
        ) from None
    if not path.is_absolute():
        if base_dir is None:
            raise KubeconfigError(
                f"{field_name} is a relative path ({shown_path(value)}) but this kubeconfig has no "
                "directory to resolve it against; pass base_dir",
                origin=origin,
                context=context,
            )
        path = base_dir / path
    return path


def _regular_file(path: Path, field_name: str, origin: str, context: str) -> str:
    shown = shown_path(str(path))
    try:
        status = path.stat()
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte in the name
        message = f"{field_name} file {shown} does not exist"
        raise KubeconfigError(message, origin=origin, context=context) from None
    except OSError as error:  # a name too long for the file system, a loop of links: the kubeconfig's fault
        raise KubeconfigError(
            f"{field_name} file {shown} cannot be looked up: {error.strerror or error}",
            origin=origin,
            context=context,
        ) from None
    if not stat.S_ISREG(status.st_mode):
        raise KubeconfigError(
            f"{field_name} file {shown} is {_kind_of(status.st_mode)}, not a regular file",
            origin=origin,
            context=context,
        )
    if status.st_size > MAX_REFERENCED_BYTES:
        raise KubeconfigError(
            f"{field_name} file {shown} holds {status.st_size} bytes, more than the "
            f"{MAX_REFERENCED_BYTES >> 20} MiB a kubeconfig's file may",
            origin=origin,
            context=context,
        )
    return str(path)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def within(path: str, root: str) -> bool:
    """Whether ``path``, its links followed, lies under ``root`` (itself already resolved)."""
    try:
        real = os.path.realpath(path)
    except ValueError:  # a NUL byte in the name: no file, anywhere
        return False
    return _under(real, root)


def _refuse_outside(path: str, base_dir: Path | None, field_name: str, origin: str, context: str) -> NoReturn:
    """Refuse, for an untrusted kubeconfig, a file outside its own directory (or any, without one)."""
    where = (
        "outside this kubeconfig's directory"
        if base_dir is not None
        else "and this kubeconfig, not read from a file, has no directory of its own"
    )
    raise TrustPolicyError(
        f"{field_name} names a file {where} ({shown_path(path)}), which this trust policy refuses "
        "(allow it explicitly with TrustPolicy(allow_local_files=True))",
        origin=origin,
        context=context,
    )


def read_regular(path: str | Path, limit: int = MAX_REFERENCED_BYTES) -> bytes:
    """A regular file's bytes, at most ``limit``; ``OSError`` for anything else, without blocking.

    Opened non-blocking and checked on the open descriptor: a file swapped for
    a FIFO or a device after it was checked neither hangs the reader nor fills
    its memory.
    """
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(f"{_kind_of(mode)}, not a regular file")
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            content = file.read(limit + 1)
    finally:
        os.close(descriptor)
    if len(content) > limit:
        raise OSError(f"more than {limit} bytes")
    return content


def check_data(entry: dict[str, Any], data_field: str, origin: str, context: str) -> None:
    """An inline ``*-data`` field must be base64 (line breaks allowed, as kubectl allows them)."""
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


CLUSTER_STRINGS = ("server", "certificate-authority-data", "tls-server-name", "proxy-url")
CLUSTER_BOOLS = ("insecure-skip-tls-verify", "disable-compression")
USER_STRINGS = ("token", "tokenFile", "username", "password", "client-certificate-data", "client-key-data")


def check_types(
    entry: Mapping[str, Any],
    strings: Iterable[str],
    bools: Iterable[str],
    what: str,
    origin: str,
    context: str,
) -> None:
    """Each listed field, when present, has the type the runtime reads it as."""
    for key in strings:
        if key in entry and entry[key] is not None and not isinstance(entry[key], str):
            raise KubeconfigError(f"{what}: {key} must be a string", origin=origin, context=context)
    for key in bools:
        if key in entry and entry[key] is not None and not isinstance(entry[key], bool):
            raise KubeconfigError(f"{what}: {key} must be true or false", origin=origin, context=context)


def check_exec(spec: Mapping[str, Any], what: str, origin: str, context: str) -> None:
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
