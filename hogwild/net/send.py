"""Sending one message with the fewest pyzmq calls: small frames copied, arrays without copies.

pyzmq's ``send_multipart(..., copy=False)`` builds a zero-copy ``Frame`` for every part, even a
few bytes long, and combines the flag enums in Python for each one: a reply of two small frames
(the client's identity and a header) costs several times what two plain sends do. A server's
network thread sends one such reply per request, a visible part of the Python a push costs, so
that is worth having. Arrays still go without a copy
(pyzmq copies those under its copy threshold anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq

__all__ = ["send_message"]

_MORE = int(zmq.SNDMORE)


def send_message(sock: zmq.Socket, small: Sequence, arrays: Sequence = (), flags: int = 0) -> None:
    """Send ``small`` (bytes: an identity, a header), copied, then ``arrays`` (anything with the
    buffer protocol, left untouched until ZeroMQ is done with it) as the frames of one message.

    Raises:
        TypeError, ValueError: An array is not a buffer, or not a contiguous one (nothing sent).
        zmq.Again: With ``zmq.NOBLOCK`` in ``flags``, the socket cannot take the message now
            (ZeroMQ decides that at the first frame: a message is sent whole or not at all).
    """
    for part in arrays:  # refused before the first frame goes: never half a message
        if not isinstance(part, (bytes, zmq.Frame)) and not memoryview(part).contiguous:
            raise ValueError(f"a frame must be a contiguous buffer, got {type(part).__name__}")
    flags = int(flags)
    last = len(small) + len(arrays) - 1
    for n, part in enumerate(small):
        sock.send(part, flags | _MORE if n < last else flags)
    for n, part in enumerate(arrays, len(small)):
        sock.send(part, flags | _MORE if n < last else flags, copy=False)
