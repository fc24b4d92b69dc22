"""TLS for one API server: certificates and keys as in-memory paths, and the context built from them.

Kept apart from the transport's requests: what a kubeconfig says about trust
and identity (CA, client certificate and key, inline or as files) becomes an
``ssl.SSLContext`` or a kubernetes-asyncio ``Configuration`` here, and key
material never touches the disk (see ``_config/material.py``).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import base64
import logging
import os
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._config.material import MaterialFiles

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

    from .._config.kubeconfig import ClusterConfig

log = logging.getLogger("mcruntime.transport")

_STDLIB_TLS_READ_BUFFER = 256 * 1024
_tls_buffer_tuned = False


def tune_tls_read_buffer() -> None:
    """Lower asyncio's per-connection TLS read buffer from 256 KiB to 64 KiB, once per process.

    Every TLS connection asyncio makes allocates (and zero-fills, so it is
    resident) a read buffer of ``SSLProtocol.max_size``, and a fleet holds a
    watch connection per cluster and kind: at 256 KiB that buffer was most of
    an idle cluster's memory. TLS records carry at most 16 KiB, so 64 KiB
    reads lose nothing. The setting is the process's, so it is only lowered
    from the standard library's own default; ``MCRUNTIME_TLS_READ_BUFFER_KIB``
    chooses another size (256 keeps the default). Since the client's own
    connections read through the socket's TLS (``tls_socket.py``), this
    applies to the ones asyncio still makes: aiohttp's (a cluster behind a
    proxy, a watch on a server without HTTP/2) and the webhook server's.
    """
    global _tls_buffer_tuned
    if _tls_buffer_tuned:
        return
    _tls_buffer_tuned = True
    raw = os.environ.get("MCRUNTIME_TLS_READ_BUFFER_KIB", "64")
    try:
        size = int(raw) * 1024
    except ValueError:
        log.warning("MCRUNTIME_TLS_READ_BUFFER_KIB=%r is not a whole number of KiB; keeping 64", raw)
        size = 64 * 1024
    protocol = getattr(asyncio.sslproto, "SSLProtocol", None)
    if size > 0 and getattr(protocol, "max_size", None) == _STDLIB_TLS_READ_BUFFER:
        protocol.max_size = size  # type: ignore[union-attr]


def certificate_of(user: Mapping[str, Any]) -> tuple[Any, Any]:
    """The client certificate and key a kubeconfig user names, inline or as paths; (None, None) without."""
    return (
        user.get("client-certificate-data") or user.get("client-certificate"),
        user.get("client-key-data") or user.get("client-key"),
    )


def _trusting(cluster: Mapping[str, Any], ca_file: Callable[[], str | None]) -> ssl.SSLContext:
    """A default client context trusting the cluster's CA.

    Inline CA data (PEM, public) is loaded from memory: an in-memory file for
    it would hold a descriptor for as long as the cluster runs, one per
    cluster, and a fleet of 10,000 on one replica would spend half of a
    20,000 open-file limit on copies of a few CAs. Data that is not PEM text
    goes through a file as before, so OpenSSL reports what is wrong with it.
    """
    data = cluster.get("certificate-authority-data")
    if data:
        pem = base64.b64decode(str(data).replace("\r", "").replace("\n", ""))
        if pem.lstrip().startswith(b"-----BEGIN"):
            return ssl.create_default_context(cadata=pem.decode("ascii"))
    return ssl.create_default_context(cafile=ca_file())


def _decoded(data: Any) -> bytes:
    return base64.b64decode(str(data).replace("\r", "").replace("\n", ""))


class MaterialPaths:
    """A transport's certificates and keys as paths: the file a kubeconfig names, or inline data in memory.

    The TLS context reads inline material from in-memory files it closes at
    once; only a kubernetes-asyncio ``Configuration`` (which takes paths and
    reads them whenever it connects) keeps files open, until the transport closes.
    """

    def __init__(self, material: MaterialFiles) -> None:
        self.material = material
        self._files: dict[str, str] = {}

    def path(
        self, field_name: str, entry: Mapping[str, Any], loading: MaterialFiles | None = None
    ) -> str | None:
        """A path holding a certificate or key.

        The referenced file, or inline data in an in-memory file (memfd:
        nothing on disk, gone with the process however it ends): put into
        ``loading`` when given, which its caller closes as soon as the data
        is read, else kept (once) for as long as this transport runs.
        """
        data_field = f"{field_name}-data"
        if entry.get(data_field):
            if loading is not None:
                return loading.path(field_name, _decoded(entry[data_field]))
            key = f"{field_name}:{entry[data_field]}"
            if key not in self._files:
                self._files[key] = self.material.path(field_name, _decoded(entry[data_field]))
            return self._files[key]
        path = entry.get(field_name)
        return str(path) if path else None

    def ssl_context(
        self, cluster_name: str, cluster: Mapping[str, Any], user: Mapping[str, Any]
    ) -> ssl.SSLContext:
        """The TLS context for a kubeconfig cluster entry and user entry.

        Inline certificates and keys are in-memory files only while OpenSSL
        reads them: the context keeps what it loaded, and a file held for as
        long as the cluster runs would cost two descriptors per cluster, which
        at 10,000 clusters of a 20,000 open-file limit leaves no room for a
        single connection.
        """
        loading = MaterialFiles()
        try:
            context = _trusting(cluster, lambda: self.path("certificate-authority", cluster, loading))
            # Python 3.13 made its defaults stricter than client-go's verifier (a CA without
            # key identifiers is refused); kubectl trusts such clusters, so we do too.
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT
            if cluster.get("insecure-skip-tls-verify"):
                log.warning("cluster %r: TLS verification is disabled by its kubeconfig", cluster_name)
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            cert = self.path("client-certificate", user, loading)
            key = self.path("client-key", user, loading)
            if cert and key:
                context.load_cert_chain(cert, key)
        finally:
            loading.close()
        return context

    def kubernetes_configuration(
        self, server: str, config: ClusterConfig, authorization: str | None
    ) -> k8s_client.Configuration:
        """A kubernetes-asyncio ``Configuration`` whose certificate and key paths are these files."""
        from kubernetes_asyncio import client as k8s_client

        configuration = k8s_client.Configuration(host=server)
        configuration.ssl_ca_cert = self.path("certificate-authority", config.cluster)
        configuration.cert_file = self.path("client-certificate", config.user)
        configuration.key_file = self.path("client-key", config.user)
        configuration.verify_ssl = not config.cluster.get("insecure-skip-tls-verify")
        if config.cluster.get("tls-server-name"):
            configuration.tls_server_name = config.cluster["tls-server-name"]
        if config.cluster.get("proxy-url"):
            configuration.proxy = config.cluster["proxy-url"]
        if authorization and authorization.startswith("Bearer "):
            configuration.api_key["BearerToken"] = authorization
        return configuration
