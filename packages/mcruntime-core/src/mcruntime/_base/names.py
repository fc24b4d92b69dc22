"""Which names the API server accepts for an object: a DNS label (a namespace) or a DNS subdomain.

Checked before anything is sent (generated RBAC, a leader-election Lease), so that
a name the API server would refuse at apply time, or at every campaign, is a bad
setting named at start.
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def name_problem(value: str, *, subdomain: bool) -> str | None:
    """Why ``value`` cannot name a namespace (a DNS label) or a ServiceAccount or role (a DNS subdomain).

    Checked before any YAML is written: the API server would refuse the
    object, and only when the manifests are applied.
    """
    limit, what = (253, "a DNS subdomain") if subdomain else (63, "a DNS label")
    if not value or len(value) > limit:
        return f"is not {what}: 1 to {limit} characters"
    # As the API server checks (IsDNS1123Subdomain): a subdomain's parts have no length of their own.
    segments = value.split(".") if subdomain else [value]
    if not all(_DNS_LABEL.match(segment) for segment in segments):
        if subdomain:
            shape = "dot-separated parts of lower-case letters, digits and '-', each beginning"
        else:
            shape = "lower-case letters, digits and '-' only, beginning"
        return f"is not {what}: {shape} and ending with a letter or digit"
    return None
