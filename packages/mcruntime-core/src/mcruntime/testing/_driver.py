"""What the conformance suite asks of a provider's tests: a driver and its targets.

The suite cannot know where a provider finds its clusters (a Secret on a hub, a
file, ``kind get clusters``), so each provider's tests supply a *driver* that
edits that source: make a cluster appear, change it, break it, make it
disappear. The suite says what the source should contain as a :class:`Target`
(a testbed control plane, a user, and optionally a way of being broken) and
checks what the provider does about it against real API servers.
"""

from __future__ import annotations

import abc
import base64
import enum
import functools
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import mcruntime as mcr

from ._controlplane import ControlPlane, User
from ._net import LOOPBACK, free_port
from ._pki import CertificateAuthority


class Capability(enum.Enum):
    """Something a provider's source can do; a driver lists those it cannot, with a reason."""

    RUNTIME_CHANGES = "clusters appear, change and disappear while the provider runs"
    MULTIPLE_CLUSTERS = "the source holds more than one cluster"
    CREDENTIAL_CHANGE = "a cluster's credential changes while its endpoint stays the same"
    DUPLICATE_NAMES = "two entries of the source can claim the same cluster name"
    OWN_CONNECTION = "each cluster has a connection of its own, which its source can point elsewhere or break"
    UNPARSEABLE_SOURCE = "an entry of the source can be made unparseable (not YAML, not base64)"


class Breakage(enum.Enum):
    """How a :class:`Target` is broken. Each must make the cluster unhealthy, never gone."""

    UNREACHABLE = "unreachable"
    """Nothing listens at the endpoint (a closed loopback port): connections are refused."""
    UNTRUSTED_CA = "untrusted-ca"
    """A well-formed CA that did not sign the server's certificate: verification fails."""
    MALFORMED_CA = "malformed-ca"
    """CA data that is valid base64 but no certificate at all."""
    BAD_CREDENTIAL = "bad-credential"
    """A bearer token the API server does not know: every request answers 401."""


@functools.cache
def _foreign_ca_pem() -> bytes:
    """A CA no testbed control plane uses (made once per process: key generation costs)."""
    return CertificateAuthority("mcruntime-conformance-foreign").cert_pem


BAD_TOKEN_PREFIX = "conformance-invalid-"  # noqa: S105 - a prefix, not a credential
"""How a :attr:`Breakage.BAD_CREDENTIAL` token starts; only the random rest is secret."""

_MALFORMED_CA_PEM = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


@dataclass(frozen=True)
class Target:
    """What the source should say about one cluster: where it is and who we are there.

    Build one with :meth:`of`. Drivers that speak kubeconfigs use
    :meth:`kubeconfig`; others pick the parts they need (``server``,
    ``ca_pem``, ``user_entry()``). Credentials stay out of ``repr``.
    """

    plane: ControlPlane
    user: User
    server: str
    ca_pem: bytes = field(repr=False)
    breakage: Breakage | None = None
    _bad_token: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, plane: ControlPlane, user: User | None = None, breakage: Breakage | None = None) -> Target:
        """Point at ``plane`` as ``user`` (its static token user by default), broken as asked.

        The token user is the default because every provider can express a
        bearer token (KubeFed's Secrets hold nothing else).
        """
        who = user or plane.token_user
        server = plane.server
        ca_pem = plane.ca.cert_pem
        bad_token = None
        if breakage is Breakage.UNREACHABLE:
            server = f"https://{LOOPBACK}:{free_port()}"
        elif breakage is Breakage.UNTRUSTED_CA:
            ca_pem = _foreign_ca_pem()
        elif breakage is Breakage.MALFORMED_CA:
            ca_pem = _MALFORMED_CA_PEM
        elif breakage is Breakage.BAD_CREDENTIAL:
            bad_token = f"{BAD_TOKEN_PREFIX}{secrets.token_urlsafe(16)}"
        return cls(plane, who, server, ca_pem, breakage, bad_token)

    @property
    def token(self) -> str | None:
        """The bearer token the source should carry (``None`` for a certificate user)."""
        if self._bad_token is not None:
            return self._bad_token
        return self.user.token

    def user_entry(self) -> dict[str, str]:
        """The kubeconfig ``user`` entry: a token, or client certificate and key data."""
        token = self.token
        if token is not None:
            return {"token": token}
        return self.user.kubeconfig_entry()

    def kubeconfig(self) -> dict[str, Any]:
        """A complete kubeconfig (one context, current) for this target."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.plane.name,
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(self.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "conformance", "user": self.user_entry()}],
            "contexts": [
                {"name": "conformance", "context": {"cluster": self.plane.name, "user": "conformance"}}
            ],
            "current-context": "conformance",
        }

    def config(self, trust: mcr.TrustPolicy | None = None) -> mcr.ClusterConfig:
        """The target as a :class:`~mcruntime.ClusterConfig`, for drivers of code-fed providers."""
        return mcr.kubeconfig_from_dict(
            self.kubeconfig(), trust=trust or mcr.TrustPolicy.untrusted(), origin=f"target {self.plane.name}"
        )


class ProviderDriver(abc.ABC):
    """A provider's tests implement this so the conformance suite can run against it.

    One driver per test (a function-scoped fixture). The suite first describes
    the initial source with :meth:`add`, then calls :meth:`build` and runs the
    provider in a :class:`~mcruntime.Manager`; while it runs, it changes the
    source through the other methods, unless :attr:`unsupported` says the
    source cannot do that. Names passed to the driver are short DNS labels
    (``alpha``, ``beta``, ...); :meth:`engaged_name` says what the provider
    calls the cluster.
    """

    unsupported: ClassVar[Mapping[Capability, str]] = {}
    """Capabilities this provider's source does not have, each with the reason (shown on skip)."""

    # --- the provider ------------------------------------------------------------------

    @abc.abstractmethod
    def build(self) -> mcr.Provider:
        """A new provider over the source as it is now.

        May be called more than once (the suite checks that a second provider
        over the same source names clusters the same way). Use small probe
        intervals and :data:`~mcruntime.testing.conformance.CLUSTER_OPTIONS`
        so that broken clusters are noticed quickly.
        """

    def engaged_name(self, name: str) -> str:
        """The name the provider engages the source's cluster ``name`` under."""
        return name

    @abc.abstractmethod
    def status(self, name: str) -> mcr.ClusterStatus | None:
        """The latest provider's status of cluster ``name`` (source name); ``None`` when unknown."""

    def use_namespace(self, namespace: str) -> None:
        """Told first: the namespace the case keeps its objects in, on every control plane.

        Most drivers ignore it. A driver whose clusters are namespaces of one
        API server makes the case's cluster that namespace, so its
        reconciler sees the objects the case writes.
        """
        return None

    # --- the source --------------------------------------------------------------------

    @abc.abstractmethod
    async def add(self, name: str, target: Target) -> None:
        """Make cluster ``name`` appear in the source, pointing at ``target``."""

    async def change(self, name: str, target: Target) -> None:
        """Change cluster ``name``'s connection (endpoint, CA, user) to ``target``."""
        await self.add(name, target)

    async def change_credential(self, name: str, target: Target) -> None:
        """Change only the credential of ``name``; ``target`` has the same plane, another user."""
        await self.change(name, target)

    async def break_cluster(self, name: str, target: Target) -> None:
        """Make ``name`` point at a broken ``target`` (see :class:`Breakage`)."""
        await self.change(name, target)

    async def touch(self, name: str, target: Target) -> None:
        """Re-state ``name`` without changing its content (rewrite, bump unrelated metadata).

        The provider must notice nothing worth re-engaging.
        """
        await self.change(name, target)

    async def corrupt(self, name: str) -> None:
        """Make the source's entry for ``name`` unparseable, as a half-saved or mistyped edit would.

        A file that is no YAML, a Secret whose kubeconfig is no YAML, a token
        that is no base64: whatever "cannot be read" means for this source.
        The provider must keep the cluster on its last good config and report
        the problem (rule 1: only the source says gone). Implement it, or list
        :attr:`Capability.UNPARSEABLE_SOURCE` in :attr:`unsupported` with the
        reason (a provider fed from code parses nothing).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not implement corrupt(): implement it, or list "
            "Capability.UNPARSEABLE_SOURCE in `unsupported` with the reason"
        )

    @abc.abstractmethod
    async def remove(self, name: str) -> None:
        """Make cluster ``name`` disappear from the source (the authoritative signal)."""

    async def add_duplicate(self, name: str, target: Target) -> None:
        """Add a second entry to the source that claims the name ``name``.

        Only called when :attr:`unsupported` does not list
        :attr:`Capability.DUPLICATE_NAMES`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement add_duplicate")

    def duplicate_reported(self, name: str) -> bool:
        """Whether the provider reports ``name`` as claimed twice (a source with ``duplicate_of``)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement duplicate_reported")

    async def settle(self) -> None:
        """Return once the provider has acted on every change made to the source so far.

        The suite calls it before checking that something did *not* happen.
        A provider fed from code has nothing to wait for; a watching provider
        waits until it has processed the latest version of what the driver
        wrote; a polling provider waits for a full poll after the last change.
        """
        return None  # fed from code: every change is applied by the time the call returns
