"""Names of resource types: what users write (``Kind``) and what URLs need (``Resource``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Kind:
    """An apiVersion and a kind, the way manifests name a type: ``Kind("apps/v1", "Deployment")``.

    Users name types the way they write manifests; discovery maps them to the
    URL path segments the server expects.
    """

    api_version: str
    kind: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def __str__(self) -> str:
        return f"{self.kind}.{self.api_version}"

    @classmethod
    def of(cls, obj: dict[str, object]) -> Kind:
        """The kind of a JSON-shaped object, from its ``apiVersion`` and ``kind``."""
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if not isinstance(api_version, str) or not isinstance(kind, str) or not api_version or not kind:
            raise ValueError("the object has no apiVersion and kind")
        return cls(api_version, kind)


@dataclass(frozen=True, slots=True)
class Resource:
    """A served resource: where it lives in the URL space and what it supports."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    verbs: frozenset[str] = frozenset()
    subresources: frozenset[str] = frozenset()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The URL path of the collection, or of one object (and its subresource)."""
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"/namespaces/{namespace}")
        parts.append(f"/{self.plural}")
        if name:
            parts.append(f"/{name}")
            if subresource:
                parts.append(f"/{subresource}")
        return "".join(parts)
