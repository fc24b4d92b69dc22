"""Turning one KubeFedCluster (and its token) into a connection config.

KubeFed describes a member by parts, not by a kubeconfig: an endpoint that may
lack a scheme, a CA bundle, a token in a Secret of the KubeFed namespace, an
optional proxy and a list of TLS checks to skip. We assemble a kubeconfig from
those parts and hand it to the core, so the trust policy, fingerprints and
secret-free errors work exactly as for every other provider.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import mcruntime as mcr


class MemberConfigError(ValueError):
    """A KubeFedCluster cannot be turned into a connection; the message names it and says why."""


def endpoint_url(endpoint: str) -> str:
    """``host``, ``host:port``, ``IP:port`` or a URL, as an https URL (the scheme added when absent)."""
    value = endpoint.strip()
    if not value:
        raise MemberConfigError("spec.apiEndpoint is empty")
    if "://" not in value:
        value = f"https://{value}"
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise MemberConfigError(f"spec.apiEndpoint {endpoint!r} is not a host, host:port or http(s) URL")
    return value.rstrip("/")


def token_of(secret: Mapping[str, Any] | None, where: str) -> str:
    """The bearer token under key ``token`` of a Secret, decoded and stripped.

    Raises :class:`MemberConfigError` saying what is wrong with it, naming
    ``where`` (``Secret ns/name``): an operator who finds the Secret and its
    key with ``kubectl`` must learn from the error what to fix, never the
    token's content.
    """
    if secret is None:
        raise MemberConfigError(f"{where} is missing")
    data = secret.get("data") or {}
    if "token" not in data:
        raise MemberConfigError(f"{where} has no key 'token'")
    encoded = data.get("token")
    if not encoded:
        raise MemberConfigError(f"{where} key 'token' is empty")
    try:
        raw = base64.b64decode(str(encoded), validate=True)
    except (binascii.Error, ValueError):
        raise MemberConfigError(f"{where} key 'token' is not base64") from None
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise MemberConfigError(
            f"{where} key 'token' is not UTF-8 text (byte {error.start} of {len(raw)}): "
            "a bearer token is text"
        ) from None
    if not token:
        raise MemberConfigError(f"{where} key 'token' holds only whitespace")
    return token


def member_config(
    name: str,
    spec: Mapping[str, Any],
    token: str,
    *,
    allow_insecure: bool,
    token_from: str | None = None,
) -> mcr.ClusterConfig:
    """The ClusterConfig of member ``name`` from its KubeFedCluster ``spec`` and ``token``.

    ``disabledTLSValidations: ["*"]`` turns verification off, and only with
    ``allow_insecure``. ``SubjectName`` and ``ValidityPeriod`` alone have no
    kubeconfig equivalent and are refused with a clear error rather than
    silently widened to "verify nothing". ``token_from`` names where the token
    was read (``Secret ns/name``), so a token that cannot be sent (a control or
    non-ASCII character) is reported with the Secret to fix.
    """
    cluster: dict[str, Any] = {"server": endpoint_url(str(spec.get("apiEndpoint") or ""))}
    bundle = spec.get("caBundle")
    if bundle:
        try:
            base64.b64decode(str(bundle), validate=True)
        except (binascii.Error, ValueError):
            raise MemberConfigError("spec.caBundle is not base64") from None
        cluster["certificate-authority-data"] = str(bundle)
    disabled = [str(item) for item in spec.get("disabledTLSValidations") or []]
    if disabled:
        if disabled != ["*"]:
            if "*" in disabled:
                raise MemberConfigError("spec.disabledTLSValidations: '*' must be the only entry")
            raise MemberConfigError(
                f"spec.disabledTLSValidations {disabled} is not supported (only ['*'], which turns "
                "verification off, can be expressed); remove it or use ['*'] with allow_insecure"
            )
        cluster["insecure-skip-tls-verify"] = True
        cluster.pop("certificate-authority-data", None)
    proxy = spec.get("proxyURL")
    if proxy:
        parts = urlsplit(str(proxy))
        if parts.scheme not in ("http", "https", "socks5") or not parts.hostname:
            raise MemberConfigError(f"spec.proxyURL is not a proxy URL ({parts.scheme or 'no'} scheme)")
        cluster["proxy-url"] = str(proxy)
    kubeconfig = {
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": "kubefed", "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "kubefed"}}],
        "current-context": name,
    }
    trust = mcr.TrustPolicy(allow_insecure=allow_insecure)
    origin = f"KubeFedCluster {name}" + (f" (token from {token_from})" if token_from else "")
    try:
        return mcr.kubeconfig_from_dict(kubeconfig, trust=trust, origin=origin)
    except mcr.TrustPolicyError:
        raise MemberConfigError(
            "TLS verification would be off (disabledTLSValidations ['*'] or an http:// endpoint), "
            "which needs allow_insecure=True"
        ) from None
    except mcr.KubeconfigError as error:
        raise MemberConfigError(str(error)) from None
