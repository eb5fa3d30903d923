"""A server started in place of a process that still holds its address (``Router.start``'s
``bind_wait_s``, review S's risk 4): the bind that finds the port in use is tried again until
the holder lets go, within the wait; a port held past it, or no wait, fails naming the address."""

from __future__ import annotations

import socket
import threading

import pytest

from hogwild.errors import HogwildError
from hogwild.net.address import parse_address
from hogwild.net.router import Router


class Nothing:
    """A handler never called: no request is sent to these routers."""

    def handle(self, request):  # pragma: no cover - never reached
        raise AssertionError(request)


def held_port() -> socket.socket:
    """A listening TCP socket on a free loopback port (the process on its way out)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def test_a_bind_to_a_port_in_use_waits_for_its_holder_within_the_wait():
    holder = held_port()
    address = parse_address(f"127.0.0.1:{holder.getsockname()[1]}")
    released = threading.Timer(0.2, holder.close)
    released.start()
    router = Router(address, Nothing())
    try:
        assert router.start(bind_wait_s=30.0) == address  # bound once the holder closed
    finally:
        router.stop()
        router.close()
        released.join()
        holder.close()


@pytest.mark.parametrize("wait_s", [0.0, 0.2])
def test_a_port_held_past_the_wait_fails_naming_the_address(wait_s):
    holder = held_port()
    address = parse_address(f"127.0.0.1:{holder.getsockname()[1]}")
    router = Router(address, Nothing())
    try:
        with pytest.raises(HogwildError, match=rf"cannot listen on .*{address.port}.*in use"):
            router.start(bind_wait_s=wait_s)
    finally:
        router.close()
        holder.close()
