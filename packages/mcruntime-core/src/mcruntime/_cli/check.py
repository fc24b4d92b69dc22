"""``--check``: what a built manager would run, and whether it can run at all, without connecting.

Run in CI or as an init step, it catches what otherwise shows up only once
the pod is up: a controller with nothing to watch, a manager with nothing to
run, flags that the factory never applied. It reads the manager's
configuration only; no cluster is contacted (a factory that connects while
building does so before the check, as it would in ``run``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._control.source import KindSource
from .._manager.manager import Manager
from .._manager.settings import ManagerSettings
from .options import flag_of, variable_of


def describe(manager: Manager) -> list[str]:
    """One line per thing the manager would run: provider, controllers and their sources, endpoints."""
    provider = "none (local cluster only)"
    if manager.provider is not None:
        provider = type(manager.provider).__name__
    lines = [f"provider: {provider}"]
    for name, controller in sorted(manager.controllers.items()):
        watched = [_source(source, manager.has_provider) for source in controller.sources]
        watched += ["a channel"] * len(controller.channels)
        lines.append(f"controller {name}: watches {', '.join(watched) or 'nothing'}")
    settings = manager.settings
    if settings is not None:
        lines.append(f"metrics: {settings.metrics_bind_address or 'off'}")
        lines.append(f"probes: {settings.health_probe_bind_address or 'off'}")
        if settings.leader_election:
            where = f"{settings.leader_election_namespace}/{settings.leader_election_id}"
            lines.append(f"leader election: Lease {where}")
        if settings.sharding:
            lines.append(f"sharding: group {settings.shard_group} in {settings.shard_namespace}")
    webhooks = _webhooks(manager)
    if webhooks is not None:
        lines.append(webhooks)
    return lines


def _webhooks(manager: Manager) -> str | None:
    """Where the webhook server listens and what it serves; ``None`` when it would not run."""
    server = manager.webhook  # built, never started: --check exits before anything runs
    if not server.has_handlers and (manager.settings is None or manager.settings.webhook_options() is None):
        return None
    served = [f"validates {kind.kind} ({kind.api_version})" for kind in server.validators]
    served += [f"defaults {kind.kind} ({kind.api_version})" for kind in server.defaulters]
    served += [f"converts {kind}.{group}" for group, kind in server.conversions]
    return f"webhooks: {server.options.address}: {', '.join(served) or 'nothing registered'}"


def _source(source: KindSource, has_provider: bool) -> str:
    clusters = source.clusters
    local = clusters.local if clusters.local is not None else not has_provider
    members = clusters.provider if clusters.provider is not None else has_provider
    where = {(True, True): "every cluster", (True, False): "the hub", (False, True): "the members"}
    scope = where.get((local, members), "no cluster")
    filtered = ", filtered" if clusters.filter is not None else ""
    return f"{source.kind.kind} ({source.kind.api_version}) in {scope}{filtered}"


def problems(
    manager: Manager,
    flags: Mapping[str, object],
    settings: ManagerSettings | None = None,
    environment: Mapping[str, str] = os.environ,
) -> list[str]:
    """What makes this manager unfit to run; empty when it passes."""
    found = []
    if not manager.controllers and not manager.provider:
        found.append("the manager has no controllers and no provider: it would run nothing")
    for name, controller in sorted(manager.controllers.items()):
        if not controller.sources and not controller.channels:
            found.append(f"controller {name!r} has no source: nothing would ever be reconciled")
        for source in controller.sources:
            if _source(source, manager.has_provider).endswith("in no cluster"):
                found.append(f"controller {name!r} watches {source.kind.kind} in no cluster")
    ignored = ignored_flags(manager, flags, settings, environment)
    if ignored is not None:
        found.append(ignored)
    return found


APPLIED_BY_THE_COMMAND = frozenset({"log_level", "log_format", "event_loop"})
"""Settings the command applies itself (logging, the loop), whatever the factory does with the rest."""


def ignored_flags(
    manager: Manager,
    flags: Mapping[str, object],
    settings: ManagerSettings | None = None,
    environment: Mapping[str, str] = os.environ,
) -> str | None:
    """Why the settings given never reached ``manager`` (its factory ignored settings); ``None`` if they did.

    Flags, and ``MCRUNTIME_*`` variables whose value is not the default (what
    a Deployment sets: ``MCRUNTIME_LEADER_ELECTION=true`` ignored would leave
    two active replicas, in silence). Settings in :data:`APPLIED_BY_THE_COMMAND`
    took effect before the factory ran, so a factory without settings does
    not lose them.
    """
    if manager.settings is not None:
        return None
    given = [flag_of(name) for name in flags if name not in APPLIED_BY_THE_COMMAND]
    if settings is not None:
        for name, field in ManagerSettings.model_fields.items():
            variable = variable_of(name)
            if name in flags or name in APPLIED_BY_THE_COMMAND or variable not in environment:
                continue
            if getattr(settings, name) != field.get_default(call_default_factory=True):
                given.append(f"{variable}={environment[variable]!r}")
    if not given:
        return None
    return (
        f"{', '.join(given)} given, but the factory built its Manager without settings: "
        "have it build Manager.from_settings(provider, settings=settings), taking the parsed "
        "settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    )
