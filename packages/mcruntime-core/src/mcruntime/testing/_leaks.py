"""Rule 7 in the conformance suite: what a case wrote as a credential must never come back out.

Every credential a case hands the driver goes through :meth:`LeakWatch.add`,
so the suite knows exactly what must not be seen again: not in
``statuses()`` or ``sources()`` (any field), not in the ``repr`` of the
provider or of its clusters, not in a log record emitted while the provider
runs. A quoted *part* of a token is as much a leak as all of it (an error that
quotes the first line of a half-saved file), so the watch matches any run of
:data:`FRAGMENT` characters of a credential. Reports say whose credential
appeared and where; they never contain it.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ._driver import BAD_TOKEN_PREFIX, Breakage, Target

FRAGMENT = 12
"""Characters of a credential in a row that count as quoting it (as the core's own tests count)."""

HIDDEN = "[credential]"
"""What :meth:`LeakWatch.redact` puts where a credential was, so a failure message never quotes one."""

_MOST_REPORTED = 5


class LeakWatch(logging.Handler):
    """The credentials a case wrote, and the log records that quoted one.

    Installed on the root logger while the provider runs (:meth:`watching`),
    it sees every record the logging configuration lets through (pytest's
    ``--log-level=DEBUG`` makes that debug records too) and keeps only where a
    leak was, never the record: the text may hold the secret.
    """

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._fragments: dict[str, str] = {}  # every FRAGMENT-long run of a credential -> whose
        self._sizes: frozenset[int] = frozenset()  # FRAGMENT, or the length of a shorter credential
        self.logged: list[str] = []  # "<whose> appears in a log record of logger 'x' (WARNING)", a few

    def add(self, label: str, secret: str) -> None:
        """Watch for ``secret``; ``label`` (never the secret) says whose it is in a failure."""
        size = min(FRAGMENT, len(secret))
        if size == 0:
            return
        fragments = dict(self._fragments)  # copied, not mutated: emit() may read from another thread
        for start in range(len(secret) - size + 1):
            fragments.setdefault(secret[start : start + size], label)
        self._fragments, self._sizes = fragments, self._sizes | {size}

    def add_target(self, target: Target) -> None:
        """Watch the credential a driver writes for ``target``: its token or its client key."""
        who = f"user {target.user.name!r} of {target.plane.name}"
        token = target.token
        if token is not None:
            if target.breakage is Breakage.BAD_CREDENTIAL:  # "conformance-" also starts namespace names
                self.add("the bad token of a target", token.removeprefix(BAD_TOKEN_PREFIX))
            else:
                self.add(f"the token of {who}", token)
            return
        key_pair = target.user.client_cert
        if key_pair is None:
            return
        pem = key_pair.key_pem.decode()
        body = [line for line in pem.splitlines() if line and not line.startswith("-----")]
        for index, line in enumerate(body):  # the first line starts with the key type's fixed header
            self.add(f"the client key of {who}", line[24:] if index == 0 else line)
        data = base64.b64encode(key_pair.key_pem).decode()  # client-key-data: armor cut off both ends
        self.add(f"the client-key-data of {who}", data[64:-64])

    def found_in(self, text: str) -> str | None:
        """Whose credential ``text`` quotes (a run of :data:`FRAGMENT` characters), or ``None``."""
        fragments = self._fragments
        for size in self._sizes:
            for start in range(len(text) - size + 1):
                whose = fragments.get(text[start : start + size])
                if whose is not None:
                    return whose
        return None

    def redact(self, text: str) -> str:
        """``text`` with every quoted credential replaced by :data:`HIDDEN`, for failure messages."""
        fragments = self._fragments
        hidden = [False] * len(text)
        for size in self._sizes:
            for start in range(len(text) - size + 1):
                if text[start : start + size] in fragments:
                    hidden[start : start + size] = [True] * size
        if not any(hidden):
            return text
        kept: list[str] = []
        for index, char in enumerate(text):
            if not hidden[index]:
                kept.append(char)
            elif index == 0 or not hidden[index - 1]:  # one marker per hidden run
                kept.append(HIDDEN)
        return "".join(kept)

    def emit(self, record: logging.LogRecord) -> None:
        """Note whose credential ``record`` quotes, and where; the record is not kept, it may hold one."""
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: its raw parts are what a formatter would show
            text = f"{record.msg} {record.args}"
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        elif record.exc_text:
            text += "\n" + record.exc_text
        if record.stack_info:
            text += "\n" + record.stack_info
        whose = self.found_in(text)
        if whose is not None and len(self.logged) < _MOST_REPORTED:
            where = f"{whose} appears in a log record of logger {record.name!r} ({record.levelname})"
            if where not in self.logged:
                self.logged.append(where)

    @contextmanager
    def watching(self) -> Iterator[LeakWatch]:
        """Watch every log record for the block (the root logger's handlers see them all)."""
        root = logging.getLogger()
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)


def shown(where: str, value: object) -> Iterator[tuple[str, str]]:
    """``(where, text)`` for every field of ``value``, walked through dataclasses, mappings and sequences.

    So a failure can name the field (``statuses()['alpha'].source.error``)
    instead of "somewhere in the status".
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from shown(f"{where}.{item.name}", getattr(value, item.name))
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield f"a key of {where}", str(key)
            yield from shown(f"{where}[{key!r}]", item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            yield from shown(f"{where}[{index}]", item)
    elif isinstance(value, str):
        yield where, value
    elif isinstance(value, enum.Enum):
        yield where, str(value.value)
    elif value is not None:
        yield where, repr(value)
