"""Kubeconfig YAML read at a bounded cost: a size limit, a nesting limit, a value budget, no aliases.

A kubeconfig that came from elsewhere (a file a provider found, a Secret on a
hub) is parsed here before anything looks at it, so a hostile document costs
at most a few seconds of CPU off the event loop and never expands without
bound. Every refusal is a :class:`KubeconfigError` naming where it came from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .._base.errors import KubeconfigError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "check_bounded",
    "parse_kubeconfig",
    "read_bounded",
    "read_yaml",
]

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


def read_bounded(path: Path, max_bytes: int) -> bytes:
    """At most ``max_bytes`` of a file, or an error: never read a huge file whole."""
    try:
        with path.open("rb") as handle:
            data = handle.read(max_bytes + 1)
    except OSError as error:
        raise KubeconfigError(f"cannot read the file: {error.strerror}", origin=str(path)) from None
    if len(data) > max_bytes:
        raise KubeconfigError(f"larger than the limit of {max_bytes} bytes", origin=str(path))
    return data


def read_yaml(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, Any]:
    """A kubeconfig file parsed within :func:`parse_kubeconfig`'s bounds, never read whole if too big."""
    return parse_kubeconfig(read_bounded(path, max_bytes), origin=str(path), max_bytes=max_bytes)


def check_bounded(data: Any, origin: str, max_bytes: int) -> None:
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
