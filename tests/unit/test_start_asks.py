"""``ask_at_start`` (plugins/ps/replication/start_asks.py) on asks given as plain callables: an
ask etcd did not answer is asked again until it is answered, and each such try is logged; etcd
silent past the bound is an error naming the tries, and so is a lease that lapses before its key
is written at every try; a stop asked for ends the tries without another; an error other than
etcd's silence or a lapsed lease is raised at once. The asks of a real etcd are
tests/cluster/test_ps_membership_start.py's and tests/cluster/test_ps_serve_registering.py's."""

from __future__ import annotations

import pytest
from hogwild_plugins.ps.etcd import EtcdUnavailable, LeaseExpired
from hogwild_plugins.ps.replication.start_asks import StartStopped, ask_at_start

from hogwild.errors import HogwildError


class Asks:
    """An ask that etcd leaves unanswered ``silent`` times, then answers ``"answer"``."""

    def __init__(self, silent: int, error: Exception | None = None) -> None:
        self.silent, self.error, self.tries = silent, error, 0

    def __call__(self) -> str:
        self.tries += 1
        if self.error is not None:
            raise self.error
        if self.tries <= self.silent:
            raise EtcdUnavailable(f"etcd at 127.0.0.1:1 did not answer (try {self.tries})")
        return "answer"


def test_an_unanswered_ask_is_asked_again_and_each_try_is_logged(capsys):
    ask = Asks(silent=2)
    assert ask_at_start(ask, "registration", 3, within_s=30.0) == "answer"
    assert ask.tries == 3
    said = capsys.readouterr().err.splitlines()  # the role's log lines go to stderr
    assert len(said) == 2, said
    assert said[0].startswith("hogwild ps 3: WARNING: etcd did not answer its registration (try 1;")
    assert "(try 2; asking again for up to" in said[1]


def test_etcd_silent_past_the_bound_is_an_error_naming_the_tries():
    with pytest.raises(EtcdUnavailable, match=r"server 3: etcd did not answer its registration "
                       r"in \d+ tries over 1 s: etcd at 127.0.0.1:1 did not answer"):  # fmt: skip
        ask_at_start(Asks(silent=1000), "registration", 3, within_s=1.0)


def test_a_stop_ends_the_tries_without_another():
    ask = Asks(silent=1000)
    with pytest.raises(StartStopped, match="server 3: stopped while asking etcd for its nonce"):
        ask_at_start(ask, "nonce", 3, within_s=30.0, stopping=lambda: ask.tries >= 2)
    assert ask.tries == 2


def test_an_error_other_than_silence_is_raised_at_once():
    ask = Asks(silent=0, error=HogwildError("etcd grants leases of at least 3 s, not 2 s"))
    with pytest.raises(HogwildError, match="at least 3 s"):
        ask_at_start(ask, "registration", 3, within_s=30.0)
    assert ask.tries == 1


def test_a_lapsed_lease_is_asked_again_and_past_the_bound_is_an_error_naming_the_tries(capsys):
    lapsed = LeaseExpired("etcd at 127.0.0.1:1: lease 7 expired or was revoked")
    ask = Asks(silent=0, error=lapsed)
    with pytest.raises(LeaseExpired, match=r"server 3: its registration's lease lapsed before "
                       r"its key was written, \d+ tries over 1 s: etcd at"):  # fmt: skip
        ask_at_start(ask, "registration", 3, within_s=1.0)
    assert ask.tries >= 2
    said = capsys.readouterr().err.splitlines()
    assert said[0].startswith("hogwild ps 3: WARNING: etcd let the lease of its registration "
                              "lapse before its key was written (try 1;")  # fmt: skip
