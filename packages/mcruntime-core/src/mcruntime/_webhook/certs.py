"""The webhook server's certificate: files a user provides, or a CA of its own.

Either way there is one server ``SSLContext`` for the server's whole life, and
a new certificate is loaded *into* it: handshakes after the load present the
new certificate, connections already open keep the one they negotiated, so a
rotation drops no request in flight.

- :class:`CertificateFiles` (cert-manager style): a certificate and key on disk,
  reloaded when their content changes. A half-written pair (new certificate,
  old key) fails to load and the previous pair stays in use until the next check.
- :class:`SelfSignedCertificates`: a CA and a serving certificate for the
  configured hosts, generated in memory (``cryptography`` is imported only
  here). The serving certificate is renewed when two thirds of its life have
  passed, signed by the same CA, so the CA bundle the API servers trust does not
  change. The CA lives as long as the process: a restarted manager makes a new
  one and registration publishes its bundle.

Private keys never reach a file that outlives the process: ``ssl`` loads keys
only from files, so each key is written to a 0600 file in a 0700 directory and
deleted as soon as it is loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
    from cryptography.x509 import Certificate

log = logging.getLogger("mcruntime.webhook")

_BACKDATE = datetime.timedelta(minutes=5)  # clock skew between us and the API servers


class CertificateSource(Protocol):
    """Where the server's certificate comes from; the server drives it."""

    context: ssl.SSLContext
    """The one server context, reloaded in place."""

    def ca_bundle(self) -> bytes | None:
        """PEM of the CAs to register with the API servers (``None``: not ours to register)."""
        ...

    def not_after(self) -> datetime.datetime | None:
        """When the serving certificate in use expires, if known."""
        ...

    async def load(self) -> None:
        """Load the first certificate; raises when there is none to serve with."""
        ...

    async def refresh(self) -> bool:
        """Reload or renew if due; ``True`` when the certificate in use changed."""
        ...


def _server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _load_pem(context: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Load a pair held in memory into ``context``, only if the pair is good.

    ``load_cert_chain`` is not atomic: on a key that does not match, the
    context keeps the new certificate with the old key and every later
    handshake fails. So the pair is tried on a scratch context first, and the
    live one is touched only once the pair is known to load. The key passes
    through short-lived private files, deleted at once.
    """
    directory = tempfile.mkdtemp(prefix="mcruntime-webhook-")  # 0700
    cert_path, key_path = Path(directory, "tls.crt"), Path(directory, "tls.key")
    try:
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(data)
        _server_context().load_cert_chain(cert_path, key_path)  # raises on a bad pair; nothing changed yet
        context.load_cert_chain(cert_path, key_path)
    finally:
        for path in (cert_path, key_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        os.rmdir(directory)


def _expiry(cert_pem: bytes) -> datetime.datetime | None:
    try:
        from cryptography import x509
    except ImportError:  # pragma: no cover -- expiry is then unknown, not an error
        return None
    try:
        return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc
    except ValueError:
        return None


class CertificateFiles:
    """A certificate and key on disk (``tls.crt``/``tls.key`` of a mounted Secret), reloaded on change."""

    def __init__(self, cert_file: str | Path, key_file: str | Path) -> None:
        self.cert_file = Path(cert_file)
        self.key_file = Path(key_file)
        self.context = _server_context()
        self._digest: bytes | None = None
        self._not_after: datetime.datetime | None = None
        self._problem: str | None = None
        """What the last refresh found wrong, said once (a missing file stays missing for a while)."""

    def __repr__(self) -> str:
        return f"<CertificateFiles {self.cert_file} {self.key_file}>"

    def _report(self, problem: str | None) -> None:
        """A WARNING when the files' trouble begins or changes, an INFO when it ends; repeats at DEBUG."""
        if problem == self._problem:
            if problem is not None:
                log.debug("%s", problem)
            return
        if problem is not None:
            log.warning("%s", problem)
        else:
            log.info("webhook certificate files %s and %s load again", self.cert_file, self.key_file)
        self._problem = problem

    def ca_bundle(self) -> bytes | None:
        return None

    def not_after(self) -> datetime.datetime | None:
        return self._not_after

    def _read(self) -> tuple[bytes, bytes]:
        return self.cert_file.read_bytes(), self.key_file.read_bytes()

    async def load(self) -> None:
        try:
            cert_pem, key_pem = await asyncio.to_thread(self._read)
            await asyncio.to_thread(self.context.load_cert_chain, self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(
                f"webhook certificate {self.cert_file} with key {self.key_file} cannot be loaded: {error}"
            ) from None
        self._digest = hashlib.sha256(cert_pem + key_pem).digest()
        self._not_after = _expiry(cert_pem)
        if self._not_after is not None and self._not_after <= datetime.datetime.now(datetime.UTC):
            log.warning(
                "webhook certificate %s expired at %s: API servers will refuse it until it is renewed",
                self.cert_file,
                self._not_after.isoformat(),
            )

    async def refresh(self) -> bool:
        try:
            cert_pem, key_pem = await asyncio.to_thread(self._read)
        except OSError as error:
            self._report(f"webhook certificate files unreadable ({error}); serving the loaded one")
            return False
        digest = hashlib.sha256(cert_pem + key_pem).digest()
        if digest == self._digest:
            self._report(None)
            return False
        expires, now = _expiry(cert_pem), datetime.datetime.now(datetime.UTC)
        if expires is not None and expires <= now and self._not_after is not None and self._not_after > now:
            # Every new connection from every API server would fail its handshake: keep the good pair.
            self._report(
                f"webhook certificate {self.cert_file} changed to one that expired at {expires.isoformat()}; "
                f"serving the loaded one (expires {self._not_after.isoformat()})"
            )
            return False
        try:
            _load_pem(self.context, cert_pem, key_pem)
        except (OSError, ssl.SSLError) as error:
            # Mid-rotation (certificate written, key not yet): keep serving the old pair.
            self._report(f"webhook certificate {self.cert_file} changed but does not load yet ({error})")
            return False
        self._report(None)
        self._digest = digest
        self._not_after = _expiry(cert_pem)
        log.info("webhook certificate reloaded from %s (expires %s)", self.cert_file, self._not_after)
        return True


@dataclass
class _Issued:
    cert_pem: bytes
    issued_at: datetime.datetime
    """When it was made: ``notBefore`` is backdated for clock skew, so it cannot time the renewal."""
    not_after: datetime.datetime


class SelfSignedCertificates:
    """A CA of the process's own and a serving certificate for ``hosts``, renewed before expiry."""

    def __init__(
        self,
        hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
        *,
        validity: datetime.timedelta = datetime.timedelta(days=7),
        ca_validity: datetime.timedelta = datetime.timedelta(days=3650),
    ) -> None:
        if not hosts:
            raise ValueError("a self-signed webhook certificate needs at least one host name or address")
        self.hosts = hosts
        self.validity = validity
        self.ca_validity = ca_validity
        self.context = _server_context()
        self._ca_key: EllipticCurvePrivateKey | None = None
        self._ca_cert: Certificate | None = None
        self._ca_pem: bytes | None = None
        self._issued: _Issued | None = None

    def __repr__(self) -> str:
        return f"<SelfSignedCertificates hosts={list(self.hosts)}>"

    def ca_bundle(self) -> bytes | None:
        return self._ca_pem

    def not_after(self) -> datetime.datetime | None:
        return self._issued.not_after if self._issued else None

    async def load(self) -> None:
        try:
            import cryptography  # noqa: F401 -- only checking it is there
        except ImportError:
            raise RuntimeError(
                "a webhook server with certificates of its own needs the 'cryptography' package: "
                "pip install 'mcruntime-core[webhook]', or give WebhookOptions(cert_dir=...)"
            ) from None
        await asyncio.to_thread(self._make_ca)
        await self.rotate()

    def due(self, now: datetime.datetime | None = None) -> bool:
        """Two thirds of the serving certificate's life have passed."""
        if self._issued is None:
            return True
        now = now or datetime.datetime.now(datetime.UTC)
        life = self._issued.not_after - self._issued.issued_at
        return now >= self._issued.issued_at + life * 2 / 3

    async def refresh(self) -> bool:
        if not self.due():
            return False
        await self.rotate()
        return True

    async def rotate(self) -> None:
        """Issue and load a new serving certificate now (same CA, so nothing re-registers)."""
        cert_pem, key_pem, issued = await asyncio.to_thread(self._issue)
        _load_pem(self.context, cert_pem, key_pem)
        self._issued = issued
        log.info("webhook serving certificate renewed; expires %s", issued.not_after.isoformat())

    def _make_ca(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcruntime webhook CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + self.ca_validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        self._ca_key, self._ca_cert = key, cert
        self._ca_pem = cert.public_bytes(serialization.Encoding.PEM)

    def _issue(self) -> tuple[bytes, bytes, _Issued]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        assert self._ca_key is not None and self._ca_cert is not None, "load() makes the CA first"
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in self.hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        not_before, not_after = now - _BACKDATE, now + self.validity
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.hosts[0])]))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert_pem, key_pem, _Issued(cert_pem, now, not_after)
