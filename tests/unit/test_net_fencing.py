"""Fencing tokens and a server's fence table (:mod:`hogwild.net.fencing`), without I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hogwild.net.fencing import (
    MAX_INCARNATION,
    MAX_REPLICA,
    FenceTable,
    ReplacedError,
    fencing_token,
    token_parts,
)


@given(st.integers(0, MAX_REPLICA), st.integers(0, MAX_INCARNATION))
@settings(max_examples=200, deadline=None)
def test_a_token_names_its_replica_and_incarnation_and_is_never_zero(replica, incarnation):
    token = fencing_token(replica, incarnation)
    assert 0 < token < 2**64 and token_parts(token) == (replica, incarnation)


def test_token_zero_is_no_replica_and_out_of_range_parts_are_named():
    assert token_parts(0) is None
    with pytest.raises(ValueError, match="replica -1"):
        fencing_token(-1, 0)
    with pytest.raises(ValueError, match="incarnation 4294967296"):
        fencing_token(0, MAX_INCARNATION + 1)


def test_a_fence_refuses_older_incarnations_of_its_replica_only_and_never_goes_back():
    table = FenceTable()
    table.check(fencing_token(0, 0))  # no fences: everything is taken
    assert table.fence(0, 2) == 2
    assert table.fence(0, 1) == 2  # a late, lower fence changes nothing
    for incarnation in (0, 1):
        with pytest.raises(ReplacedError, match=f"replica 0 incarnation {incarnation} was"):
            table.check(fencing_token(0, incarnation))
    table.check(fencing_token(0, 2))
    table.check(fencing_token(0, 3))
    table.check(fencing_token(1, 0))  # another replica
    table.check(0)  # no replica (the driver, tools)
    table.validate_state()
    assert table.status() == {"fences": {"0": 2}, "replaced_refused": 2}
