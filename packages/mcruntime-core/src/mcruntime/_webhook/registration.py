"""Registration: each engaged cluster's webhook configurations point at that cluster's URL.

With certificates of its own, the server is the only one who knows its CA, so
it installs, in every engaged cluster, the ``ValidatingWebhookConfiguration``
and ``MutatingWebhookConfiguration`` (one webhook per registered kind, the URL
naming that cluster) and sets each converted CRD's
``spec.conversion.webhook.clientConfig``. It applies them again whenever a
handler is added or the CA bundle changes, and retries with the capped backoff
while a cluster refuses (its CRD not installed yet, say). Every
``verify_interval`` it reads them back and applies them again if another
writer deleted or edited them (a cleanup script, a Helm upgrade of the CRD),
which would otherwise leave that cluster's objects unchecked with nothing
said; the restore is logged, naming what had changed. Each cluster's loop
lives in the cluster's own task set, so it ends when the cluster does. A
configuration of a kind the server has no handlers for (left by an earlier
version) is emptied, not left to refuse writes with a CA nobody holds.

On disengage the configurations stay unless ``remove_on_disengage`` is set:
removing a validating webhook silently is a security decision, not a cleanup.
A CRD's conversion settings always stay: removed, the CRD falls back to the
``None`` strategy, under which a write in a version other than the storage
one silently loses the fields the storage schema lacks. A converted CRD a
cluster does not serve is skipped (the next check looks again), never allowed
to stop the others from being written.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import KindNotFound, NotFound
from .._base.kind import Kind
from .._fleet.cluster import Cluster
from .review import JSON

if TYPE_CHECKING:
    from .handlers import AdmissionHook
    from .server import WebhookServer

log = logging.getLogger("mcruntime.webhook")


class RegistrationFailed(Exception):
    """Several of a cluster's configurations could not be written (each named, with its error)."""


VALIDATING = Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
MUTATING = Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
CRD = Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
_REMOVE_TIMEOUT = 10.0


def webhook_name(kind: Kind, verb: str) -> str:
    """A webhook's name in its configuration: a DNS name of at least three labels, as required."""
    return f"{kind.kind.lower()}-{kind.version}.{kind.group or 'core'}.{verb}.mcruntime"


class Registrar:
    """Keeps every engaged cluster's webhook configurations in step with the server."""

    def __init__(self, server: WebhookServer, *, field_manager: str) -> None:
        self._server = server
        self.field_manager = field_manager
        self._changed = asyncio.Event()
        self.applied: dict[str, int] = {}
        """Per cluster, how many times its configurations were applied (tests and debugging)."""
        self.checked: dict[str, int] = {}
        """Per cluster, how many periodic checks read its registration back."""
        self.restored: dict[str, int] = {}
        """Per cluster, how many times a configuration changed or deleted by another writer was put back."""
        self.failing: dict[str, str] = {}
        """Per cluster whose last attempt failed, why (shown in ``/readyz``)."""
        self.backoff: Backoff = DEFAULT_BACKOFF
        self._generation = 0

    def changed(self) -> None:
        """Handlers or the CA bundle changed: every cluster applies its configurations again."""
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def engage(self, name: str, cluster: Cluster) -> None:
        """Keep ``cluster``'s configurations current for as long as it runs."""
        cluster.tasks.supervise(lambda: self._keep_current(name, cluster), "webhook-registration")
        if self._server.options.remove_on_disengage:
            cluster.on_stop(lambda: self._remove(name, cluster))
        else:
            cluster.on_stop(lambda: self._forget(name))

    def _forget(self, name: str) -> None:
        self.applied.pop(name, None)
        self.failing.pop(name, None)
        self.checked.pop(name, None)
        self.restored.pop(name, None)

    async def _keep_current(self, name: str, cluster: Cluster) -> None:
        failures = 0
        logged: str | None = None  # the kind of failure of this streak already at WARNING
        ours: set[str] = set()  # the objects (Kind/name) our applies have written in this cluster
        checking = False  # this round is the periodic check, not a change of ours
        while True:
            changed = self._changed
            try:
                wrote, drift = True, list[str]()
                if checking:
                    drift, appeared = await self._check(name, cluster, ours)
                    self.checked[name] = self.checked.get(name, 0) + 1
                    wrote = bool(drift or appeared)
                    if wrote:
                        self._report(name, drift, appeared)
                if wrote:
                    ours = set(await self.apply(name, cluster))
                if drift:
                    self.restored[name] = self.restored.get(name, 0) + 1
            except asyncio.CancelledError:
                raise
            except Exception as error:
                delay = self.backoff.delay(failures)
                failures += 1
                checking = False  # after a failure, apply in full rather than check
                self.failing[name] = f"{type(error).__name__}: {error}"
                # Once per kind of failure: a hung cluster, checked every interval and retried on
                # the backoff, would otherwise repeat it twice a minute (its /readyz line stays).
                before, logged = logged, type(error).__name__
                log.log(
                    logging.WARNING if before != logged else logging.DEBUG,
                    "cluster %r: webhook registration failed (%s: %s); retrying in %.1fs",
                    name,
                    type(error).__name__,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if failures:
                log.info("cluster %r: webhook registration succeeded after %d failure(s)", name, failures)
            failures, logged = 0, None
            self.failing.pop(name, None)
            if wrote:
                self.applied[name] = self.applied.get(name, 0) + 1
            checking = await self._until_next(changed)

    async def _check(self, name: str, cluster: Cluster, ours: set[str]) -> tuple[list[str], list[str]]:
        """Read what the registration should hold: what another writer changed, and what is new.

        Only the fields this manager sets are compared (the API server adds
        defaults, another manager may add its own webhooks), so a check of an
        untouched registration writes nothing.
        """
        drift: list[str] = []
        appeared: list[str] = []
        async for kind, object_name, wanted in self._wanted(name, cluster):
            key = f"{kind.kind}/{object_name}"
            live = await cluster.client.get_or_none(kind, object_name)
            if live is None:
                if kind != CRD:  # a CRD that is gone holds nothing to convert
                    drift.append(f"{key} (deleted)")
            elif key not in ours:
                appeared.append(key)
            elif not _holds(live, wanted):
                drift.append(f"{key} (changed)")
        return drift, appeared

    def _report(self, name: str, drift: list[str], appeared: list[str]) -> None:
        if drift:
            log.warning(
                "cluster %r: %s by another writer since this manager registered the webhooks; applying again",
                name,
                ", ".join(drift),
            )
        if appeared:  # a converted CRD installed after the last apply: its conversion is set now
            log.info("cluster %r: %s found; registering", name, ", ".join(appeared))

    async def _until_next(self, changed: asyncio.Event) -> bool:
        """Wait for a change of ours (``False``) or the next periodic check (``True``)."""
        interval = self._server.options.verify_interval
        if not interval:
            await changed.wait()
            return False
        try:
            # Spread over the last tenth of the interval: clusters engaged together check apart.
            async with asyncio.timeout(interval * random.uniform(0.9, 1.0)):  # noqa: S311
                await changed.wait()
        except TimeoutError:
            return True
        return False

    def _client_config(self, url: str) -> JSON:
        config: JSON = {"url": url}
        bundle = self._server.ca_bundle()
        if bundle is not None:
            config["caBundle"] = base64.b64encode(bundle).decode("ascii")
        return config

    async def _webhook(self, name: str, cluster: Cluster, hook: AdmissionHook, *, mutating: bool) -> JSON:
        plural = hook.resource or (await cluster.client.resource(hook.kind)).plural
        webhook: JSON = {
            "name": webhook_name(hook.kind, "mutate" if mutating else "validate"),
            "clientConfig": self._client_config(
                self._server.admission_url(name, hook.kind, mutating=mutating)
            ),
            "rules": [
                {
                    "apiGroups": [hook.kind.group],
                    "apiVersions": [hook.kind.version],
                    "resources": [plural],
                    "operations": list(hook.operations),
                    "scope": "*",
                }
            ],
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": hook.failure_policy,
            "timeoutSeconds": hook.timeout_seconds,
            "matchPolicy": "Equivalent",
        }
        if hook.namespace_selector is not None:
            webhook["namespaceSelector"] = hook.namespace_selector
        if hook.object_selector is not None:
            webhook["objectSelector"] = hook.object_selector
        if mutating:
            webhook["reinvocationPolicy"] = "Never"
        return webhook

    async def _wanted(self, name: str, cluster: Cluster) -> AsyncIterator[tuple[Kind, str, JSON]]:
        """Each object of ``cluster``'s registration, with what this manager sets in it.

        A configuration as applied whole (server-side), a CRD as the patch of
        its conversion settings. Discovery (a kind's plural) is asked as each
        is reached, so what comes before a kind the cluster does not serve yet
        is still written.
        """
        server = self._server
        configuration = server.options.configuration_name
        for kind, hooks, mutating in (
            (VALIDATING, server.validators, False),
            (MUTATING, server.defaulters, True),
        ):
            if hooks:
                webhooks = [
                    await self._webhook(name, cluster, hook, mutating=mutating) for hook in hooks.values()
                ]
                yield kind, configuration, _configuration(kind, configuration, webhooks)
        for conversion in list(server.conversions.values()):
            plural = conversion.resource
            if plural is None:
                hub = Kind(f"{conversion.group}/{conversion.hub}", conversion.kind)
                try:
                    plural = (await cluster.client.resource(hub)).plural
                except KindNotFound:
                    # As a missing CRD when the plural is given (see apply): it holds nothing to
                    # convert, and raising here would leave every later CRD with a stale CA bundle.
                    # The next check looks again.
                    log.debug("cluster %r: no CRD serves %s; not setting its conversion", name, hub)
                    continue
            patch = {
                "spec": {
                    "conversion": {
                        "strategy": "Webhook",
                        "webhook": {
                            "clientConfig": self._client_config(
                                server.conversion_url(name, conversion.group, conversion.kind)
                            ),
                            "conversionReviewVersions": ["v1"],
                        },
                    }
                }
            }
            yield CRD, f"{plural}.{conversion.group}", patch

    async def apply(self, name: str, cluster: Cluster) -> list[str]:
        """Install ``cluster``'s configurations and CRD conversion settings as they are now.

        Returns what was written, as ``Kind/name`` (a CRD the cluster does not
        have is not: it holds nothing to convert).
        """
        server = self._server
        configuration = server.options.configuration_name
        blocked: list[str] = []
        for kind, hooks in ((VALIDATING, server.validators), (MUTATING, server.defaulters)):
            if not hooks and (problem := await self._clear(name, cluster, kind, configuration)) is not None:
                blocked.append(problem)
        written: list[str] = []
        failed: list[Exception] = []  # each object on its own: one refused must not leave another stale
        async for kind, object_name, body in self._wanted(name, cluster):
            try:
                if kind != CRD:
                    await cluster.client.apply(body, field_manager=self.field_manager, force=True)
                else:
                    await cluster.client.patch(CRD, object_name, body, field_manager=self.field_manager)
            except NotFound:
                if kind != CRD:
                    raise
                # A cluster without the CRD holds no objects to convert (a fleet's hub often has
                # CRDs its members lack); retrying would fill the log. The next check looks again.
                log.debug("cluster %r: no CRD %s to set the conversion of", name, object_name)
                continue
            except Exception as error:
                failed.append(error)
                continue
            written.append(f"{kind.kind}/{object_name}")
        # After everything else was applied: the registration's line in /readyz, retried.
        if len(failed) == 1 and not blocked:
            raise failed[0]
        if failed:
            problems = [f"{type(error).__name__}: {error}" for error in failed] + blocked
            raise RegistrationFailed("; ".join(problems)) from failed[0]
        if blocked:
            raise PermissionError("; ".join(blocked))
        return written

    async def _clear(self, name: str, cluster: Cluster, kind: Kind, configuration: str) -> str | None:
        """Empty the configuration of a kind this server no longer has handlers for.

        An earlier version of the operator (one that had a defaulter, say) left
        it: its webhooks point at paths this server answers with 404, signed by
        a CA it may no longer have, and with ``failurePolicy: Fail`` they refuse
        every write they match. Applying it with no webhooks drops the entries
        this field manager applied (it needs no right to delete); the object is
        harmless without them and is used again if handlers come back. Returns
        what stands in the way when it may not (shown in ``/readyz``).
        """
        # The generated RBAC grants get and patch on this one name; narrower RBAC may not. Asked
        # first, so that a refused read is not recorded as a missing permission of the cluster.
        if not await _may(cluster, "get", kind, configuration):
            log.debug("cluster %r: may not read %s %r; not clearing it", name, kind.kind, configuration)
            return None
        try:
            existing = await cluster.client.get(kind, configuration)
        except NotFound:
            return None
        if not existing.get("webhooks"):
            return None
        if not await _may(cluster, "patch", kind, configuration):
            return (
                f"{kind.kind} {configuration!r} holds webhooks of an earlier version that this server "
                "no longer serves, and this identity may not patch it: delete it, or grant patch"
            )
        manifest = _configuration(kind, configuration, [])
        left = await cluster.client.apply(manifest, field_manager=self.field_manager, force=True)
        kept = [webhook.get("name") for webhook in left.get("webhooks") or [] if isinstance(webhook, dict)]
        if kept:
            log.warning(
                "cluster %r: %s %r still holds webhooks %s that another field manager applied; "
                "this manager serves none of that kind",
                name,
                kind.kind,
                configuration,
                kept,
            )
        else:
            log.info(
                "cluster %r: emptied %s %r: this manager serves no webhook of that kind now",
                name,
                kind.kind,
                configuration,
            )
        return None

    async def _remove(self, name: str, cluster: Cluster) -> None:
        # Only the kinds this server registers (the generated RBAC grants delete on those alone),
        # each on its own: a failure to remove one must not leave the other behind.
        server = self._server
        configuration = server.options.configuration_name
        served = ((VALIDATING, server.validators), (MUTATING, server.defaulters))
        for kind in [kind for kind, hooks in served if hooks]:
            try:
                async with asyncio.timeout(_REMOVE_TIMEOUT):
                    with contextlib.suppress(NotFound):
                        await cluster.client.delete(kind, configuration)
            except Exception as error:
                log.warning(
                    "cluster %r: removing %s %r on disengage failed: %s",
                    name,
                    kind.kind,
                    configuration,
                    error,
                )
            else:
                log.info("cluster %r: removed %s %r on disengage", name, kind.kind, configuration)
        self._forget(name)


def _holds(live: Any, wanted: Any) -> bool:
    """Whether ``live`` has every field ``wanted`` sets, as it sets it.

    Fields ``live`` adds are allowed (server defaults); list items named
    ``name`` (webhooks) are matched by name, so another manager's own entries
    are allowed too; other lists must match item by item.
    """
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(
            key in live and _holds(live[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        if not isinstance(live, list):
            return False
        if all(isinstance(item, dict) and "name" in item for item in wanted):
            named = {item.get("name"): item for item in live if isinstance(item, dict)}
            return all(_holds(named.get(item["name"]), item) for item in wanted)
        return len(live) == len(wanted) and all(map(_holds, live, wanted))
    return bool(live == wanted)


def _configuration(kind: Kind, name: str, webhooks: list[JSON]) -> dict[str, Any]:
    """A webhook configuration as this manager applies it (server-side, one field manager)."""
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "mcruntime"}},
        "webhooks": webhooks,
    }


ACCESS_REVIEW = Kind("authorization.k8s.io/v1", "SelfSubjectAccessReview")


async def _may(cluster: Cluster, verb: str, kind: Kind, name: str) -> bool:
    """Whether this identity may ``verb`` the named object (every authenticated user may ask)."""
    review = await cluster.client.create(
        {
            "apiVersion": ACCESS_REVIEW.api_version,
            "kind": ACCESS_REVIEW.kind,
            "spec": {
                "resourceAttributes": {
                    "group": kind.group,
                    "resource": (await cluster.client.resource(kind)).plural,
                    "verb": verb,
                    "name": name,
                }
            },
        }
    )
    status = review.get("status")
    return isinstance(status, dict) and status.get("allowed") is True
