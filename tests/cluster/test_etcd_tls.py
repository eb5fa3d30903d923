"""etcd over TLS with client certificates: a real etcd started with the certificates a job
makes (with the cryptography package, and with the openssl command), clients with and without
them, and the driver's controller starting its etcd under ``cluster.etcd_tls``."""

from __future__ import annotations

import pytest
import requests
from hogwild_plugins.ps.controller import EtcdController
from hogwild_plugins.ps.etcd import Etcd, EtcdProcess, EtcdUnavailable
from hogwild_plugins.ps.etcd_tls import EtcdTls, make_etcd_tls

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
    tls = make_etcd_tls(tmp_path / "tls", ["127.0.0.1"])
    said = []
    controller = EtcdController("", "tlsjob", said.append, tls=str(tls.directory))
    try:
        with Etcd(controller.address, prefix="/hogwild/tlsjob/", tls=str(tls.directory)) as etcd:
            holder, _ = etcd.get("driver")  # the driver's claim went over TLS
            assert holder is not None
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
