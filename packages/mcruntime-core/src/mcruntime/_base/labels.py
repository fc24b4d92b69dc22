"""Label selectors evaluated client-side, with the API server's syntax.

The cache answers ``list(kind, label_selector=...)`` from one informer per kind,
and predicates filter events by labels, so both need the same matching rules as
the server: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
``a`` (exists) and ``!a`` (does not exist), comma-separated and all required.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_SET = re.compile(r"^\s*([^\s!=(),]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQUALITY = re.compile(r"^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=(),]+)\s*$")


@dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str  # in, notin, exists, !exists
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "exists":
            return self.key in labels
        if self.operator == "!exists":
            return self.key not in labels
        if self.operator == "in":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


def _split(expression: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in expression:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[_Requirement, ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, selector: str | Mapping[str, str] | None) -> LabelSelector:
        """Parse the server's string syntax, or take a mapping as equality requirements."""
        if selector is None:
            return cls()
        if isinstance(selector, Mapping):
            text = ",".join(f"{key}={value}" for key, value in selector.items())
            return cls(tuple(_Requirement(k, "in", frozenset([v])) for k, v in selector.items()), text)
        requirements: list[_Requirement] = []
        for part in _split(selector):
            if match := _SET.match(part):
                values = frozenset(value.strip() for value in match[3].split(",") if value.strip())
                if not values:  # the server refuses an empty set too
                    raise ValueError(f"invalid label selector {selector!r}: {part.strip()!r} lists no values")
                requirements.append(_Requirement(match[1], match[2], values))
            elif match := _EQUALITY.match(part):
                operator = "notin" if match[2] == "!=" else "in"
                requirements.append(_Requirement(match[1], operator, frozenset([match[3]])))
            elif match := _EXISTS.match(part):
                requirements.append(_Requirement(match[2], "!exists" if match[1] else "exists", frozenset()))
            else:
                raise ValueError(f"invalid label selector {selector!r}: cannot parse {part.strip()!r}")
        return cls(tuple(requirements), selector)

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether an object with these labels is selected."""
        present = labels or {}
        return all(requirement.matches(present) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return self.text
