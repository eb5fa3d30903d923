"""The etcd client (:mod:`hogwild_plugins.ps.etcd`) where something other than a healthy etcd
answers, or fails under it: closing a client whose sessions fail to close, a hedged read among
a broken member and leaderless ones, a proxy's error page. Against tiny real HTTP servers of the
tests' own (:class:`~tests.cluster.test_etcd_poll.Gateway`), no etcd: each case is a reply no
healthy etcd sends on cue."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.etcd import Etcd

from hogwild.errors import HogwildError

pytestmark = pytest.mark.kernel_free


def test_closing_a_client_closes_every_session_though_one_fails_to() -> None:
    # Review AE 1: one session failing to close (as one did, its lent connections changed
    # under the closing thread) must not leave the later members' sessions open.
    client = Etcd("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", prefix="/j/")  # never asked
    closed = []
    for i, member in enumerate(client._clients):
        close = member.session.close

        def noted(i=i, close=close) -> None:
            closed.append(i)
            close()
            if i == 0:
                raise RuntimeError("Set changed size during iteration")

        member.session.close = noted
    with pytest.raises(HogwildError, match="closing a session failed: Set changed size"):
        client.close()
    assert closed == [0, 1, 2]
