"""etcd over TLS with client certificates: a real etcd started with a directory of certificates
(with the cryptography package, and with the openssl command), and with a member certificate the
job's own CA signed for a request made where the member runs; clients with and without them
(or with another CA's); the CA refusing a member's request for another address; the driver's
controller starting its etcd under ``cluster.etcd_tls``."""

from __future__ import annotations

import base64
import http.client
import ssl
import tempfile
import threading
import time

import pytest
import requests
from hogwild_plugins.ps.controller import EtcdController
from hogwild_plugins.ps.etcd import Etcd, EtcdProcess, EtcdUnavailable
from hogwild_plugins.ps.etcd_ca import (
    CLIENT,
    MEMBER,
    CertificateRequestError,
    JobCA,
    install_certificate,
    request_certificate,
)
from hogwild_plugins.ps.etcd_process import etcd_binary
from hogwild_plugins.ps.etcd_tls import ETCD_TLS_ENV, JOB, EtcdTls, make_etcd_tls, use_etcd_tls

from hogwild.errors import ConfigError

pytestmark = [pytest.mark.slow, pytest.mark.kernel_free]


@pytest.mark.parametrize("tool", ["cryptography", "openssl"])
def test_only_clients_with_the_jobs_certificate_reach_etcd(tmp_path, tool):
    if tool == "cryptography":
        pytest.importorskip("cryptography")
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"], tool=tool)
    assert tls.client_key.stat().st_mode & 0o077 == 0 and tls.server_key.stat().st_mode & 0o077 == 0
    with EtcdProcess(tls=str(tls.directory)) as etcd:
        etcd.start()
        with Etcd(etcd.address, prefix="/hogwild/t/", tls=str(tls.directory)) as client:
            client.put("a", {"x": 1})
            assert client.get("a")[0] == {"x": 1}
        assert _strictly_verified_range(tls, etcd.address) == 200  # RFC 5280's extensions
        with Etcd(etcd.address, prefix="/hogwild/t/", timeout_s=1.0) as plain:  # plain HTTP
            with pytest.raises(EtcdUnavailable):
                plain.get("a")
        url = f"https://{etcd.address}/v3/kv/range"
        with pytest.raises(requests.exceptions.RequestException):  # TLS, but no certificate
            requests.post(url, json={"key": "YQ=="}, verify=str(tls.ca), timeout=2.0)
        stranger = make_etcd_tls(tmp_path / "stranger", ["127.0.0.1"], tool=tool)
        with pytest.raises(requests.exceptions.RequestException):  # another CA's certificate
            requests.post(url, json={"key": "YQ=="}, timeout=2.0, verify=str(tls.ca),
                          cert=(str(stranger.client_cert), str(stranger.client_key)))  # fmt: skip


def test_the_drivers_own_etcd_serves_tls_under_cluster_etcd_tls(tmp_path):
    """The driver's own etcd under ``cluster.etcd_tls``: its claim goes over TLS, and a watch's
    polls too, on a kept HTTPS connection of their own showing the client's certificate."""
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"])
    said = []
    controller = EtcdController("", "tlsjob", said.append, tls=str(tls.directory))
    try:
        with Etcd(controller.address, prefix="/hogwild/tlsjob/", tls=str(tls.directory)) as etcd:
            holder, _ = etcd.get("driver")  # the driver's claim went over TLS
            assert holder is not None
            changed, errors = threading.Event(), []
            watch = etcd.watch("map/", changed.set, interval_s=0.02, on_error=errors.append)
            time.sleep(0.1)  # polls with nothing changed: no change reported
            assert not changed.is_set() and errors == [], errors
            etcd.put("map/0", {"primary": "a"})
            assert changed.wait(10.0) and errors == [], errors
            deadline = time.monotonic() + 10.0  # etcd's watch stream, over HTTPS with it too
            while not watch.streaming and time.monotonic() < deadline:
                time.sleep(0.01)
            assert watch.streaming and errors == [], errors
            (connection,) = [c for c in watch._poller._connections if c is not None]
            assert isinstance(connection, http.client.HTTPSConnection)  # its own, kept
            watch.cancel()
        controller.forget_server(0)
    finally:
        controller.close()
    assert said and controller.process is None


def test_a_tls_directory_missing_files_is_named(tmp_path):
    (tmp_path / "ca.crt").write_text("x")
    with pytest.raises(ConfigError, match="missing client.crt, client.key"):
        EtcdTls.load(tmp_path)
    with pytest.raises(ConfigError, match="server.crt"):
        Etcd("127.0.0.1:1", prefix="/p/", tls=str(tmp_path / "nowhere"))


def _strictly_verified_range(tls: EtcdTls, address: str) -> int:
    """The status of a range request to the etcd at ``address`` over a connection whose
    context verifies the member's chain strictly (``VERIFY_X509_STRICT``, Python 3.13's
    default: a CA's key usage and subject key identifier, a certificate's authority key
    identifier); a chain without them fails the handshake (an ``ssl.SSLError``)."""
    context = tls.ssl_context()
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), timeout=5.0, context=context)
    try:
        connection.request("POST", "/v3/kv/range", b'{"key": "YQ=="}')
        return connection.getresponse().status
    finally:
        connection.close()


def _member(ca: JobCA, directory, address: str = "127.0.0.1", name: str = "m0") -> EtcdTls:
    """A member's directory as the job makes it: key and request here, signed by ``ca``."""
    request = request_certificate(directory, MEMBER, address)
    return install_certificate(directory, MEMBER, ca.sign_member(request, address, name), ca.pem)


def test_a_member_certified_by_the_jobs_ca_serves_only_the_jobs_clients(tmp_path):
    """A member's key and request made on its node, signed by the job's CA; an etcd started
    with it answers a client the CA certified (the driver's, its key made where it runs) and
    refuses in the handshake a client with no certificate or with another job's."""
    ca = JobCA.make()
    member = _member(ca, tmp_path / "member")
    assert (tmp_path / "member" / "server.key").stat().st_mode & 0o777 == 0o600
    driver = ca.client_directory(tmp_path / "driver", "driver")
    other = JobCA.make().client_directory(tmp_path / "other", "driver")
    with EtcdProcess(tls=member) as etcd:
        etcd.start()
        use_etcd_tls(driver.directory)  # what "job" means in the driver
        try:
            with Etcd(etcd.address, prefix="/hogwild/t/", tls=JOB) as client:
                client.put("a", {"x": 1})
                assert client.get("a")[0] == {"x": 1}
        finally:
            use_etcd_tls(None)
        with Etcd(etcd.address, prefix="/hogwild/t/", timeout_s=1.0) as plain:  # plain HTTP
            with pytest.raises(EtcdUnavailable):
                plain.get("a")
        url = f"https://{etcd.address}/v3/kv/range"
        with pytest.raises(requests.exceptions.SSLError):  # TLS, but no certificate
            requests.post(url, json={"key": "YQ=="}, verify=str(driver.ca), timeout=2.0)
        with pytest.raises(requests.exceptions.SSLError):  # another job's CA's certificate
            requests.post(url, json={"key": "YQ=="}, timeout=2.0, verify=str(driver.ca),
                          cert=(str(other.client_cert), str(other.client_key)))  # fmt: skip
        # what Python 3.13's default context requires (RFC 5280's key identifiers and usages)
        assert _strictly_verified_range(driver, etcd.address) == 200
        key = base64.b64encode(b"/hogwild/t/a").decode()  # the control: the CA's client reads
        answer = requests.post(url, json={"key": key}, timeout=2.0, **driver.requests_options())
        assert answer.status_code == 200 and answer.json()["count"] == "1"


def test_the_jobs_ca_signs_a_member_only_for_the_address_it_was_placed_at(tmp_path):
    ca = JobCA.make()
    request = request_certificate(tmp_path / "m", MEMBER, "10.0.0.2")
    with pytest.raises(CertificateRequestError, match="names 10.0.0.2, but the driver placed"):
        ca.sign_member(request, "10.0.0.1", "hogwild-etcd-0")
    client_request = request_certificate(tmp_path / "c", CLIENT)  # names no address at all
    with pytest.raises(CertificateRequestError, match="names nothing"):
        ca.sign_member(client_request, "10.0.0.1", "hogwild-etcd-0")
    with pytest.raises(CertificateRequestError, match="not a PEM request"):
        ca.sign_client(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n", "ps 0")
    forged = bytearray(client_request)  # another subject, under the request's signature
    at = client_request.index(b"\n") + 40  # inside the subject's name ("hogwild etcd client")
    forged[at] = ord("A") if forged[at] != ord("A") else ord("B")
    with pytest.raises(CertificateRequestError, match="not signed by the key it carries"):
        ca.sign_client(bytes(forged), "ps 0")
    with pytest.raises(CertificateRequestError, match="not for its key"):  # a certificate for
        install_certificate(tmp_path / "c", CLIENT, ca.sign_member(request, "10.0.0.2", "m"),
                            ca.pem)  # another key is not installed  # fmt: skip
    assert not (tmp_path / "c" / "client.crt").exists()


def test_job_made_certificates_are_refused_for_an_etcd_the_job_does_not_start(tmp_path):
    with pytest.raises(ConfigError, match='cluster.etcd_tls = "job": the job makes'):
        EtcdController("", "tlsjob", print, tls=JOB)
    with pytest.raises(ConfigError, match="has no certificate of the job"):
        Etcd("127.0.0.1:1", prefix="/p/", tls=JOB)


def test_a_members_peer_port_admits_members_alone_not_the_jobs_clients(tmp_path):
    """The job's CA signs its clients' certificates too; a member's peer (raft) port answers
    another member's certificate and refuses, in the handshake, the driver's and a role's."""
    ca = JobCA.make()
    etcd = EtcdProcess(tls=_member(ca, tmp_path / "m0"))
    try:
        client, peer = etcd.urls()
        etcd.launch(etcd_binary(etcd.binary), client, peer, f"{etcd.name}={peer}")
        assert etcd.wait_ready(time.monotonic() + 20.0) is None
        other = _member(ca, tmp_path / "m1", name="m1")
        answer = requests.get(f"{peer}/members", timeout=2.0, **other.requests_options())
        assert answer.status_code == 200 and answer.json()  # the control: a member is heard
        for role in ("driver", "ps 0"):
            holder = ca.client_directory(tmp_path / role.replace(" ", "-"), role)
            with pytest.raises(requests.exceptions.SSLError):
                requests.get(f"{peer}/members", timeout=2.0, **holder.requests_options())
        answer = requests.post(f"{client}/v3/kv/range", json={"key": "YQ=="}, timeout=2.0,
                               **holder.requests_options())  # fmt: skip
        assert answer.status_code == 200  # a client still reaches the client port
    finally:
        etcd.stop()


def test_the_polls_context_trusts_the_jobs_ca_alone_and_checks_the_members_address(tmp_path):
    """The watch's HTTPS context requires a certificate, checks the member's name (its IP SAN)
    and trusts the job's CA and nothing else (no default certificates)."""
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"])
    context = tls.ssl_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs(binary_form=True) == [ssl.PEM_cert_to_DER_cert(tls.ca.read_text())]


def test_a_users_directory_without_client_files_is_refused_naming_them(tmp_path):
    """Only a job-made member's directory lets its server certificate serve it as a client."""
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"])
    tls.client_cert.unlink()
    tls.client_key.unlink()
    with pytest.raises(ConfigError, match="missing client.crt, client.key"):
        EtcdTls.load(tls.directory, server=True)
    with pytest.raises(ConfigError, match="missing client.crt"):
        EtcdProcess(tls=str(tls.directory))
    member = _member(JobCA.make(), tmp_path / "member")
    assert member.client_cert == member.server_cert  # the job's member: its own certificate


def test_a_certificate_carries_what_the_driver_chose_not_what_the_request_asked(tmp_path):
    """A request asking to be a CA, a server of some address, for server authentication: the
    client certificate signed for it is none of these (client authentication, signing only)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    greedy = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hogwild etcd member")]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("etcd.example")]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    signed = JobCA.make().sign_client(greedy, "ps 0")
    issued = x509.load_pem_x509_certificate(signed)
    extensions = issued.extensions
    assert extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    with pytest.raises(x509.ExtensionNotFound):
        extensions.get_extension_for_class(x509.SubjectAlternativeName)
    usages = list(extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    assert usages == [ExtendedKeyUsageOID.CLIENT_AUTH]
    uses = extensions.get_extension_for_class(x509.KeyUsage)
    assert uses.critical and uses.value.digital_signature and not uses.value.key_cert_sign
    assert issued.subject.rfc4514_string() == "CN=hogwild etcd client ps 0"  # not a member's


def test_the_jobs_ca_key_is_never_written(tmp_path, monkeypatch):
    """The CA's key lives in the driver's memory alone: after a CA made, a member and the
    driver certified, the only private keys on disk are theirs (none in the working or the
    temporary directory either)."""
    from cryptography.hazmat.primitives import serialization

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    ca = JobCA.make()
    _member(ca, tmp_path / "member")
    ca.client_directory(tmp_path / "run" / "private-keys" / "etcd-driver", "driver")
    der, info = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    public = ca.certificate.public_key().public_bytes(der, info)
    keys = {}
    for path in tmp_path.rglob("*"):
        if path.is_file() and b"PRIVATE KEY" in path.read_bytes():
            key = serialization.load_pem_private_key(path.read_bytes(), None)
            keys[path.relative_to(tmp_path).as_posix()] = key.public_key().public_bytes(der, info)
    assert sorted(keys) == ["member/server.key", "run/private-keys/etcd-driver/client.key"]
    assert public not in keys.values()


def test_the_drivers_job_certificate_goes_with_its_controller(tmp_path, monkeypatch):
    """A job's controller over members the launcher started with the job's certificates: once
    it closes, the driver's key directory is gone and "job" means no certificate here again
    (not a dead CA's)."""
    monkeypatch.delenv(ETCD_TLS_ENV, raising=False)
    ca = JobCA.make()
    started = []

    def start_members(count, tls):  # one member here stands for the launcher's, one per node
        assert tls == JOB
        member = EtcdProcess(tls=_member(ca, tmp_path / "member"))
        started.append(member)
        member.start()
        return member

    driver = ca.client_directory(tmp_path / "private-keys" / "etcd-driver", "driver").directory
    use_etcd_tls(driver)
    try:
        controller = EtcdController("job", "tlsjob", print, start_members=start_members)
        try:
            assert controller.tls == JOB
            with Etcd(controller.address, prefix="/hogwild/tlsjob/", tls=JOB) as etcd:
                assert etcd.get("driver")[0] is not None  # the driver's claim, over TLS
        finally:
            controller.close()
        assert started and started[0].process is None  # the member stopped with it
        assert not driver.exists()
        with pytest.raises(ConfigError, match="has no certificate of the job"):
            EtcdTls.load(JOB)
    finally:
        use_etcd_tls(None)
