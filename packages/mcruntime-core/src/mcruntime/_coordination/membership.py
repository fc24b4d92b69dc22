"""Who is in the shard group: the peer Leases, this replica's own, and when a peer counts as gone.

Each replica renews one peer Lease (from the heartbeat's thread) and watches
everyone else's. A peer is live while this replica has seen its Lease change
within ``lease_duration`` on its own monotonic clock, unless another peer's
Lease names it silent at the very version seen here (below); silence is
confirmed by a fresh read before anyone acts on it. Survivors collect the
Leases of peers silent for ``peer_gc_after``.

Each replica also writes on its own peer Lease, at no extra write, the peers
it has watched silent for a full term, each with the ``resourceVersion`` it
watched unchanged. A replica that joins after a crash sees the dead peer's
leftover Lease for the first time, and would otherwise count it live for a
whole term of its own, while the survivors, who know it is dead, hand the
newcomer shards the newcomer believes are the dead peer's: those clusters
would go unworked for a ``lease_duration``. A peer Lease still at a version a
peer watched unchanged for a term has not been renewed since, so its holder
stopped working long ago (``renew_deadline < lease_duration``): the newcomer
counts it gone at once. Only versions are compared, never clocks, and a
fence is taken on that ground only when a fresh read shows the same version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._base.errors import AlreadyExists, Conflict, NotFound
from .._base.objects import JSON
from .lease import LEASE, Observed, holder_of, lease_object, renew_time_of, take, version_of
from .rendezvous import owner
from .shardhub import (
    API_ERRORS,
    GROUP_LABEL,
    ROLE_LABEL,
    SHARDS_ANNOTATION,
    SILENT_ANNOTATION,
    WEIGHT_ANNOTATION,
    HubWrites,
    ShardingConfig,
)

if TYPE_CHECKING:
    from .._client.client import Client

log = logging.getLogger("mcruntime.sharding")

MAX_CLAIMS = 32
"""Silent peers one peer Lease names at most (crashed replicas whose Leases are not collected yet)."""
_MAX_CLAIMS_TEXT = 16_384  # another replica's annotation: never parsed at length
_MAX_IDENTITY = 253


@dataclass
class Peer:
    """A peer Lease as last seen, and when its renewal last changed here."""

    observed: Observed
    lease: JSON
    weight: float = 1.0
    shards: str = ""  # the shard count it announces ("" from a release without shard fences)
    claims: dict[str, str] = field(default_factory=dict)  # peers it found silent → the version it watched

    @property
    def version(self) -> str:
        return version_of(self.lease)


def read_claims(text: object) -> dict[str, str]:
    """The silent peers another replica names on its peer Lease (identity → version); garbage is none."""
    if not isinstance(text, str) or not text or len(text) > _MAX_CLAIMS_TEXT:
        return {}
    try:
        found = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(found, dict):
        return {}
    claims = {
        identity: version
        for identity, version in found.items()
        if isinstance(identity, str) and isinstance(version, str) and identity and version
    }
    return dict(list(claims.items())[:MAX_CLAIMS])


class Membership:
    """The group as this replica sees it, and this replica's own peer Lease.

    ``on_renewal`` runs on the main loop after each successful renewal of the
    peer Lease (the renewal itself runs on the heartbeat's thread).
    """

    def __init__(self, config: ShardingConfig, hub: HubWrites, on_renewal: Callable[[], None]) -> None:
        self.config = config
        self.identity = config.identity
        self.hub = hub
        self.on_renewal = on_renewal
        self.peers: dict[str, Peer] = {}
        self.peer_names: dict[str, str] = {}  # peer Lease name → identity
        self.gone: dict[str, float] = {}  # identity → when its peer Lease was seen deleted
        # Per round: (holder, a full term seen here) → whether a fresh read confirmed it silent.
        self.confirmed: dict[tuple[str, bool], asyncio.Future[bool]] = {}
        self.peer_lease: JSON | None = None
        self.renewed_at: float | None = None  # written by the heartbeat's thread
        # Renewals that came after the renew deadline had passed (written by the heartbeat's
        # thread, before renewed_at): our fences may have been taken meanwhile, so a late
        # renewal must not make them good again. The watchdog drops everything for each one
        # and then counts it here.
        self.lapses = 0
        self.lapses_handled = 0
        self.main_loop: asyncio.AbstractEventLoop | None = None
        # Why the last renewal failed (the hub's answer, no answer, no such namespace); None
        # after a good one. Written by the heartbeat's thread; shown by /readyz while not alive.
        self.trouble: str | None = None
        # Since when this replica has heard the hub without a break: its first renewal, or the
        # first after a lapse (written by the heartbeat's thread). A peer's silence counts only
        # from here: while the hub was gone for this replica, everyone looked silent to it.
        self.heard_since: float | None = None
        # The peers this replica names silent on its own peer Lease (identity → the version it
        # watched unchanged for a term): set by the round, written by the next renewal.
        self.claims: dict[str, str] = {}
        # Why each holder was last confirmed silent (for the line that takes its fences).
        self.why_silent: dict[str, str] = {}

    # --- what the informer tells us -------------------------------------------------------

    def observe(
        self,
        name: str,
        holder: str,
        renew_time: str,
        weight_text: Any,
        lease: JSON,
        shards_text: str = "",
        claims_text: object = "",
    ) -> bool:
        """Record a peer Lease as watched; whether it is a peer that was not known before."""
        now = time.monotonic()
        try:
            weight = float(weight_text)
        except ValueError:
            weight = 1.0
        if shards_text and not (shards_text.isdigit() and len(shards_text) <= 6):
            shards_text = "unreadable"  # another replica's annotation: never quoted at length
        claims = read_claims(claims_text)
        peer = self.peers.get(holder)
        self.peer_names[name] = holder
        self.gone.pop(holder, None)
        if peer is None:
            weight = weight if weight > 0 else 1.0
            self.peers[holder] = Peer(Observed(holder, renew_time, now), lease, weight, shards_text, claims)
            return True
        peer.observed.see(holder, renew_time, now)
        peer.lease = lease
        peer.shards = shards_text
        peer.claims = claims
        return False

    def forget(self, name: str) -> bool:
        """A peer Lease was deleted; whether it was one."""
        identity = self.peer_names.pop(name, None)
        if identity is None:
            return False
        self.peers.pop(identity, None)
        self.gone[identity] = time.monotonic()
        return True

    # --- liveness -------------------------------------------------------------------------

    def alive(self, now: float) -> bool:
        """Whether this replica renewed its own peer Lease within ``renew_deadline``, without a lapse since.

        A renewal that succeeds only after the deadline has passed makes
        ``renewed_at`` fresh again, but the fences it guarded may already be
        another replica's: until the watchdog has dropped them (and the round
        takes them again, through a write that fails if anyone moved first),
        this replica is not alive for its work.
        """
        renewed = self.renewed_at
        return (
            renewed is not None
            and now - renewed < self.config.renew_deadline
            and self.lapses == self.lapses_handled
        )

    def refusal(self) -> str | None:
        """Why this replica's work must stop now (``None`` while it is alive); for the work gate."""
        now = time.monotonic()
        if self.alive(now):
            return None
        renewed = self.renewed_at
        if renewed is None:
            return f"shard group {self.config.name!r}: this replica has not renewed its peer Lease yet"
        if self.lapses != self.lapses_handled:
            return (
                f"shard group {self.config.name!r}: this replica's peer Lease went unrenewed for more "
                f"than {self.config.renew_deadline:g}s, so its shards may have moved"
            )
        return (
            f"shard group {self.config.name!r}: this replica has not renewed its peer Lease for "
            f"{now - renewed:.1f}s (deadline {self.config.renew_deadline:g}s), so its shards may move"
        )

    def live_peers(self, now: float) -> dict[str, float]:
        """Live peers (identity → weight), this replica included while it is alive."""
        peers: dict[str, float] = {}
        for identity, peer in self.peers.items():
            if identity != self.identity and self._live(identity, peer, now):
                peers[identity] = peer.weight
        if self.alive(now):
            peers[self.identity] = self.config.weight
        return peers

    def _live(self, identity: str, peer: Peer, now: float) -> bool:
        """Whether ``peer`` counts as live: heard within a term here, and named silent by nobody since."""
        return self.quiet(peer, now) <= self.config.lease_duration and self.silenced_by(identity) is None

    def quiet(self, peer: Peer, now: float) -> float:
        """How long ``peer`` has been silent while this replica could hear the hub."""
        heard = self.heard_since
        quiet = peer.observed.quiet_for(now)
        return quiet if heard is None else min(quiet, now - heard)

    def silenced_by(self, identity: str) -> str | None:
        """The peer whose Lease names ``identity`` silent at the version of its peer Lease seen here, if any.

        That peer watched this very version unchanged for a full term: the
        holder has not renewed since, so it stopped working at its renew
        deadline, long before now.
        """
        peer = self.peers.get(identity)
        version = "" if peer is None else peer.version
        if not version:
            return None
        for claimant, other in self.peers.items():
            if claimant != identity and other.claims.get(identity) == version:
                return claimant
        return None

    def silent_peers(self, now: float) -> dict[str, str]:
        """The peers this replica watched silent for a full term (identity → version), to name on its Lease.

        Nothing while this replica is not alive: without its own renewals it
        may not have heard the hub, so everyone would look silent to it.
        """
        if not self.alive(now):
            return {}
        found: dict[str, str] = {}
        for identity, peer in sorted(self.peers.items()):
            version = peer.version
            if (
                identity != self.identity
                and version
                and len(identity) <= _MAX_IDENTITY
                and self.quiet(peer, now) > self.config.lease_duration
            ):
                found[identity] = version
                if len(found) == MAX_CLAIMS:
                    break
        return found

    def disagreeing(self, now: float) -> dict[str, str]:
        """Live peers that announce another shard count than this replica's (identity → theirs).

        Two counts split the fleet two ways with fences of different names, so
        neither would fence the other off a cluster: nobody takes a fence while
        a live peer disagrees.
        """
        ours = str(self.config.shards)
        return {
            identity: peer.shards
            for identity, peer in self.peers.items()
            if identity != self.identity and peer.shards != ours and self._live(identity, peer, now)
        }

    def last_sign_of_life(self, holder: str, since: float | None) -> float:
        """The latest moment this replica knows ``holder`` may have been working.

        ``since`` is when a fence ``holder`` holds was last seen to change, if any.
        This replica's own return to the hub counts as one: a peer it could not
        hear while the hub was gone (for it, or for everyone: a hub that hung)
        gets a full term from then before its fences are taken. Without it,
        both replicas of a hung hub found each other silent when it answered
        again, and took each other's fences while both were alive.
        """
        signs = [self.gone.get(holder, float("-inf"))]
        if self.heard_since is not None:
            signs.append(self.heard_since)
        peer = self.peers.get(holder)
        if peer is not None:
            signs.append(peer.observed.since)
        if since is not None:
            signs.append(since)
        return max(signs)

    async def holder_silent(self, holder: str, since: float | None, now: float) -> bool:
        """Whether ``holder`` has been silent for a full term, confirmed by a fresh read of its peer Lease.

        A full term as observed here, or as a peer observed it: a peer whose
        Lease names ``holder`` silent at the version of ``holder``'s peer Lease
        seen here. The informer may lag; the read makes sure a renewal we have
        not watched yet is not mistaken for silence (for a peer's word, the
        read must show the very version it named). One read per holder per round.
        """
        claimant = self.silenced_by(holder)
        peer = self.peers.get(holder)
        claimed = (claimant, peer.version) if claimant is not None and peer is not None else None
        waited = now - self.last_sign_of_life(holder, since) > self.config.lease_duration
        if not waited and claimed is None:
            return False
        key = (holder, waited)
        if key not in self.confirmed:
            # Every cluster of a dead holder asks at once: one read answers them all.
            self.confirmed[key] = asyncio.ensure_future(
                self._confirm_silent(holder, now, waited=waited, claimed=claimed)
            )
        return await asyncio.shield(self.confirmed[key])

    async def _confirm_silent(
        self, holder: str, now: float, *, waited: bool = True, claimed: tuple[str, str] | None = None
    ) -> bool:
        """Read ``holder``'s peer Lease: silent if unchanged a term here (``waited``) or still ``claimed``.

        ``claimed`` is the peer that named ``holder`` silent and the version it named.
        """
        assert self.hub.client is not None
        silent = False
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                current = await self.hub.client.get(
                    LEASE, self.config.peer_lease(holder), namespace=self.config.namespace
                )
        except API_ERRORS as error:
            if not isinstance(error, NotFound):
                log.warning(
                    "sharding %s: could not read the peer Lease of %r: %s",
                    self.config.name,
                    holder,
                    self.hub.why(error),
                )
                return False
            if holder in self.gone and waited:
                silent = True  # its deletion was watched a full term ago
                self.why_silent[holder] = "its peer Lease was deleted a full term ago"
            elif holder not in self.gone:
                self.gone[holder] = time.monotonic()  # deleted unseen: count the term from now
        else:
            peer = self.peers.get(holder)
            if claimed is not None and version_of(current) == claimed[1]:
                # Not written since a peer watched it unchanged for a full term.
                silent = True
                self.why_silent[holder] = (
                    f"its peer Lease has not changed since peer {claimed[0]!r} found it silent for "
                    f"a full term ({self.config.lease_duration:g}s)"
                )
            elif peer is None:
                self.peers[holder] = Peer(Observed(holder, renew_time_of(current), now), current)
            else:
                unchanged = not peer.observed.see(holder_of(current) or holder, renew_time_of(current))
                silent = unchanged and waited
                if silent:
                    self.why_silent[holder] = (
                        f"its peer Lease has not been renewed for {peer.observed.quiet_for(now):.1f}s here"
                    )
        return silent

    # --- the peer Lease ---------------------------------------------------------------------

    async def renew(self, client: Client) -> None:
        """Renew (or create) the peer Lease; runs on the heartbeat's thread."""
        started = time.monotonic()
        current = self.peer_lease
        creating = current is None
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                if current is None:
                    self.peer_lease = await self._create_or_take(client)
                else:
                    lease = self._naming_silent(take(current, self.identity, self.config.lease_duration))
                    self.peer_lease = await self.hub.write("peer-renew", lambda: client.update(lease))
        except NotFound as error:
            self.peer_lease = None
            if creating:  # the create's 404: the namespace is not there
                self._troubled(f"its namespace {self.config.namespace!r} does not exist ({error})")
            else:
                name = self.config.name
                log.info("sharding %s: this replica's peer Lease was deleted; creating it again", name)
            return
        except Conflict:
            self.peer_lease = None  # someone touched it; read it again next round
            return
        except TimeoutError:
            self._troubled(f"no answer from the hub within {self.hub.request_timeout:g}s")
            return
        except API_ERRORS as error:
            self._troubled(str(error))
            return
        if self.trouble is not None:
            log.info("sharding %s: renewed this replica's peer Lease again", self.config.name)
            self.trouble = None
        previous = self.renewed_at
        lapsed = previous is not None and time.monotonic() - previous >= self.config.renew_deadline
        if previous is None or lapsed:
            self.heard_since = started  # hearing starts (again); before renewed_at, as the lapse
        if lapsed:
            self.lapses += 1  # before renewed_at: whoever sees the fresh renewal sees the lapse too
        self.renewed_at = started
        if self.main_loop is not None:
            with contextlib.suppress(RuntimeError):  # the main loop closed: nobody left to tell
                self.main_loop.call_soon_threadsafe(self.on_renewal)

    def _troubled(self, reason: str) -> None:
        """Record why the renewal failed; a warning when the reason changes, not at every attempt."""
        if reason != self.trouble:
            name = self.config.name
            log.warning("sharding %s: could not renew this replica's peer Lease: %s", name, reason)
        self.trouble = reason

    def _naming_silent(self, lease: JSON) -> JSON:
        """``lease`` (our peer Lease, about to be written) naming the peers this replica found silent."""
        meta = dict(lease.get("metadata") or {})
        annotations = dict(meta.get("annotations") or {})
        claims = self.claims  # set by the round on the main loop; a fresh dict each time
        if claims:
            annotations[SILENT_ANNOTATION] = json.dumps(claims, sort_keys=True, separators=(",", ":"))
        else:
            annotations.pop(SILENT_ANNOTATION, None)
        meta["annotations"] = annotations
        return {**lease, "metadata": meta}

    async def _create_or_take(self, client: Client) -> JSON | None:
        name = self.config.peer_lease(self.identity)
        fresh = lease_object(
            name,
            self.config.namespace,
            self.identity,
            self.config.lease_duration,
            labels={GROUP_LABEL: self.config.name, ROLE_LABEL: "peer"},
            annotations={
                WEIGHT_ANNOTATION: repr(self.config.weight),
                SHARDS_ANNOTATION: str(self.config.shards),
            },
        )
        fresh = self._naming_silent(fresh)
        try:
            return await self.hub.write("peer-renew", lambda: client.create(fresh))
        except AlreadyExists:
            current = await client.get(LEASE, name, namespace=self.config.namespace)
            current["metadata"]["annotations"] = fresh["metadata"]["annotations"]
            renewed = self._naming_silent(take(current, self.identity, self.config.lease_duration))
            return await self.hub.write("peer-renew", lambda: client.update(renewed))

    async def withdraw(self) -> None:
        """Delete this replica's peer Lease on a graceful stop; survivors collect it otherwise."""
        if self.peer_lease is None or self.hub.client is None:
            return
        client = self.hub.client
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                await self.hub.write(
                    "peer-leave",
                    lambda: client.delete(
                        LEASE, self.config.peer_lease(self.identity), namespace=self.config.namespace
                    ),
                )
        except NotFound:
            pass
        except Exception as error:  # shutdown goes on; survivors collect it later
            log.warning("sharding %s: could not withdraw the peer Lease: %r", self.config.name, error)

    # --- collecting -------------------------------------------------------------------------

    async def collect_dead(self, live: dict[str, float], now: float) -> None:
        """Delete peer Leases silent for ``peer_gc_after``; one survivor does it, with a precondition.

        The delete names the resourceVersion this replica watched unchanged,
        so a peer that renewed meanwhile (it was alive after all) keeps its
        Lease: the delete fails with a Conflict.
        """
        for identity, peer in list(self.peers.items()):
            if identity == self.identity or peer.observed.quiet_for(now) <= self.config.peer_gc_after:
                continue
            if owner(f"peer-gc\x00{identity}", live) != self.identity:
                continue  # another survivor collects this one
            if not await self.hub.delete_as_seen("peer-gc", peer.lease, "a dead peer's Lease"):
                continue
            log.info(
                "sharding %s: deleted the peer Lease of %r, silent for %.0fs",
                self.config.name,
                identity,
                peer.observed.quiet_for(now),
            )

    def prune_gone(self, now: float) -> None:
        """Forget departures older than anyone still needs to count a term from."""
        horizon = self.config.peer_gc_after + self.config.lease_duration
        for identity, moment in list(self.gone.items()):
            if now - moment > horizon:
                del self.gone[identity]
