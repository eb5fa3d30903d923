"""Starting etcd (one member or a cluster) again when only a port was taken meanwhile: the free
port a start probes can be bound by another process before etcd binds it, and that one reason
alone is worth another attempt."""

from __future__ import annotations

import time

import pytest
from hogwild_plugins.ps.etcd_process import START_ATTEMPTS, _start_retrying

from hogwild.errors import HogwildError

TAKEN = "listen tcp 127.0.0.1:2379: bind: address already in use"


def attempts_answering(*answers: str | None):
    """An attempt that answers ``answers`` in turn, and the record of attempts and undos."""
    record: list[str] = []
    queue = list(answers)

    def attempt() -> str | None:
        record.append("attempt")
        return queue.pop(0)

    return attempt, lambda: record.append("undo"), record


def test_a_port_taken_is_tried_again_and_a_start_that_then_succeeds_returns():
    attempt, undo, record = attempts_answering(TAKEN, TAKEN, None)
    _start_retrying(attempt, undo, time.monotonic() + 60, "etcd")
    assert record == ["attempt", "undo", "attempt", "undo", "attempt"]


def test_ports_taken_every_time_give_up_after_the_last_attempt_with_its_reason():
    attempt, undo, record = attempts_answering(*[TAKEN] * START_ATTEMPTS)
    with pytest.raises(HogwildError, match="^the etcd cluster did not start: listen tcp"):
        _start_retrying(attempt, undo, time.monotonic() + 60, "the etcd cluster")
    assert record == ["attempt", "undo"] * START_ATTEMPTS


@pytest.mark.parametrize(
    ("answer", "deadline_s"), [("etcd exited with status 1", 60.0), (TAKEN, -1.0)]
)
def test_another_failure_or_a_deadline_passed_is_not_tried_again(answer, deadline_s):
    attempt, undo, record = attempts_answering(answer, None)
    with pytest.raises(HogwildError, match="^etcd did not start: "):
        _start_retrying(attempt, undo, time.monotonic() + deadline_s, "etcd")
    assert record == ["attempt", "undo"]


def test_work_folders_named_by_anyone_in_tmp_are_not_taken_for_a_dead_owners(tmp_path):
    from hogwild_plugins.ps.etcd_process import WORK_PREFIX, sweep_stale_work

    # any user may make these in the shared /tmp: a "²" passes str.isdigit and int() refuses
    # it; a number past any pid makes os.kill overflow. Neither may fail every etcd start.
    foreign = [tmp_path / f"{WORK_PREFIX}²-x", tmp_path / f"{WORK_PREFIX}{'9' * 30}-x"]
    for folder in foreign:
        folder.mkdir()
    dead = tmp_path / f"{WORK_PREFIX}{2**22 + 1}-x"  # above the pid limit: no such process
    dead.mkdir()
    assert sweep_stale_work(tmp_path) == [dead]
    assert all(folder.exists() for folder in foreign) and not dead.exists()
