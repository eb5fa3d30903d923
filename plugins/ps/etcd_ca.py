"""The job's own CA for its etcd: keys and requests made on the nodes, signed by the driver.

A job that starts its own etcd cluster on other nodes (``cluster.etcd = "job"`` with the Ray
launcher) makes the certificates itself, as it makes its CURVE keys: a private key never leaves
the node it was made on, only certificate signing requests and certificates travel.

- The driver makes the job's CA (:meth:`JobCA.make`): its key in the driver's memory alone
  (never written to disk, never sent anywhere; it dies with the driver, and a resumed job makes
  a new CA for its new members), its certificate public.
- A member of the etcd cluster makes its key on its node and a request naming the node's
  address (:func:`request_certificate`, ``MEMBER``); the driver signs it only if the request
  names exactly the address the driver placed the member at (:meth:`JobCA.sign_member`): a
  member cannot obtain a certificate for another node's address.
- A client role (a parameter server, a replica, a group's member, the driver itself) makes its
  key and a request on its node (``CLIENT``); the driver signs a client certificate for the
  role's name (:meth:`JobCA.sign_client`), good for TLS client authentication only.
- The certificate and the CA's go back to the node (:func:`install_certificate`), into a
  directory :class:`~hogwild_plugins.ps.etcd_tls.EtcdTls` reads (``ca.crt``, ``client.crt`` and
  ``client.key``; a member's ``server.crt`` and ``server.key``, which also serve it as a client).
  Every member's certificate has the common name ``hogwild etcd member`` (its name in the
  organisational unit) and no client's has: the members admit only that name on their peer port.

The certificates carry what RFC 5280 asks for (as
:func:`~hogwild_plugins.ps.etcd_tls.make_etcd_tls`'s do), so that a client verifying strictly
(``ssl.VERIFY_X509_STRICT``, Python 3.13's default) accepts them: the CA's critical basic
constraints, its key usage and subject key identifier; a member's or client's key usage and the
authority key identifier naming the CA's key.

Every request's signature is checked (it proves its sender holds the key) and its names are
checked against what the driver knows, never taken from the request: the certificate the driver
signs carries the names the driver chose.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from hogwild_plugins.ps.etcd_tls import (
    CA,
    CLIENT,
    MEMBER_CN,
    SERVER,
    EtcdTls,
    key_usage,
    write_private,
)

from hogwild.errors import ConfigError, HogwildError

__all__ = [
    "CLIENT",
    "MEMBER",
    "CertificateRequestError",
    "JobCA",
    "install_certificate",
    "request_certificate",
]

MEMBER = SERVER  # an etcd member's certificate: its files are server.crt and server.key
MAX_REQUEST_BYTES = 16 << 10  # a PEM request of one EC key and one address is under 1 KiB
DAYS = 30


class CertificateRequestError(HogwildError):
    """A certificate signing request the job's CA refuses (named, with why)."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(common: str, unit: str = ""):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    parts = [x509.NameAttribute(NameOID.COMMON_NAME, common)]
    if unit:  # who, where the common name is a class (every member's the same)
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    return x509.Name(parts)


class JobCA:
    """The job's etcd certificate authority, held by the driver (see the module docstring).

    Args:
        key: The CA's private key (a ``cryptography`` EC key).
        certificate: The CA's certificate.
    """

    def __init__(self, key, certificate) -> None:
        self.key, self.certificate = key, certificate

    @classmethod
    def make(cls, days: int = DAYS) -> JobCA:
        """A new CA, its key in this process's memory alone (nothing reads it back: a resumed
        job's CA is made anew, its members are new too).

        Raises:
            ConfigError: The cryptography package is missing.
        """
        try:
            from cryptography import x509
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.asymmetric import ec
        except ImportError:
            raise ConfigError(
                'cluster.etcd = "job" on other nodes makes the etcd certificates with the '
                "cryptography package: pip install 'hogwild[cluster]' (or cryptography), or give "
                "your own with cluster.etcd_tls = DIR"
            ) from None
        key = ec.generate_private_key(ec.SECP256R1())
        subject = _name("hogwild job etcd CA")
        now = _now()
        certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(key_usage(x509, ca=True), critical=True)
            # RFC 5280 4.2.1.2: a CA names its key, which its certificates' AKI points at
            # (strict verification, Python 3.13's default, refuses a CA without one)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )  # fmt: skip
        return cls(key, certificate)

    @property
    def pem(self) -> bytes:
        """The CA's certificate (public), what every member and client trusts."""
        from cryptography.hazmat.primitives import serialization

        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def sign_member(self, request: bytes, address: str, member: str) -> bytes:
        """A member certificate (server and peer TLS, and client of the other members) for the
        request of ``member``, placed by the driver at ``address``: the request must name
        exactly that address and nothing else.

        Raises:
            CertificateRequestError: The request is malformed, not signed by its key, or names
                anything but ``address``.
        """
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID

        csr = self._checked(request, member)
        try:
            asked = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            asked = x509.SubjectAlternativeName([])
        expected = _alternative_name(address)
        if list(asked) != [expected]:
            named = ", ".join(str(getattr(n, "value", n)) for n in asked) or "nothing"
            raise CertificateRequestError(
                f"{member}: its certificate request names {named}, but the driver placed it at "
                f"{address}; a member's certificate names exactly its node's address"
            )
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        # one common name for every member: their peer port admits that name alone
        return self._issue(csr, _name(MEMBER_CN, member), usages, [expected])

    def sign_client(self, request: bytes, role: str) -> bytes:
        """A client certificate for role ``role`` (its name, client authentication only; no
        address: a client serves nothing) for the request made on its node.

        Raises:
            CertificateRequestError: The request is malformed or not signed by its key.
        """
        from cryptography.x509.oid import ExtendedKeyUsageOID

        csr = self._checked(request, role)
        subject = _name(f"hogwild etcd client {role}")
        return self._issue(csr, subject, [ExtendedKeyUsageOID.CLIENT_AUTH])

    def client_directory(self, directory: str | os.PathLike, role: str) -> EtcdTls:
        """A client certificate for a role on this node (the driver's own): its key made in
        ``directory`` here, the request signed at once."""
        request = request_certificate(directory, CLIENT)
        return install_certificate(directory, CLIENT, self.sign_client(request, role), self.pem)

    def _checked(self, request: bytes, who: str):
        from cryptography import x509
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives.asymmetric import ec

        if not isinstance(request, bytes) or len(request) > MAX_REQUEST_BYTES:
            raise CertificateRequestError(
                f"{who}: its certificate request is not PEM bytes under {MAX_REQUEST_BYTES} bytes"
            )
        try:
            csr = x509.load_pem_x509_csr(request)
        except ValueError as exc:
            raise CertificateRequestError(
                f"{who}: its certificate request is not a PEM request ({exc})"
            ) from None
        try:
            signed, key = csr.is_signature_valid, csr.public_key()
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise CertificateRequestError(
                f"{who}: its certificate request's key cannot be read ({exc})"
            ) from None
        if not signed:
            raise CertificateRequestError(
                f"{who}: its certificate request is not signed by the key it carries"
            )
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            raise CertificateRequestError(f"{who}: expected an EC P-256 key in its request")
        return csr

    def _issue(self, csr, subject, usages: list, names: list | None = None) -> bytes:
        """A certificate for ``csr``'s key with the subject, usages and names given: nothing
        the request asks for (its names, usages, a CA's powers) is carried over."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization

        now = _now()
        builder = (
            x509.CertificateBuilder().subject_name(subject)
            .issuer_name(self.certificate.subject).public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(self.certificate.not_valid_after_utc)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(key_usage(x509, ca=False), critical=True)  # ECDSA TLS signs only
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            # RFC 5280 4.2.1.1-2: which CA key signed it (strict verification requires it)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(csr.public_key()),
                           critical=False)
        )  # fmt: skip
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        return certificate.public_bytes(serialization.Encoding.PEM)


def _alternative_name(address: str):
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(address))
    except ValueError:
        return x509.DNSName(address)


def request_certificate(directory: str | os.PathLike, kind: str, address: str = "") -> bytes:
    """On the node that will use it: a new key in ``directory`` (made mode 0700; the key file
    0600, replacing an earlier one) and a certificate signing request for it, the only part
    that leaves the node. ``kind`` is :data:`CLIENT` or :data:`MEMBER` (whose request names
    ``address``, the node's)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if kind not in (CLIENT, MEMBER) or (kind == MEMBER) != bool(address):
        raise ValueError(f"kind {kind!r}, address {address!r}: a member names its address")
    root = Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    path = root / f"{kind}.key"
    path.unlink(missing_ok=True)
    (root / f"{kind}.crt").unlink(missing_ok=True)  # a restarted role's old one is not its key's
    write_private(path, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    builder = x509.CertificateSigningRequestBuilder().subject_name(_name(f"hogwild etcd {kind}"))
    if address:
        names = x509.SubjectAlternativeName([_alternative_name(address)])
        builder = builder.add_extension(names, critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def install_certificate(
    directory: str | os.PathLike, kind: str, certificate: bytes, ca: bytes
) -> EtcdTls:
    """On the node: the signed ``certificate`` for the key :func:`request_certificate` made in
    ``directory``, and the CA's, written there; the directory, checked.

    Raises:
        CertificateRequestError: ``certificate`` is not for this directory's key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    root = Path(directory)
    key = serialization.load_pem_private_key((root / f"{kind}.key").read_bytes(), None)
    try:
        given = x509.load_pem_x509_certificate(certificate).public_key()
        x509.load_pem_x509_certificate(ca)
    except ValueError as exc:
        raise CertificateRequestError(f"{root}: the certificate sent is not PEM ({exc})") from None
    der, info = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    mine = key.public_key().public_bytes(der, info)
    given = given.public_bytes(der, info)
    if given != mine:
        raise CertificateRequestError(f"{root}: the certificate sent is not for its key")
    for name, data in ((f"{kind}.crt", certificate), (f"{CA}.crt", ca)):
        temporary = root / f".{name}.{os.getpid()}.tmp"
        temporary.write_bytes(data)
        os.replace(temporary, root / name)
    return EtcdTls.load(root, server=kind == MEMBER, member=kind == MEMBER)
