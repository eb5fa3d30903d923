"""A client's wait on a silent server ends when its owner cancels it, not after every retry.

A worker that stops while its exchange thread waits on a parameter server that died must not
wait out the request's timeout and retries (5 s x 3 by default) before it can exit: the
exchanger cancels the home's client (:meth:`hogwild.net.channel.Peers.cancel`, through
:meth:`PSClient.cancel`) before it joins the thread. Real ZeroMQ peers: a ROUTER that takes
requests and never answers, and a parameter server stopped under its client.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq
from hogwild_plugins.ps.client import PSClient
from hogwild_plugins.ps.layout import FcLayer, ModelGeometry
from hogwild_plugins.ps.serving.launch import local_server
from hogwild_plugins.ps.store import RemoteHome

from hogwild.net.channel import Cancelled, Peers
from hogwild.net.wire import Header, MsgType
from hogwild.store.exchange import Exchanger

pytestmark = pytest.mark.kernel_free

LONG_S = 30.0  # a request's timeout: far beyond any bound below, so only a cancel ends the wait
GEOMETRY = ModelGeometry(600, (FcLayer(0, 100, 10, 10),))


@pytest.fixture
def silent_server():
    """A ROUTER on loopback that receives every request and answers none."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield router, f"127.0.0.1:{port}"
    finally:
        router.close()
        context.term()


def _in_thread(call) -> tuple[threading.Thread, list]:
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_cancel_ends_the_wait_on_a_silent_server_and_every_later_one(silent_server):
    router, address = silent_server
    with Peers([address], sender=7, timeout_s=LONG_S, retries=3) as peers:
        thread, outcome = _in_thread(lambda: peers.request(0, Header(MsgType.PING, job=1)))
        assert router.poll(10_000), "the request never reached the server"
        router.recv_multipart()  # it is waiting for the reply now
        peers.cancel()
        thread.join(10.0)
        assert not thread.is_alive(), "the wait went on after the cancel"
        assert isinstance(outcome[0], Cancelled), outcome
        with pytest.raises(Cancelled, match="cancelled"):  # refused at once afterwards
            peers.request(0, Header(MsgType.PING, job=1))


def test_a_closing_exchanger_cancels_the_push_in_flight_to_a_server_that_stopped():
    with local_server(GEOMETRY, job="cancel") as server:
        client = PSClient([str(server.address)], "cancel", client_id=3, timeout_s=LONG_S)
    # The server is gone; the client's next push waits on it (30 s x 3 retries) until cancelled.
    copy = np.ones(GEOMETRY.n_params, np.float32)
    base = np.zeros(GEOMETRY.n_params, np.float32)
    exchanger = Exchanger(RemoteHome(client, GEOMETRY.n_params), copy, base, 1, 1, 1)
    exchanger.trained(1, None)  # a push and a pull are due: the thread sends them
    deadline = time.monotonic() + 10.0
    while exchanger.pushes == 0:  # the thread took them (a cancel before the send also ends it)
        assert time.monotonic() < deadline, "the exchange thread never took the push"
        time.sleep(0.01)
    closing, _ = _in_thread(exchanger.close)
    closing.join(10.0)
    assert not closing.is_alive(), "closing waited on the request's timeouts"
    with pytest.raises(Exception, match="cancelled"):
        exchanger.finish()  # the compute loop learns how its exchange ended


def test_a_closing_exchanger_ends_its_thread_when_an_exit_left_its_lock_held():
    """A worker's SIGTERM raises its exit wherever the compute loop is, even between taking the
    exchanger's lock and the ``with`` that would release it: close() (on that same thread, in
    the worker's cleanup) must still end the communication thread, which needs the lock."""
    with local_server(GEOMETRY, job="cancel") as server:
        client = PSClient([str(server.address)], "cancel", client_id=4, timeout_s=LONG_S)
    copy = np.ones(GEOMETRY.n_params, np.float32)
    base = np.zeros(GEOMETRY.n_params, np.float32)
    exchanger = Exchanger(RemoteHome(client, GEOMETRY.n_params), copy, base, 1, 1, 1)

    def interrupted_then_closed() -> None:
        exchanger.trained(1, None)  # a push and a pull are due: the thread waits on the server
        deadline = time.monotonic() + 10.0
        while exchanger.pushes == 0:
            assert time.monotonic() < deadline, "the exchange thread never took the push"
            time.sleep(0.01)
        exchanger._cond.acquire()  # the state the exit left: taken, its `with` never begun
        exchanger.close()

    closing, outcome = _in_thread(interrupted_then_closed)
    closing.join(10.0)
    assert not closing.is_alive(), "close waited for a lock its own thread held"
    assert outcome == [None], outcome
    assert not exchanger._thread.is_alive()
