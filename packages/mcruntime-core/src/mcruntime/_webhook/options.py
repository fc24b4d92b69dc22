"""How the webhook server listens, where its certificate comes from, and what it registers."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

MAX_BODY_BYTES = 3 * 1024 * 1024
"""The API server's own limit on a request body: no legitimate review is larger."""


@dataclass(frozen=True)
class WebhookOptions:
    """The webhook server's settings; the defaults fit a fleet of local control planes.

    ``address`` is ``host:port`` to listen on (port 0 picks a free one).
    ``url_host`` is the host the API servers call (defaults to the listening
    host, or 127.0.0.1 when that is a wildcard).

    Certificates: ``cert_dir`` holds ``tls.crt`` and ``tls.key`` (a mounted
    Secret; ``cert_file``/``key_file`` name them otherwise), reloaded when they
    change on disk. Without files the server makes its own CA and a serving
    certificate for ``hosts``, valid ``certificate_validity`` and renewed when
    two thirds of it have passed.

    ``register`` installs and keeps current, in every engaged cluster, the
    Validating/MutatingWebhookConfiguration named ``configuration_name`` and the
    conversion settings of each converted CRD, pointing at that cluster's URL
    with the CA bundle. It defaults to on with self-made certificates (nobody
    else knows the CA) and off with files (whoever issued them registers).
    ``remove_on_disengage`` deletes the configurations from a cluster that is
    disengaged; it is off by default because removing a validating webhook
    silently is a security decision, not a cleanup. ``verify_interval`` is how
    often each cluster's registration is read back, so that one deleted or
    edited by another writer is restored (and the restore logged) within it:
    one read per configuration and converted CRD, per cluster, per interval;
    a write only on a difference; 0 turns it off.

    ``handler_timeout`` bounds each call (waiting for its cluster's lane
    included), or nine tenths of the API server's own deadline when that is
    shorter, so a hung handler is answered per ``on_error`` before the API
    server gives up; ``max_concurrent_per_cluster`` is each cluster's lane
    width, so a hung handler for one cluster holds only that cluster's share.

    ``http2`` offers HTTP/2 (ALPN ``h2``) besides HTTP/1.1. An API server then
    sends its calls as streams on one connection instead of queueing for a
    free HTTP/1.1 connection, which is most of what a webhook adds to a write's
    p99 under load. ``max_streams_per_connection`` bounds the calls one
    connection has in flight, counting those the client reset whose handler
    still runs, so resetting streams (the "rapid reset" attack) buys a client
    nothing; a stream over it is refused, and API servers retry it. Turn
    ``http2`` off only for a client that mishandles it.
    """

    address: str = "127.0.0.1:9443"
    url_host: str | None = None
    cert_dir: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    certificate_validity: datetime.timedelta = datetime.timedelta(days=7)
    reload_interval: float = 10.0
    register: bool | None = None
    remove_on_disengage: bool = False
    configuration_name: str = "mcruntime-webhooks"
    max_body_bytes: int = MAX_BODY_BYTES
    handler_timeout: float = 10.0
    max_concurrent_per_cluster: int = 16
    verify_interval: float = 300.0
    http2: bool = True
    max_streams_per_connection: int = 100

    def __post_init__(self) -> None:
        _host, separator, port = self.address.rpartition(":")
        if not separator or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"WebhookOptions.address {self.address!r} must be host:port")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("WebhookOptions: give cert_file and key_file together, or neither")
        if self.cert_dir is not None and self.cert_file is not None:
            raise ValueError("WebhookOptions: give cert_dir or cert_file/key_file, not both")
        if self.handler_timeout <= 0:
            raise ValueError(f"WebhookOptions.handler_timeout must be above 0, not {self.handler_timeout}")
        if self.max_concurrent_per_cluster < 1:
            raise ValueError(
                "WebhookOptions.max_concurrent_per_cluster must be at least 1, "
                f"not {self.max_concurrent_per_cluster}"
            )
        if not 1 <= self.max_streams_per_connection <= 1 << 16:
            raise ValueError(
                "WebhookOptions.max_streams_per_connection must be between 1 and 65536, "
                f"not {self.max_streams_per_connection}"
            )
        if self.max_body_bytes < 1024:
            raise ValueError(
                f"WebhookOptions.max_body_bytes must be at least 1024, not {self.max_body_bytes}"
            )
        if self.verify_interval < 0:
            raise ValueError(f"WebhookOptions.verify_interval must be 0 or above, not {self.verify_interval}")
        if self.reload_interval <= 0:
            raise ValueError(f"WebhookOptions.reload_interval must be above 0, not {self.reload_interval}")

    @property
    def listen_host(self) -> str:
        """The host part of ``address`` (every interface when empty)."""
        return self.address.rpartition(":")[0] or "0.0.0.0"  # noqa: S104 -- an empty host means every interface

    @property
    def listen_port(self) -> int:
        """The port part of ``address`` (0: any free port)."""
        return int(self.address.rpartition(":")[2])

    def files(self) -> tuple[Path, Path] | None:
        """The certificate and key files, when the user provides them."""
        if self.cert_dir is not None:
            return Path(self.cert_dir, "tls.crt"), Path(self.cert_dir, "tls.key")
        if self.cert_file is not None and self.key_file is not None:
            return Path(self.cert_file), Path(self.key_file)
        return None

    @property
    def registers(self) -> bool:
        """Whether the manager installs the configurations (``register``, or its default)."""
        return self.register if self.register is not None else self.files() is None

    def public_host(self) -> str:
        """The host in the URLs the API servers call."""
        if self.url_host:
            return self.url_host
        host = self.listen_host
        return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # noqa: S104
