"""Throwaway certificates for local control planes.

Each control plane gets its own CA, so a kubeconfig carrying another cluster's CA
fails verification exactly as a wrong CA would in production: tests of "bad CA is
unhealthy" need that distinction. ECDSA P-256 keeps generation in the
milliseconds.

The certificates carry what strict X.509 verification demands (Python 3.13
turns OpenSSL's ``VERIFY_X509_STRICT`` on by default): a Subject Key Identifier
on every certificate, an Authority Key Identifier naming the issuer's key,
critical basicConstraints and keyUsage. Without them every TLS connection to a
testbed API server is refused on 3.13 although Go's verifier accepts them.

``cryptography`` comes with the ``testing`` extra and is imported on first use,
so that the pytest plugin, which imports this package, loads without it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._errors import MissingExtraError

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

_VALIDITY = datetime.timedelta(days=7)
_BACKDATE = datetime.timedelta(hours=1)


def _require_cryptography() -> None:
    try:
        import cryptography  # noqa: F401
    except ImportError as error:
        raise MissingExtraError("cryptography", "to issue the testbed's certificates") from error


def _new_key() -> ec.EllipticCurvePrivateKey:
    _require_cryptography()
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _key_usage(*, digital_signature: bool = True, cert_sign: bool = False) -> x509.KeyUsage:
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)


def signing_key_pair() -> tuple[bytes, bytes]:
    """A service-account signing key: (private PEM, public PEM)."""
    from cryptography.hazmat.primitives import serialization

    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return _key_pem(key), public


class CertificateAuthority:
    """A self-signed CA that issues serving and client certificates."""

    def __init__(self, common_name: str) -> None:
        self._key = _new_key()
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import NameOID

        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = datetime.datetime.now(datetime.UTC)
        self._name = name
        self._subject_key_id = x509.SubjectKeyIdentifier.from_public_key(self._key.public_key())
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(cert_sign=True), critical=True)
            .add_extension(self._subject_key_id, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._subject_key_id),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        server_hosts: tuple[str, ...] = (),
        client: bool = False,
    ) -> KeyPair:
        """Issue a leaf certificate.

        A serving cert when ``server_hosts`` is given; a client cert when ``client``
        is set, with CN = user and O = groups, as the apiserver's x509
        authenticator reads them.
        """
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = _new_key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attributes += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server_hosts:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(self._subject_key_id),
                critical=False,
            )
        )
        if server_hosts:
            names: list[x509.GeneralName] = []
            for host in server_hosts:
                try:
                    names.append(x509.IPAddress(ipaddress.ip_address(host)))
                except ValueError:
                    names.append(x509.DNSName(host))
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))
