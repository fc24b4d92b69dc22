"""One config per selected context of a parsed kubeconfig, at a cost linear in the document.

``mcr.kubeconfig_from_dict`` builds one context from a whole document: it
checks the document's bounds and indexes every entry before it looks at the
context asked for. Called once per context, a file of N contexts cost N walks
of N entries: 2,000 contexts took 19 s of CPU, in the worker thread every pass
waits for, and any writer could add more.

So the whole document is walked by the core once, for the first context that
can be looked up (the probe): that call raises every problem of the whole file
(too large, a section that is not a list, an entry without a name), which
then stands for every context, as it did. Otherwise each further context is
built from a small document holding only its context entry and the cluster
and user entries it names, taken from an index of the file built once (the
first entry of a name wins, kubectl's rule and the core's merge). What the core
makes of one context depends on those three entries alone, so each context gets
the config, or the very error, that the whole document would give it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcruntime as mcr


@dataclass(frozen=True)
class ContextReading:
    """One selected context: its config, or why it cannot be used."""

    context: str
    config: mcr.ClusterConfig | None
    error: str | None


Outcome = mcr.ClusterConfig | Exception
"""What ``kubeconfig_from_dict`` made of one context: a config, or what it raised."""


def build_contexts(
    data: Mapping[str, Any], path: Path, chosen: Sequence[str], trust: mcr.TrustPolicy
) -> tuple[ContextReading, ...]:
    """A reading per context of ``chosen`` (in order), as one whole-document build each would give."""
    if not chosen:
        return ()
    index = _Index.of(data)
    probe = next((context for context in chosen if context and context in index.contexts), None)
    if probe is None:  # nothing to look up ("current" naming a missing context): few, built whole
        return tuple(reading(context, attempt(data, path, context, trust), path) for context in chosen)
    whole = attempt(data, path, probe, trust)
    if _of_the_whole_file(whole, probe, index, path, trust):
        return tuple(reading(context, whole, path) for context in chosen)
    readings = []
    for context in chosen:
        if context == probe:
            outcome = whole
        else:  # a context not listed, or "" (the current one), is built whole: its message lists the file's
            small = index.document(context)
            outcome = attempt(data if small is None else small, path, context, trust)
        readings.append(reading(context, outcome, path))
    return tuple(readings)


def attempt(data: Mapping[str, Any], path: Path, context: str, trust: mcr.TrustPolicy) -> Outcome:
    """The config of ``context`` in ``data``, or the exception building it raised."""
    try:
        return mcr.kubeconfig_from_dict(data, context, base_dir=path.parent, trust=trust, origin=str(path))
    except Exception as error:  # reported by ``reading``, never raised: one context fails only itself
        return error


def reading(context: str, outcome: Outcome, path: Path) -> ContextReading:
    """The reading of one context from what building it gave; messages quote no content."""
    if isinstance(outcome, mcr.ClusterConfig):
        return ContextReading(context, outcome, None)
    if isinstance(outcome, mcr.KubeconfigError):  # TrustPolicyError included; messages are secret-free
        return ContextReading(context, None, str(outcome))
    return ContextReading(  # a shape no check foresaw: name the type, quote nothing
        context, None, f"{path}, context {context!r}: not a usable kubeconfig ({type(outcome).__name__})"
    )


def _of_the_whole_file(whole: Outcome, probe: str, index: _Index, path: Path, trust: mcr.TrustPolicy) -> bool:
    """Whether the probe's failure is the file's (then every context's), not the probe context's own.

    The core names the context in every error about one (``error.context``);
    the probe is listed and named, so an error naming no context came from
    the checks of the whole document. An exception no check foresaw names
    nothing: it is the context's own if the probe's small document raises it too.
    """
    if isinstance(whole, mcr.ClusterConfig):
        return False
    if isinstance(whole, mcr.KubeconfigError):
        return not whole.context
    small = index.document(probe)
    alone = attempt(small, path, probe, trust) if small is not None else None
    return type(alone) is not type(whole)


@dataclass(frozen=True)
class _Index:
    """A document's cluster, user and context entries by name, the first of each name."""

    clusters: dict[str, dict[str, Any]]
    users: dict[str, dict[str, Any]]
    contexts: dict[str, dict[str, Any]]

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> _Index:
        return cls(_by_name(data, "clusters"), _by_name(data, "users"), _by_name(data, "contexts"))

    def document(self, context: str) -> dict[str, Any] | None:
        """The context's entry and the entries it names, as a document; None for one not listed.

        An empty name is left to the whole document too: the core takes it as
        "the current context".
        """
        entry = self.contexts.get(context)
        if entry is None or not context:
            return None
        document: dict[str, Any] = {"contexts": [entry]}
        body = entry.get("context")
        if isinstance(body, dict):
            named = (("cluster", "clusters", self.clusters), ("user", "users", self.users))
            for field, section, entries in named:
                name = body.get(field)
                if isinstance(name, str) and name in entries:
                    document[section] = [entries[name]]
        return document


def _by_name(data: Mapping[str, Any], section: str) -> dict[str, dict[str, Any]]:
    """A section's entries by name, the first of each name; anything malformed is left to the core."""
    entries: dict[str, dict[str, Any]] = {}
    items = data.get(section)
    if isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                name = item.get("name")
                if isinstance(name, str) and name not in entries:
                    entries[name] = item
    return entries
