"""The testbed's certificates pass strict X.509 verification, and a rejected one is named.

Python 3.13 verifies with OpenSSL's ``VERIFY_X509_STRICT``: a CA without a
Subject Key Identifier or a leaf without an Authority Key Identifier is refused.
These tests turn the flag on explicitly, so they hold the certificates to that
standard on every Python, not only on 3.13.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from mcruntime.testing import ControlPlane, Fleet, TestbedError, live_processes
from mcruntime.testing._pki import CertificateAuthority


def _strict_client(ca: CertificateAuthority) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def _handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake over memory buffers: no socket, no thread."""
    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client_side = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    server_side = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _round in range(10):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError(f"the handshake did not finish: {done}")


def _server_context(ca: CertificateAuthority, tmp_path: Path) -> ssl.SSLContext:
    pair = ca.issue("kube-apiserver", server_hosts=("127.0.0.1", "localhost"))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return context


def test_a_serving_certificate_verifies_under_strict_x509(tmp_path: Path) -> None:
    ca = CertificateAuthority("strict")
    _handshake(_strict_client(ca), _server_context(ca, tmp_path), "localhost")


def test_another_clusters_ca_is_still_refused_under_strict_x509(tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        _handshake(
            _strict_client(CertificateAuthority("other")),
            _server_context(CertificateAuthority("mine"), tmp_path),
            "localhost",
        )


def test_certificates_name_their_keys_and_their_issuers_key() -> None:
    ca = CertificateAuthority("ids")
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    leaf = x509.load_pem_x509_certificate(ca.issue("user", client=True).cert_pem)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert ca_cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier == (
        ca_ski.digest
    )
    assert leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier == (
        ca_ski.digest
    )
    assert leaf.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest != ca_ski.digest
    usage = leaf.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.digital_signature and not usage.value.key_cert_sign
    constraints = leaf.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca


def test_a_start_whose_certificate_this_python_rejects_says_so_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not "kube-apiserver was not ready within 60s": the verification failure, named."""
    foreign = CertificateAuthority("foreign")

    def distrusting(plane: ControlPlane) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=foreign.cert_pem.decode())
        context.load_cert_chain(plane.directory / "admin.crt", plane.directory / "admin.key")
        return context

    monkeypatch.setattr(ControlPlane, "admin_ssl_context", distrusting)
    with Fleet(workdir=tmp_path / "fleet") as fleet:
        with pytest.raises(TestbedError, match=r"rejects it: .*unable to get local issuer certificate"):
            fleet.add("rejected")
        assert [process.name for process in live_processes() if "rejected" in process.name] == []
