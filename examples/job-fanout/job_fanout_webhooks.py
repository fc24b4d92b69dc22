"""job-fanout's webhooks: a Test is validated and defaulted on admission, and served in two versions.

The controller only learns about a bad Test after it was stored: a Test with no
image becomes a Job in every cluster that can never start, and a Test naming a
cluster that is not in the fleet waits forever for a Job nobody creates. The
validating webhook refuses both at ``kubectl apply`` time, with a message that
names the field and, for clusters, the ones that are engaged right now (the
manager's own view of the fleet, which is what the controller fans out to).

The defaulter fills in what every Test of the example uses (the command, and an
empty ``failIn``), so stored Tests are complete and ``kubectl get -o yaml`` shows
what will run.

``v1alpha1`` is the Test's first served version, kept for old manifests: it
named the list of clusters whose Job fails on purpose ``failOn``; ``v1`` (the
hub and storage version) names it ``failIn``. The conversion moves that one
field in each direction, so a Test written as either version reads back as
either, losslessly.
"""

from __future__ import annotations

import copy
from typing import Any

import mcruntime as mcr
from mcruntime.webhook import Webhooks

JSON = dict[str, Any]

HUB = "v1"
"""The storage version: every other version converts to and from it."""
V1ALPHA1 = "v1alpha1"
DEFAULT_COMMAND = ("sh", "-c", "echo testing && sleep 2")
"""A Test's command when its spec has none (what ``make_test`` uses)."""
MAIN = "main"
"""How the main cluster (mcruntime name ``""``) is named in a Test's spec, as in its status."""


def _spec(obj: JSON) -> JSON:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def v1alpha1_to_v1(obj: JSON) -> JSON:
    """``spec.failOn`` (v1alpha1) becomes ``spec.failIn`` (v1); every other field is the same."""
    converted = copy.deepcopy(obj)
    spec = converted.get("spec")
    if isinstance(spec, dict) and "failOn" in spec:
        spec["failIn"] = spec.pop("failOn")
    return converted


def v1_to_v1alpha1(obj: JSON) -> JSON:
    """``spec.failIn`` (v1) becomes ``spec.failOn`` (v1alpha1); every other field is the same."""
    converted = copy.deepcopy(obj)
    spec = converted.get("spec")
    if isinstance(spec, dict) and "failIn" in spec:
        spec["failOn"] = spec.pop("failIn")
    return converted


class TestAdmission:
    """The Test's validator and defaulter; both run for the main cluster, where Tests live."""

    __test__ = False  # a class named Test* that pytest must not collect

    def __init__(self, manager: mcr.Manager) -> None:
        self.manager = manager

    def engaged(self) -> list[str]:
        """The clusters a Test may name: every engaged cluster, the main one as ``main``."""
        return sorted(name or MAIN for name in self.manager.clusters())

    async def validate(self, req: mcr.AdmissionRequest) -> None:
        """Refuse a Test with no image, or one naming clusters that are not engaged."""
        assert req.object is not None  # CREATE and UPDATE only
        spec = _spec(req.object)
        image = spec.get("image")
        if not isinstance(image, str) or not image.strip():
            raise mcr.Denied(
                f"Test {req.namespace}/{req.name}: spec.image is required (the image of the Job it runs)",
                code=422,
                reason="Invalid",
            )
        named = spec.get("clusters")
        if named is None:
            return  # every engaged cluster, now and later
        if req.operation == "UPDATE" and req.old_object is not None and _spec(req.old_object) == spec:
            # Metadata only (the controller's finalizer, labels): a cluster named when the Test was
            # written may have left since, and that must not block its finalizer or its deletion.
            return
        engaged = self.engaged()
        unknown = [cluster for cluster in named if cluster not in engaged]
        if unknown:
            raise mcr.Denied(
                f"Test {req.namespace}/{req.name}: spec.clusters names {', '.join(map(repr, unknown))}, "
                f"which {'is' if len(unknown) == 1 else 'are'} not engaged; "
                f"engaged clusters: {', '.join(engaged)}",
                code=422,
                reason="Invalid",
            )
        if not named:
            req.warn("spec.clusters is empty: this Test runs no Job anywhere")

    async def default(self, req: mcr.AdmissionRequest) -> JSON:
        """The Test with the command and ``failIn`` every Test of the example has."""
        assert req.object is not None
        obj = copy.deepcopy(req.object)
        spec = obj.setdefault("spec", {})
        if not spec.get("command"):
            spec["command"] = list(DEFAULT_COMMAND)
        spec.setdefault("failIn", [])
        return obj


def setup_webhooks(manager: mcr.Manager, kind: mcr.Kind) -> Webhooks:
    """Register the Test's validator, defaulter and v1alpha1 <-> v1 conversion with ``manager``.

    ``resource`` is given so the configurations need no discovery: the server
    registers them in every engaged cluster, and only the main one has the CRD
    (in the sub clusters no request ever matches them).
    """
    admission = TestAdmission(manager)
    return (
        mcr.webhook_managed_by(manager)
        .for_(kind, resource="tests")
        .with_validator(admission.validate)
        .with_defaulter(admission.default)
        .with_conversion(hub=HUB, to_hub={V1ALPHA1: v1alpha1_to_v1}, from_hub={V1ALPHA1: v1_to_v1alpha1})
        .complete()
    )
