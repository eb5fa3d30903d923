"""The job's etcd certificates as the openssl command makes them
(:func:`hogwild_plugins.ps.etcd_tls.make_etcd_tls` with ``tool="openssl"``), parsed with the
cryptography package: each extension once, as Go's crypto/x509 (etcd's) demands. That etcd
accepts them is tests/cluster/test_etcd_tls.py's."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from hogwild_plugins.ps.etcd_tls import make_etcd_tls

pytestmark = pytest.mark.kernel_free


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_openssl_made_ca_and_leaves_carry_each_extension_once(tmp_path, monkeypatch) -> None:
    # Review AE 2: the system's openssl.cnf is not read for the CA: its v3_ca section doubled
    # basicConstraints on OpenSSL 1.1.1. Here a system configuration whose v3_ca adds one more
    # extension (what OpenSSL 3 shows of a config leaking in) must leave no mark.
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.x509.oid import ExtensionOID

    system = tmp_path / "system.cnf"
    system.write_text(
        "[req]\ndistinguished_name = dn\nx509_extensions = v3_ca\n[dn]\n"
        "[v3_ca]\nbasicConstraints = critical,CA:TRUE\nnsComment = from the system\n",
        encoding="ascii",
    )
    monkeypatch.setenv("OPENSSL_CONF", str(system))
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"], tool="openssl")
    ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    oids = Counter(extension.oid for extension in ca.extensions)  # duplicates raise here
    assert all(count == 1 for count in oids.values()), oids
    basic = {ExtensionOID.BASIC_CONSTRAINTS, ExtensionOID.KEY_USAGE}
    basic.add(ExtensionOID.SUBJECT_KEY_IDENTIFIER)  # named by the leaves' AKI
    # OpenSSL 3 adds an AKI to a self-signed certificate by itself; 1.1.1 does not
    assert basic <= set(oids) <= basic | {ExtensionOID.AUTHORITY_KEY_IDENTIFIER}, oids
    constraints = ca.extensions.get_extension_for_oid(ExtensionOID.BASIC_CONSTRAINTS)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = ca.extensions.get_extension_for_oid(ExtensionOID.KEY_USAGE).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    ski = ca.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_KEY_IDENTIFIER).value
    for leaf_path in (tls.server_cert, tls.client_cert):
        leaf = x509.load_pem_x509_certificate(leaf_path.read_bytes())
        leaf_oids = Counter(extension.oid for extension in leaf.extensions)
        assert all(count == 1 for count in leaf_oids.values()), (leaf_path.name, leaf_oids)
        aki = leaf.extensions.get_extension_for_oid(ExtensionOID.AUTHORITY_KEY_IDENTIFIER).value
        assert aki.key_identifier == ski.digest
