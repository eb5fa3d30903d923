"""Fixtures of the hosts tier: network-namespace hosts, skipped (one line) where none can be made.

``hosts3`` is three hosts joined by a bridge, closed by its finaliser however the test ends (the
namespaces, their interfaces and every process in them gone). A session killed before its
finalisers ran leaves namespaces named after its dead pid; the next :class:`Hosts` removes them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hosts.harness import Hosts, unavailable

_why_not: list[str | None] = []  # asked once per session


def skip_without_namespaces() -> None:
    """Skip the calling test, in one line, where network namespaces cannot be made here."""
    if not _why_not:
        _why_not.append(unavailable())
    if _why_not[0] is not None:
        pytest.skip(f"no network-namespace hosts here: {_why_not[0]}")


@pytest.fixture
def make_hosts():
    """A factory of :class:`Hosts` (``make_hosts(n)``); each one made is closed after the test."""
    skip_without_namespaces()
    made: list[Hosts] = []

    def make(n: int) -> Hosts:
        hosts = Hosts(n)
        made.append(hosts)
        return hosts

    try:
        yield make
    finally:
        for hosts in made:
            hosts.close()


@pytest.fixture
def hosts3(make_hosts) -> Iterator[Hosts]:
    """Three hosts joined by a bridge, closed after the test."""
    yield make_hosts(3)
