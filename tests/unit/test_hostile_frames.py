"""The hostile clients' mutations: where the header's fields are, and that each breaks a message."""

from __future__ import annotations

import numpy as np

from bench.support.hostile_frames import FIELD_OFFSETS, SEQ_OFFSET, mutate, with_seq
from hogwild.net.wire import HEADER, Header, MsgType, pack_header, unpack_header


def test_field_offsets_are_where_the_header_puts_each_field():
    values = list(HEADER.unpack(bytes(HEADER.size)))
    assert len(FIELD_OFFSETS) == len(values)
    for i, at in enumerate(FIELD_OFFSETS):
        marked = list(values)
        marked[i] = (
            b"\xff\xff\xff\xff" if i == 0 else (5e-324 if isinstance(values[i], float) else 1)
        )
        packed = HEADER.pack(*marked)
        first = next(n for n, byte in enumerate(packed) if byte)  # the field's first nonzero byte
        assert first == at, (i, at, first)


def test_with_seq_renumbers_a_header_only():
    head = pack_header(Header(MsgType.PULL, job=5, seq=1))
    assert unpack_header(with_seq([head], 77)[0]).seq == 77
    assert SEQ_OFFSET == 28
    assert with_seq([b"short", b"x"], 9) == [b"short", b"x"]  # not a header: left alone


def test_every_mutation_changes_the_message():
    rng = np.random.default_rng(7)
    message = [pack_header(Header(MsgType.PULL, job=5, seq=1)), b"\x01" * 16, b"\x02" * 8]
    for _ in range(2000):
        assert mutate(message, rng) != message
    assert mutate([message[0]], rng) != [message[0]]  # a header alone: still broken somehow
