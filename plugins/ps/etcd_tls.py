"""TLS for etcd: a directory of certificates, made for a job or given by the user.

etcd's traffic (bucket records, leases) beyond loopback goes over TLS with client certificates
when ``cluster.etcd_tls = DIR`` names such a directory. It holds PEM files::

    DIR/ca.crt                  the authority every member and every client trusts
    DIR/client.crt, client.key  the clients' certificate (servers, the driver)
    DIR/server.crt, server.key  the members' certificate (its names: the members' addresses);
                                only where an etcd member is started from it

:func:`make_etcd_tls` makes one (with the ``cryptography`` package, else the ``openssl``
command): a CA of its own, a server certificate naming the given hosts (and loopback), a client
certificate; keys are created mode 0600, the directory mode 0700. Each certificate carries the
extensions RFC 5280 asks for, which strict verification (``ssl.VERIFY_X509_STRICT``, Python 3.13's
default) checks: the CA's basic constraints (critical), key usage (certificate signing) and subject
key identifier; every other's key usage (signing) and authority key identifier.
:class:`EtcdTls` reads a directory, checking that what is needed is there, and says how etcd3gw's
client and the etcd binary take it. etcd is started with ``--client-cert-auth``: a client without a
certificate signed by the directory's CA is refused during the handshake.

``cluster.etcd_tls = "job"`` (:data:`JOB`): the certificates the job made itself
(:mod:`~hogwild_plugins.ps.etcd_ca`), a directory of each process's own on its own node: the
driver's named by :func:`use_etcd_tls`, a role's by the environment variable
:data:`ETCD_TLS_ENV` its launcher sets. A member's directory holds ``server.crt`` and
``server.key`` alone: its certificate serves it as a client too (``EtcdTls(member=True)``,
only as :func:`~hogwild_plugins.ps.etcd_ca.install_certificate` returns it; a user's directory
needs its client files). Every job-made member certificate carries one common name,
:data:`MEMBER_CN`, and its members accept peers (raft) only with that name: the job's client
certificates, signed by the same CA, cannot reach the members' peer port.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hogwild.errors import ConfigError

__all__ = [
    "ETCD_TLS_ENV",
    "JOB",
    "MEMBER_CN",
    "EtcdTls",
    "drop_etcd_tls",
    "key_usage",
    "make_etcd_tls",
    "use_etcd_tls",
    "write_private",
]

CA, CLIENT, SERVER = "ca", "client", "server"
JOB = "job"  # cluster.etcd_tls: the certificates the job makes (each process its own)
MEMBER_CN = "hogwild etcd member"  # every job-made member certificate's common name, no other's
ETCD_TLS_ENV = "HOGWILD_ETCD_TLS"
"""The environment variable naming a role's own directory of job-made etcd certificates."""
_own: Path | None = None


def use_etcd_tls(directory: str | os.PathLike | None) -> None:
    """This process's own directory of job-made certificates (what ``"job"`` means here);
    None: the environment's again."""
    global _own
    _own = Path(directory) if directory is not None else None


def drop_etcd_tls() -> None:
    """Remove this process's own directory of job-made certificates (:func:`use_etcd_tls`'s:
    the driver's key, made for its job) and forget it: a later ``"job"`` here has none, not a
    dead CA's. A role's, named by the environment, is its launcher's to remove."""
    global _own
    own, _own = _own, None
    if own is not None:
        shutil.rmtree(own, ignore_errors=True)


def _job_directory() -> Path:
    if _own is not None:
        return _own
    named = os.environ.get(ETCD_TLS_ENV, "")
    if not named:
        raise ConfigError(
            'cluster.etcd_tls = "job": this process has no certificate of the job (the job '
            f"makes one for each role it starts, named by {ETCD_TLS_ENV}); a role started by "
            "hand takes cluster.etcd_tls = DIR of certificates the etcd trusts"
        )
    return Path(named)


@dataclass(frozen=True)
class EtcdTls:
    """A directory of etcd certificates (see the module docstring). ``member``: a job-made
    member's directory, whose server certificate serves it as a client too and whose etcd
    accepts only peers named :data:`MEMBER_CN`."""

    directory: Path
    member: bool = False

    @classmethod
    def load(
        cls, directory: str | os.PathLike, *, server: bool = False, member: bool = False
    ) -> EtcdTls:
        """The directory's certificates, checked to be there (``server``: the members' too;
        ``member``: a job-made member's, see the class docstring).

        Raises:
            ConfigError: A file is missing, naming it and how to make the directory.
        """
        if str(directory) == JOB:
            directory = _job_directory()
        tls = cls(Path(directory), member=member)
        needed = [tls.ca, tls.client_cert, tls.client_key]
        if server:
            needed += [tls.server_cert, tls.server_key]
        missing = [p.name for p in needed if not p.is_file()]
        if missing:
            raise ConfigError(
                f"cluster.etcd_tls = {str(directory)!r}: missing {', '.join(missing)}; expected "
                "a directory with ca.crt, client.crt and client.key (server.crt and server.key "
                "where an etcd is started from it), PEM files"
            )
        return tls

    @property
    def ca(self) -> Path:
        return self.directory / f"{CA}.crt"

    @property
    def client_cert(self) -> Path:
        return self._client(f"{CLIENT}.crt", f"{SERVER}.crt")

    @property
    def client_key(self) -> Path:
        return self._client(f"{CLIENT}.key", f"{SERVER}.key")

    def _client(self, name: str, member: str) -> Path:
        """A client file, or a job-made member's own (its certificate serves it as a client)."""
        return self.directory / (member if self.member else name)

    @property
    def server_cert(self) -> Path:
        return self.directory / f"{SERVER}.crt"

    @property
    def server_key(self) -> Path:
        return self.directory / f"{SERVER}.key"

    def client_options(self) -> dict:
        """etcd3gw's ``client(...)`` keywords for this directory's client certificate: a
        session of its own that trusts the directory's CA alone."""
        import requests

        session = requests.Session()
        # requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's CA: etcd's
        # members are checked against the job's CA, never the machine's
        session.trust_env = False
        session.verify = str(self.ca)
        session.cert = (str(self.client_cert), str(self.client_key))
        return {"protocol": "https", "session": session}

    def ssl_context(self) -> ssl.SSLContext:
        """An ``ssl`` context for ``http.client`` holding what :meth:`client_options`' session
        holds: the directory's CA alone trusted, the member's certificate checked against the
        address asked, this directory's client certificate shown."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context

    def requests_options(self) -> dict:
        """``requests``' keywords (``verify``, ``cert``) for the same."""
        return {"verify": str(self.ca), "cert": (str(self.client_cert), str(self.client_key))}

    def server_args(self) -> list[str]:
        """The etcd binary's flags serving clients (and peers) over TLS, clients' certificates
        required and checked against the CA; a job-made member's peers must be members too
        (:data:`MEMBER_CN`: the job's CA signs its clients' certificates as well)."""
        cert, key, ca = self.server_cert, self.server_key, self.ca
        peers_named = [f"--peer-cert-allowed-cn={MEMBER_CN}"] if self.member else []
        return [
            f"--cert-file={cert}", f"--key-file={key}", f"--trusted-ca-file={ca}",
            "--client-cert-auth",
            f"--peer-cert-file={cert}", f"--peer-key-file={key}", f"--peer-trusted-ca-file={ca}",
            "--peer-client-cert-auth", *peers_named,
        ]  # fmt: skip


def make_etcd_tls(
    directory: str | os.PathLike, hosts: Sequence[str], days: int = 30, tool: str = "auto"
) -> EtcdTls:
    """Make a TLS directory: a CA, a server certificate naming ``hosts`` (IP addresses or DNS
    names) and loopback, a client certificate. An existing directory's files are kept (a
    resumed job's). ``tool``: ``"cryptography"``, ``"openssl"`` or ``"auto"`` (the package
    if it is installed, else the command).

    Raises:
        ConfigError: Neither ``cryptography`` nor ``openssl`` is there, or the directory
            cannot be written.
    """
    root = Path(directory)
    if (root / f"{CA}.crt").is_file():
        return EtcdTls.load(root, server=True)
    names = sorted({*hosts, "127.0.0.1", "localhost"})
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if tool == "auto":
            try:
                import cryptography  # noqa: F401 - the preferred maker; openssl otherwise
            except ImportError:
                tool = "openssl"
        if tool == "openssl":
            _with_openssl(root, names, days)
        elif tool in ("auto", "cryptography"):
            _with_cryptography(root, names, days)
        else:
            raise ConfigError(f"tool {tool!r}: expected 'auto', 'cryptography' or 'openssl'")
    except OSError as exc:
        raise ConfigError(f"{root}: cannot make etcd's certificates there ({exc})") from None
    return EtcdTls.load(root, server=True)


def write_private(path: Path, data: bytes) -> None:
    """A new key file, mode 0600 from its creation (never readable by others, even briefly)."""
    _write(path, data, 0o600)


def _write(path: Path, data: bytes, mode: int) -> None:
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)  # private from the start
    with os.fdopen(handle, "wb") as out:
        out.write(data)


def _with_cryptography(root: Path, names: list[str], days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def key_pem(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name("hogwild etcd CA"))
        .issuer_name(name("hogwild etcd CA")).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(x509, ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    _write(root / f"{CA}.crt", ca.public_bytes(serialization.Encoding.PEM), 0o644)
    sans = [_san(x509, n) for n in names]
    for who, usages in (
        (SERVER, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
        (CLIENT, [ExtendedKeyUsageOID.CLIENT_AUTH]),
    ):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder().subject_name(name(f"hogwild etcd {who}"))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(key_usage(x509, ca=False), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256())
        )  # fmt: skip
        _write(root / f"{who}.key", key_pem(key), 0o600)
        _write(root / f"{who}.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def key_usage(x509, *, ca: bool):
    """The key usage (RFC 5280 4.2.1.3, critical) of a certificate hogwild's makers issue, with
    the ``cryptography`` package's ``x509`` module: a CA's signs certificates and CRLs; a member's
    or client's signs only (ECDSA TLS keys sign, never encipher)."""
    return x509.KeyUsage(
        digital_signature=not ca, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _san(x509, name: str):
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


CA_CONFIG = """\
[req]
prompt = no
distinguished_name = ca_name
x509_extensions = ca_extensions

[ca_name]
CN = hogwild etcd CA

[ca_extensions]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
"""
"""The whole openssl configuration the job's CA is made with (``req -x509 -config``): every
extension of the CA listed once, as :func:`_with_cryptography` gives them (SKI included, which
the leaves' AKI names), none taken from the system's configuration."""


def _with_openssl(root: Path, names: list[str], days: int) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ConfigError(
            "making etcd's certificates needs the cryptography package (pip install "
            "cryptography) or the openssl command; or give your own with cluster.etcd_tls = DIR"
        )
    sans = ",".join(f"IP:{n}" if _is_ip(n) else f"DNS:{n}" for n in names)

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    with tempfile.TemporaryDirectory(dir=root) as work:
        w = Path(work)
        run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", str(w / "ca.key"))
        # The system's openssl.cnf is not read: its v3_ca section, applied by req -x509, would
        # add a second basicConstraints beside an -addext one on OpenSSL 1.1.1 (which appends,
        # where 3.x replaces), and Go's crypto/x509 (etcd's) refuses duplicate extensions.
        (w / "ca.cnf").write_text(CA_CONFIG, encoding="ascii")
        run("req", "-x509", "-new", "-key", str(w / "ca.key"), "-config", str(w / "ca.cnf"),
            "-days", str(days), "-out", str(w / "ca.crt"))  # fmt: skip
        for who, usage in ((SERVER, "serverAuth,clientAuth"), (CLIENT, "clientAuth")):
            key = str(w / f"{who}.key")
            run("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
            run("req", "-new", "-key", str(w / f"{who}.key"), "-subj", f"/CN=hogwild etcd {who}",
                "-out", str(w / f"{who}.csr"))  # fmt: skip
            (w / f"{who}.ext").write_text(
                f"subjectAltName={sans}\nextendedKeyUsage={usage}\n"
                "keyUsage=critical,digitalSignature\nbasicConstraints=critical,CA:FALSE\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
                encoding="ascii",
            )
            run("x509", "-req", "-in", str(w / f"{who}.csr"), "-CA", str(w / "ca.crt"),
                "-CAkey", str(w / "ca.key"), "-CAcreateserial", "-days", str(days),
                "-extfile", str(w / f"{who}.ext"), "-out", str(w / f"{who}.crt"))  # fmt: skip
            _write(root / f"{who}.key", (w / f"{who}.key").read_bytes(), 0o600)
            _write(root / f"{who}.crt", (w / f"{who}.crt").read_bytes(), 0o644)
        _write(root / f"{CA}.crt", (w / "ca.crt").read_bytes(), 0o644)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
