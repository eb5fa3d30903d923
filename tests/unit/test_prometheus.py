"""A role's Prometheus endpoint: which port each role gets, which counters become gauges, and a
real scrape over HTTP on loopback."""

from __future__ import annotations

import urllib.request

import pytest

pytest.importorskip("prometheus_client")

from hogwild.cluster.prometheus import role_ports  # noqa: E402
from hogwild.net.metrics import gauges, serve_metrics  # noqa: E402
from hogwild.net.ports import free_port  # noqa: E402


def test_the_driver_takes_the_first_port_then_servers_then_replicas():
    assert role_ports(9100, ps=2, data=1, replicas=2) == {
        "driver": 9100,
        "ps 0": 9101,
        "ps 1": 9102,
        "data 0": 9103,
        "replica 0": 9104,
        "replica 1": 9105,
    }


def test_numbers_and_histograms_become_gauges_and_the_rest_is_left_out():
    status = {
        "updates_per_s": 12.5,
        "applied": 3,
        "alive": True,
        "staleness_histogram": {"0": 7, "1": 2},
        "rule": "adagrad",
        "buckets": [0, 1],
        "loss": float("nan"),
        "mixed": {"a": 1, "b": "x"},
    }
    families = {f.name: f for f in gauges("ps", "ps 0", status)}
    assert set(families) == {
        "hogwild_ps_updates_per_s",
        "hogwild_ps_applied",
        "hogwild_ps_alive",
        "hogwild_ps_staleness_histogram",
    }
    histogram = families["hogwild_ps_staleness_histogram"].samples
    assert [(s.labels["key"], s.value) for s in histogram] == [("0", 7.0), ("1", 2.0)]
    assert families["hogwild_ps_updates_per_s"].samples[0].labels == {"role": "ps 0"}


def test_an_endpoint_serves_the_status_of_the_moment_and_releases_its_port():
    seen = {"examples": 0}

    def status() -> dict:
        seen["examples"] += 100
        return dict(seen)

    endpoint = serve_metrics("replica", "replica 1", free_port(), status)
    try:
        for expected in ("100.0", "200.0"):
            with urllib.request.urlopen(f"http://{endpoint.address}/metrics", timeout=5) as page:
                text = page.read().decode()
            assert f'hogwild_replica_examples{{role="replica 1"}} {expected}' in text
    finally:
        endpoint.close()
    assert serve_metrics("replica", "replica 1", 0, status) is None  # port 0: metrics off
