"""A kubeconfig carried in a Secret's data: decoded and parsed under a size limit, never quoted.

Providers that read kubeconfigs from Secrets (the Secret provider, Cluster
API's ``<cluster>-kubeconfig``) take input they do not control. Each does the
same steps in the same order: refuse a value over the limit before decoding
it, decode base64 to UTF-8 text, parse it with the bounded parser (no
aliases, limited depth), build the config under a trust policy, and turn every
failure into a message that names where the value came from and never quotes it.
"""

from __future__ import annotations

import base64
import binascii

from .._base.errors import KubeconfigError
from .._config.bounded_yaml import parse_kubeconfig
from .._config.kubeconfig import ClusterConfig, TrustPolicy, kubeconfig_from_dict


def secret_kubeconfig(
    encoded: str, *, where: str, trust: TrustPolicy, max_bytes: int
) -> tuple[ClusterConfig | None, str | None]:
    """The config in one base64 Secret value, or ``None`` and why not (secret-free).

    ``where`` names the value in messages (``"Secret ns/east key 'kubeconfig'"``);
    a value whose decoded size is over ``max_bytes`` is refused unparsed. The
    kubeconfig's current context is used.
    """
    too_big = f"{where} is larger than the limit of {max_bytes} bytes; not parsed"
    if len(encoded) // 4 * 3 > max_bytes + 2:  # the decoded size, known without decoding
        return None, too_big
    try:
        raw = base64.b64decode(encoded, validate=True)
        if len(raw) > max_bytes:
            return None, too_big
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None, f"{where} is not base64-encoded UTF-8 text"
    try:
        # Bounded: no YAML aliases, limited depth, size and values (a 1.4 KB alias
        # bomb in a Secret would otherwise take seconds and gigabytes).
        document = parse_kubeconfig(text, origin=where, max_bytes=max_bytes)
        return kubeconfig_from_dict(document, trust=trust, origin=where), None
    except KubeconfigError as error:  # includes TrustPolicyError; secret-free messages
        return None, str(error)
    except Exception as error:  # a shape no check foresaw: name the type, quote nothing
        return None, f"{where} is not a usable kubeconfig ({type(error).__name__})"
